"""KDA's forget gate: the per-channel log decay formed from the gate projection (fla's in-kernel gate, in torch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genolc.model.ops.precision import autocast_off


@autocast_off
def kda_gate(raw: torch.Tensor, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
             lower_bound: float | None) -> torch.Tensor:
    """The log decay ``g [B, T, H, Dk]`` (fp32, <= 0) from the raw gate pre-activation ``raw [B, T, H, Dk]``.

    fla's ``use_gate_in_kernel`` gate: with ``x = raw + dt_bias`` (``dt_bias [H * Dk]``, optional) and
    ``a = exp(A_log)`` (``A_log [H]``), ``g = lower_bound * sigmoid(a * x)`` when a lower bound is set (each step then
    decays by at most ``exp(lower_bound)``; without ``A_log``, ``a = 1``), else ``g = -a * softplus(x)``.
    """
    heads, key_dim = raw.shape[-2:]
    x = raw.float()
    if dt_bias is not None:
        x = x + dt_bias.float().view(heads, key_dim)
    rate = None if A_log is None else A_log.float().exp().view(heads, 1)
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(x if rate is None else rate * x)
    if rate is None:
        raise ValueError("the softplus gate (no lower_bound) needs A_log")
    return -rate * F.softplus(x)
