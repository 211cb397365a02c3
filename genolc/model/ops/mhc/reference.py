"""mHC mixing logits in pure torch, as transformers' ``glm5_next`` computes them: the unweighted RMS norm of the
streams in fp32, then a Linear onto the logits (under autocast the product runs in the autocast dtype, as a
Linear's does)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mixing_logits_and_rstd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (each token's N streams side by side), ``weight [W, K]`` -> (``[M, W]`` logits, ``[M]`` fp32
    ``rsqrt(mean(x^2) + eps)``, which the custom op's backward reuses)."""
    x32 = x.float()
    rstd = torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    return F.linear(x32 * rstd, weight.float()), rstd.squeeze(-1)


def mixing_logits(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [M, K]``, ``weight [W, K]`` -> ``[M, W]`` logits."""
    return mixing_logits_and_rstd(x, weight, eps)[0]
