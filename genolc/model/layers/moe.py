"""Feed-forward blocks: the SwiGLU MLP (dense layers, shared expert) and the dropless mixture of experts.

Routing (DeepSeek-V3 / GLM style): sigmoid scores per expert; the choice adds a correction bias (a buffer the
trainer adjusts for auxiliary-loss-free balancing) and may be limited to the best ``topk_group`` of ``n_group``
expert groups; the weights are the *uncorrected* scores of the chosen experts, optionally normalised to sum to 1,
times ``routed_scaling_factor``. Every token reaches its top-k experts (dropless); the reference path groups token
slots by expert (ops/moe: a per-expert loop on CPU, grouped GEMMs on CUDA). A shared expert sees every token.

Parameter names match transformers' ``Glm5NextTextMoE`` (``gate.weight``, ``gate.e_score_correction_bias``,
``experts.gate_up_proj [E, 2I, D]``, ``experts.down_proj [E, D, I]``, ``shared_experts.*``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from genolc.model.cache import LayerCache
from genolc.model.config import ModelConfig
from genolc.model.ops.dispatch import routed_experts
from genolc.model.ops.moe.counts import count_per_expert
from genolc.model.ops.moe.swiglu import clamped_swiglu


class SwiGLUMLP(nn.Module):
    """``[..., D] -> [..., D]`` SwiGLU MLP (dense layers and the shared expert)."""

    def __init__(self, hidden_size: int, intermediate_size: int, swiglu_limit: float) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.swiglu_limit = swiglu_limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate and up in one product: x's gradient is one GEMM instead of two and an addition.
        gate, up = F.linear(x, torch.cat([self.gate_proj.weight, self.up_proj.weight])).chunk(2, dim=-1)
        return self.down_proj(clamped_swiglu(gate, up, self.swiglu_limit))


def _autocast_on(x: torch.Tensor) -> bool:
    device = x.device.type
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


@dataclass
class Routing:
    """One MoE layer's routing of N tokens."""

    expert_ids: torch.Tensor       # [N, K] long: chosen experts per token
    weights: torch.Tensor          # [N, K]: their combine weights (already scaled), in the scores' dtype
    scores: torch.Tensor           # [N, E]: sigmoid scores (for the balance loss); fp32, or autocast's dtype under it


class TopKRouter(nn.Module):
    """Sigmoid router with correction bias and group-limited top-k."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_experts = config.n_routed_experts
        self.top_k = config.num_experts_per_tok
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.routed_scaling_factor = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(self.num_experts, config.hidden_size, dtype=torch.float32))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.num_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> Routing:
        """``x [N, D]`` -> :class:`Routing`. Without autocast the product and its sigmoid run in fp32; under it in
        autocast's dtype, as before (the expert choice adds the fp32 correction bias either way)."""
        # Under autocast the product runs in the autocast dtype whatever it is handed, so x goes in as it is: an fp32
        # copy of a bf16 x would be cast straight back, bit for bit (the H200 profile of issue 14: about 0.3 ms per
        # MoE layer and 32k chunk of `base`, with the cast in its backward).
        inputs = x if _autocast_on(x) else x.float()
        scores = F.linear(inputs, self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        if self.n_group > 1:
            # Rank groups by the sum of their two best corrected scores; experts outside the kept groups drop out.
            grouped = choice.view(-1, self.n_group, self.num_experts // self.n_group)
            group_rank = grouped.topk(2, dim=-1).values.sum(-1)
            kept_groups = group_rank.topk(self.topk_group, dim=-1).indices
            keep = torch.zeros_like(group_rank, dtype=torch.bool).scatter_(1, kept_groups, True)
            choice = choice.masked_fill(~keep.repeat_interleave(self.num_experts // self.n_group, dim=1),
                                        float("-inf"))
        expert_ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, expert_ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return Routing(expert_ids=expert_ids, weights=weights * self.routed_scaling_factor, scores=scores)


class Experts(nn.Module):
    """E routed SwiGLU experts stored as stacked weights; dropless, grouped by expert."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_experts = config.n_routed_experts
        hidden, inter = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, inter))
        self.swiglu_limit = config.swiglu_limit
        nn.init.normal_(self.gate_up_proj, std=config.initializer_range)
        nn.init.normal_(self.down_proj, std=config.initializer_range)

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [N, D]``, ``expert_ids``/``weights [N, K]`` -> (``out [N, D]``, ``tokens_per_expert [E]`` long)."""
        return routed_experts(x, expert_ids, weights, self.gate_up_proj, self.down_proj, self.swiglu_limit)


def balance_loss(routing: Routing, num_experts: int, *, fraction: torch.Tensor | None = None,
                 total_tokens: int | None = None) -> torch.Tensor:
    """Load-balance loss over the batch: ``E * sum_i f_i * P_i`` (1.0 when perfectly balanced).

    ``f_i``: fraction of token slots sent to expert i (no gradient); ``P_i``: mean over tokens of expert i's
    sigmoid score normalised over experts (DeepSeek-V3's complementary balance loss, computed over all tokens).
    For one chunk of a window, ``fraction`` is the whole window's ``f`` and ``total_tokens`` its token count: the
    result is then this chunk's share, and the chunks' shares add up to the window's loss.
    """
    if fraction is None:
        counts = count_per_expert(routing.expert_ids.reshape(-1), num_experts).float()
        fraction = counts / counts.sum()
    probs = routing.scores / (routing.scores.sum(-1, keepdim=True) + 1e-20)
    mean_probs = probs.mean(0) if total_tokens is None else probs.sum(0) / total_tokens
    return num_experts * (fraction.to(mean_probs.dtype) * mean_probs).sum()


def window_fraction(counts: torch.Tensor) -> torch.Tensor:
    """``[E]`` token slots per expert over a window -> each expert's share of them (fp32; zeros for no slots)."""
    return (counts.double() / counts.sum().clamp_min(1)).float()


@dataclass
class MoEOutput:
    hidden: torch.Tensor | None        # [B, T, D]; None from MoE.routing_counts
    tokens_per_expert: torch.Tensor    # [E] long
    balance_loss: torch.Tensor | None  # scalar; None for a chunk that skips the auxiliary losses


class MoE(nn.Module):
    """Routed experts + shared expert: ``forward(x [B, T, D]) -> MoEOutput``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_experts = config.n_routed_experts
        self.gate = TopKRouter(config)
        self.experts = Experts(config)
        self.shared_experts = (
            SwiGLUMLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts, config.swiglu_limit)
            if config.n_shared_experts > 0 else None)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> MoEOutput:
        """``x [B, T, D]``; with ``cache`` x is one chunk of a window and ``balance_loss`` this chunk's share of the
        window's (None when ``cache.aux`` is off)."""
        if x.dim() != 3:
            raise ValueError(f"MoE input must be [B, T, D]; got {tuple(x.shape)}")
        flat = x.reshape(-1, x.shape[-1])
        routing = self.gate(flat)
        routed, tokens_per_expert = self.experts(flat, routing.expert_ids, routing.weights)
        out = routed.view_as(x)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        if cache is None:
            balance = balance_loss(routing, self.num_experts)
        elif not cache.aux:
            balance = None
        else:
            fraction = cache.expert_fraction
            if fraction is None and cache.expert_counts_elsewhere is not None:
                fraction = window_fraction(cache.expert_counts_elsewhere + tokens_per_expert.to(torch.int64))
            if fraction is None:
                raise ValueError("a chunk's MoE balance loss needs the window's expert_fraction in its cache "
                                 "(a first pass over the window counts it), or the other chunks' "
                                 "expert_counts_elsewhere, or aux=False")
            balance = balance_loss(routing, self.num_experts, fraction=fraction,
                                   total_tokens=x.shape[0] * cache.window_len)
        return MoEOutput(hidden=out, tokens_per_expert=tokens_per_expert, balance_loss=balance)

    def routing_counts(self, x: torch.Tensor) -> MoEOutput:
        """Only what a pass that discards the layer's output needs of it: its token slots per expert (``hidden`` is
        None). Run by the last layer of a chunked step's fill pass (``GenomeLM.forward(..., logits=False)``)."""
        routing = self.gate(x.reshape(-1, x.shape[-1]))
        counts = count_per_expert(routing.expert_ids.reshape(-1), self.num_experts)
        return MoEOutput(hidden=None, tokens_per_expert=counts, balance_loss=None)
