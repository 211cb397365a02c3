"""Genome input, prepared datasets and samplers."""
