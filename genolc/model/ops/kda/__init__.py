"""Kimi Delta Attention ops: ``reference.chunk_kda`` (pure torch), ``fla.chunk_kda`` (fla's kernels, segment-wise),
``gate.kda_gate`` (the forget gate the layer forms)."""
