"""MoE under context parallelism: experts are per token; only the balance loss needs the whole window.

The balance loss weighs each expert's mean routing probability by its fraction ``f`` of the window's token slots.
Each rank counts its own tokens' choices (the router run once more without grad, the same choice the layer then
makes), the group all-reduces the counts, and the layer runs as a chunk of the window (genolc/model/cache.py) with
that ``f``: its balance loss is this rank's share, and the shares add up to the window's. Under the chunk-recurrent
step the cache already holds the window's ``f`` (its first pass sums the ranks' counts). The layer still returns
this rank's own tokens per expert; the trainer sums those over the mesh before the router-bias update.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from genolc.model.cache import LayerCache
from genolc.model.ops.moe.counts import count_per_expert
from genolc.parallel.context import ContextParallel


def moe_forward(layer, context: ContextParallel, x: torch.Tensor, cache=None):
    """``MoE.forward`` for this rank's concatenated pieces ``x [B, T_local, D]``."""
    from genolc.model.layers.moe import MoE

    if cache is not None:
        # The chunk-recurrent step counted the window's load in its first pass (summed over the ranks).
        return MoE.forward(layer, x, cache=cache)
    with torch.no_grad():
        chosen = layer.gate(x.reshape(-1, x.shape[-1])).expert_ids
        counts = count_per_expert(chosen.reshape(-1), layer.num_experts).to(torch.float64)
        dist.all_reduce(counts, group=context.group)
        fraction = (counts / counts.sum().clamp_min(1)).float()
    window = LayerCache(start=0, window_len=context.window_len, expert_fraction=fraction, aux=True)
    return MoE.forward(layer, x, cache=window)
