"""mHC's ops: the mixing logits (the RMS-normed streams projected onto the ``(2 + N) * N`` pre/post/comb logits) and
the block's input they weight, the mixing matrix (softmax and Sinkhorn) and the merge. ``reference.py`` (pure torch),
``op.py`` (the forward and backward custom ops), ``triton.py`` (the mixing logits' and block input's kernels),
``comb_triton.py`` and ``merge_triton.py`` (the other kernels those ops run on CUDA)."""
