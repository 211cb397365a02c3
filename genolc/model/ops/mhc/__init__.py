"""mHC's mixing logits (the RMS-normed streams projected onto the ``(2 + N) * N`` pre/post/comb logits):
``reference.py`` (pure torch), ``op.py`` (the forward and backward custom ops, ``genolc::mhc_mixing_logits`` and
``genolc::mhc_mixing_logits_backward``), ``triton.py`` (the fused kernels those ops run on CUDA)."""
