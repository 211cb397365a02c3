"""DSA k-pool indexer: ``reference.py`` (pure torch); a fast GPU kernel goes beside it."""
