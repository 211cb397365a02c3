"""Kimi Delta Attention ops: ``reference.chunk_kda`` (pure torch); a fused kernel may live beside it in fast.py."""
