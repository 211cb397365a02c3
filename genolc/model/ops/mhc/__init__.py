"""mHC's mixing logits (the RMS-normed streams projected onto the ``(2 + N) * N`` pre/post/comb logits):
``reference.py`` (pure torch), ``op.py`` (the ``genolc::mhc_mixing_logits`` custom op with its backward formula),
``triton.py`` (the fused forward kernel the op runs on CUDA)."""
