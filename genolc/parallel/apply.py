"""``apply_context_parallel(model, group, layout)``: patch a plain model to run one rank's share of each window.

The token mixers' and MoE layers' ``forward`` of each instance are replaced (as genolc/train/apply.py does for
recompute) by the versions in kda_cp.py, dsa_cp.py and moe_cp.py; genolc/parallel/context.py says what they
exchange.
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
from genolc.parallel.moe_cp import moe_forward


def apply_context_parallel(model: nn.Module, group, layout: str = "zigzag") -> ContextParallel:
    """Patch ``model`` (a GenomeLM) so its forward runs this rank's pieces of each window; returns the context whose
    ``set_window`` must name each window's length before it runs. Applying twice raises."""
    if getattr(model, CONTEXT_ATTRIBUTE, None) is not None:
        raise ValueError("context parallelism is already applied to this model")
    context = ContextParallel(group, layout)
    for module in model.modules():
        if isinstance(module, KimiDeltaAttention):
            replacement = kda_forward
        elif isinstance(module, DSAAttention):
            replacement = dsa_forward
        elif isinstance(module, MoE):
            replacement = moe_forward
        else:
            continue
        module.forward = functools.partial(replacement, module, context)
    setattr(model, CONTEXT_ATTRIBUTE, context)
    return context
