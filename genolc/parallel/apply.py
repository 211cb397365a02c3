"""``apply_context_parallel(model, group, layout)``: patch a plain model to run one rank's share of each window.

The token mixers' and MoE layers' ``forward`` of each instance are replaced (as genolc/train/apply.py does for
recompute) by the versions in kda_cp.py (or kda_heads.py with ``kda="heads"``), dsa_cp.py and moe_cp.py;
genolc/parallel/context.py says what they exchange.
"""

from __future__ import annotations

import functools

from torch import nn

from genolc.model.layers.dsa import DSAAttention
from genolc.model.layers.kda import KimiDeltaAttention
from genolc.model.layers.moe import MoE
from genolc.parallel.context import CONTEXT_ATTRIBUTE, ContextParallel
from genolc.parallel.dsa_cp import dsa_forward
from genolc.parallel.kda_cp import kda_forward
from genolc.parallel.kda_heads import check_heads, kda_forward_heads
from genolc.parallel.moe_cp import moe_forward

# How KDA runs over the ranks (--cp-kda): by boundary-state passing (kda_cp.py) or by heads (kda_heads.py).
KDA_FORWARDS = {"state": kda_forward, "heads": kda_forward_heads}


def apply_context_parallel(model: nn.Module, group, layout: str = "zigzag", kda: str = "state") -> ContextParallel:
    """Patch ``model`` (a GenomeLM) so its forward runs this rank's pieces of each window, KDA by ``kda``
    (:data:`KDA_FORWARDS`); returns the context whose ``set_window`` must name each window's length before it runs.
    Applying twice raises; so does ``kda="heads"`` with KDA heads that the group's size does not divide (before
    any layer is patched)."""
    if getattr(model, CONTEXT_ATTRIBUTE, None) is not None:
        raise ValueError("context parallelism is already applied to this model")
    if kda not in KDA_FORWARDS:
        raise ValueError(f"unknown KDA context-parallel mode {kda!r}; choose one of {', '.join(KDA_FORWARDS)}")
    context = ContextParallel(group, layout)
    if kda == "heads":
        for module in model.modules():
            if isinstance(module, KimiDeltaAttention):
                check_heads(module.num_heads, context.size)
    for module in model.modules():
        if isinstance(module, KimiDeltaAttention):
            replacement = KDA_FORWARDS[kda]
        elif isinstance(module, DSAAttention):
            replacement = dsa_forward
        elif isinstance(module, MoE):
            replacement = moe_forward
        else:
            continue
        module.forward = functools.partial(replacement, module, context)
    setattr(model, CONTEXT_ATTRIBUTE, context)
    return context
