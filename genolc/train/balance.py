"""Auxiliary-loss-free MoE load balancing: the trainer's update of each router's ``e_score_correction_bias``.

The router (genolc/model/layers/moe.py) picks a token's top-k experts by ``sigmoid score + bias``, while the combine
weights use the uncorrected scores. The bias therefore only steers *which* experts get tokens, never how much an
expert's output counts, and it carries no gradient: the trainer moves it from outside the model after every
optimizer step, from the load that step actually produced:

    load_e   = token slots routed to expert e in this layer over the whole step (all micro-batches summed)
    mean     = sum_e load_e / E
    bias_e  += rate * sign(mean - load_e)         overloaded experts lose ``rate``, underloaded ones gain it

This is DeepSeek-V3's auxiliary-loss-free balancing (DeepSeek-V3 technical report, arXiv:2412.19437, section 2.1.2:
"at the end of each step, we will decrease the bias term by gamma if its corresponding expert is overloaded and
increase it by gamma if its corresponding expert is underloaded"; gamma = 0.001 for most of their pre-training).
Unlike an auxiliary balance loss it puts no gradient against the language-model loss; genolc keeps the optional
``moe_balance`` loss beside it (DeepSeek-V3 also keeps a tiny sequence-wise one).

Summing the counts over micro-batches before the update makes a step with gradient accumulation move the bias
exactly as one large batch would. The bias is a persistent buffer, so checkpoints carry it with the weights and a
resumed run continues from the same routing.
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

# The bias's state-dict name (the transformers-compatible checkpoint layout, so it is stable); the trainer reaches
# the model only through such names and genolc.model's exports.
_BIAS_NAME = re.compile(r"^layers\.(\d+)\.mlp\.gate\.e_score_correction_bias$")


def router_biases(model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Layer index -> that layer's router correction bias ``[E]`` (the live buffer; empty without MoE layers)."""
    found: dict[int, torch.Tensor] = {}
    for name, buffer in model.named_buffers():
        match = _BIAS_NAME.match(name)
        if match:
            found[int(match.group(1))] = buffer
    return found


def add_expert_counts(total: dict[int, torch.Tensor], counts: Mapping[int, torch.Tensor]) -> None:
    """Add one micro-batch's ``layer -> tokens_per_expert [E]`` into the step's running ``total`` (in place)."""
    for layer, tokens in counts.items():
        tokens = tokens.detach().to(torch.int64)
        total[layer] = total[layer] + tokens if layer in total else tokens.clone()


@torch.no_grad()
def update_router_bias(model: torch.nn.Module, tokens_per_expert: Mapping[int, torch.Tensor], rate: float) -> None:
    """Move each MoE router's correction bias towards balanced load (see the module docstring for the formula).

    Args:
        model: a GenomeLM (any module with buffers named ``layers.<i>.mlp.gate.e_score_correction_bias``).
        tokens_per_expert: layer index -> ``[E]`` token slots routed to each expert over the whole optimizer step.
        rate: the step size (DeepSeek-V3's gamma); 0 leaves every bias unchanged.
    """
    if rate < 0:
        raise ValueError(f"the router bias rate must be zero or positive, got {rate}")
    biases = router_biases(model)
    unknown = sorted(set(tokens_per_expert) - set(biases))
    if unknown:
        raise ValueError(f"tokens_per_expert names layers {unknown} that have no MoE router; MoE layers are "
                         f"{sorted(biases)}")
    if rate == 0:
        return
    for layer, tokens in tokens_per_expert.items():
        bias = biases[layer]
        if tokens.shape != bias.shape:
            raise ValueError(f"layer {layer}: tokens_per_expert must be [E={bias.numel()}], got {tuple(tokens.shape)}")
        load = tokens.to(device=bias.device, dtype=torch.float64)
        # Compared in float64 so counts far beyond 2^24 (long runs, large batches) stay exact.
        direction = torch.sign(load.mean() - load).to(bias.dtype)
        bias.add_(direction, alpha=rate)


def load_balance_metrics(tokens_per_expert: Mapping[int, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Per MoE layer, how unevenly one step's tokens were routed (for metrics.jsonl).

    ``moe_load_max_over_mean``: the busiest expert's load over the mean load (1.0 = balanced; E / top_k at worst);
    ``moe_load_min_over_mean``: the idlest expert's (1.0 = balanced; 0.0 = an expert got no token). Their ratio is
    the max/min load ratio; they are logged separately because it is infinite whenever an expert is idle.
    Keys of the inner dicts are layer indices as strings (JSON object keys).
    """
    high: dict[str, float] = {}
    low: dict[str, float] = {}
    for layer, tokens in sorted(tokens_per_expert.items()):
        load = tokens.detach().to("cpu", torch.float64)
        mean = float(load.mean())
        if mean > 0:
            high[str(layer)] = float(load.max()) / mean
            low[str(layer)] = float(load.min()) / mean
    return {"moe_load_max_over_mean": high, "moe_load_min_over_mean": low}
