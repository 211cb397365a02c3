"""DSA k-pool indexer: ``reference.py`` (pure-torch scores and top-k), ``triton.py`` (Triton-scored top-k),
``pooling.py`` (pool keys), ``layout.py`` (index rows)."""
