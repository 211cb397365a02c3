"""Sparse attention over indexer-selected keys: ``reference.py`` (pure torch); a fast GPU kernel goes beside it."""
