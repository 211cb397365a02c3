"""Sparse attention over indexer-selected keys (DSA): ``reference.py`` (pure torch), ``triton.py`` (fused Triton
forward and backward), ``tilelang/`` (the TileLang pair), ``dense.py`` (causal SDPA when every key is selected)."""
