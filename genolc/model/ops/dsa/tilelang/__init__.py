"""The DSA sparse latent attention in TileLang: ``forward.py`` (forward kernel), ``backward.py`` (backward kernel and
the autograd op, ``backward.sparse_latent_attention``). TileLang itself is imported only when a kernel is built."""
