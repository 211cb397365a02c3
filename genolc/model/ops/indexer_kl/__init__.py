"""The indexer KL loss's per-row op over selected pools: ``reference.py`` (pure torch), ``triton.py`` (fused)."""
