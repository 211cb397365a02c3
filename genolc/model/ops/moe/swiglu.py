"""GLM's bounded SwiGLU, the expert activation of every MoE path (reference, grouped GEMM) and of the layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """SwiGLU with GLM's clamp: gate clamped above at ``limit``, up to ``[-limit, limit]``."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
