"""mHC mixing logits in pure torch, as transformers' ``glm5_next`` computes them: the unweighted RMS norm of the
streams in fp32, then a Linear onto the logits (under autocast the product runs in the autocast dtype, as a
Linear's does)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mixing_logits(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [M, K]`` (each token's N streams side by side), ``weight [W, K]`` -> ``[M, W]`` logits."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    return F.linear(normed, weight.float())
