"""Token slots per expert, counted on the device without a host sync."""

from __future__ import annotations

import torch


def count_per_expert(flat_experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Token slots per expert ``[E]`` (long) of the expert ids ``flat_experts [S]``, without a host sync: CUDA's
    ``bincount`` reads the ids' min and max back to the host to size its output, two syncs a call, and each one
    drains the launch queue (benchmarks/host_syncs.py). Ids outside ``[0, E)`` fail the scatter's device-side
    bounds check instead."""
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat_experts.device)
    return counts.scatter_add_(0, flat_experts, torch.ones_like(flat_experts, dtype=torch.int64))
