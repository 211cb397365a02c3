"""Parallel training over torch.distributed: the data-parallel x context-parallel mesh and context parallelism.

    launch.py       which rank writes outputs and prints (rank 0), from torchrun's environment alone
    mesh.py         the process mesh from torchrun's environment (gloo on CPU, NCCL on CUDA)
    collectives.py  autograd-exact collectives: all-gather (backward: reduce-scatter), all-to-all, a gradient anchor
    layout.py       which positions of a window each context-parallel rank holds (contiguous or zigzag)
    kda_cp.py       KDA across ranks by boundary-state passing (--cp-kda state)
    kda_heads.py    KDA across ranks by heads: all-to-all to the whole span for H / cp heads and back (--cp-kda heads)
    dsa_cp.py       DSA across ranks: the latent rows and pooled indexer keys of earlier positions by all-gather
    moe_cp.py       MoE balance loss over the window's expert load
    apply.py        apply_context_parallel: patch a model's mixers and MoE layers for one rank's share of a window
    context.py      ContextParallel: the rank's pieces of the window and what the patched layers exchange
    step.py         a micro-batch's forward and backward on one rank, and the mesh-wide gradient reduction
"""
