"""RMS norms: the plain weighted one and the sigmoid-gated one KDA ends with (mHC's unweighted one is part of its
mixing-logits op, genolc/model/ops/mhc).

All compute in fp32; the weighted norm casts back before the weight (as transformers does), the gated norm keeps
the weight in fp32 and casts back last.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm over the last dim of ``[..., D]`` with a learned per-channel weight."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GatedRMSNorm(nn.Module):
    """``RMSNorm(x) * sigmoid(gate)`` over the last dim; ``x`` and ``gate`` are ``[..., D]``."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if gate.shape != x.shape:
            raise ValueError(f"gate must have x's shape {tuple(x.shape)}; got {tuple(gate.shape)}")
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * normed * torch.sigmoid(gate.float())).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
