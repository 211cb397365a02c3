"""Routed experts, pure-torch reference: token slots grouped by expert, one SwiGLU matmul pair per expert.

Shapes: ``x [N, D]``; ``expert_ids``, ``weights [N, K]`` (each token's K experts and their routing weights);
``gate_up_proj [E, 2I, D]``; ``down_proj [E, D, I]``. Returns ``out [N, D]`` and ``tokens_per_expert [E]`` (long).
Dropless: every token reaches all of its K experts. The grouped-GEMM version is ``grouped_mm.py`` beside this file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genolc.model.ops.moe.counts import count_per_expert
from genolc.model.ops.moe.swiglu import clamped_swiglu


def check_expert_shapes(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
                        gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> None:
    if x.dim() != 2 or expert_ids.dim() != 2 or expert_ids.shape[0] != x.shape[0] or weights.shape != expert_ids.shape:
        raise ValueError(f"x must be [N, D] and expert_ids, weights [N, K]; got {tuple(x.shape)}, "
                         f"{tuple(expert_ids.shape)}, {tuple(weights.shape)}")
    num_experts, double_inter, hidden = gate_up_proj.shape
    if hidden != x.shape[1] or down_proj.shape != (num_experts, hidden, double_inter // 2):
        raise ValueError(f"gate_up_proj [E, 2I, D] and down_proj [E, D, I] disagree with x [N, D={x.shape[1]}]: "
                         f"{tuple(gate_up_proj.shape)}, {tuple(down_proj.shape)}")


def routed_experts(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, gate_up_proj: torch.Tensor,
                   down_proj: torch.Tensor, swiglu_limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [N, D]`` -> (``out [N, D]``, ``tokens_per_expert [E]``); see the module docstring for shapes."""
    check_expert_shapes(x, expert_ids, weights, gate_up_proj, down_proj)
    num_experts, top_k = gate_up_proj.shape[0], expert_ids.shape[1]
    flat_experts = expert_ids.reshape(-1)
    order = flat_experts.argsort(stable=True)
    tokens_per_expert = count_per_expert(flat_experts, num_experts)
    slot_token = order // top_k
    grouped_in = x[slot_token]
    out = torch.zeros_like(x)
    pieces = []
    # One host sync sizes the groups; the grouped GEMM in grouped_mm.py avoids the per-expert loop.
    for expert, rows in enumerate(grouped_in.split(tokens_per_expert.tolist())):
        if rows.shape[0]:
            gate, up = F.linear(rows, gate_up_proj[expert]).chunk(2, dim=-1)
            pieces.append(F.linear(clamped_swiglu(gate, up, swiglu_limit), down_proj[expert]))
    if pieces:
        grouped_out = torch.cat(pieces) * weights.reshape(-1)[order].unsqueeze(-1)
        out = out.index_add_(0, slot_token, grouped_out.to(x.dtype))
    return out, tokens_per_expert
