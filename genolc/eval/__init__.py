"""Evaluation: loss by context position with controls (context truncation, baseline, RC), needle test."""
