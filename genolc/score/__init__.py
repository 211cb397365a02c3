"""Variant scoring and region embeddings with a trained model: ``genolc score``, ``genolc embed`` and a Python API
(:mod:`genolc.score.api`)."""
