"""The backward of KDA's short convolution with SiLU (conv.py) in one Triton kernel.

With ``z[t] = sum_j w[j] * padded[t + j]`` (per channel, K taps) and ``y = silu(z)``, given ``g = dL/dy``:

    gm[t]           = g[t] * silu'(z[t]),  silu'(z) = sigmoid(z) * (1 + z * (1 - sigmoid(z)))
    d_padded[s]     = sum_k w[k] * gm[s - k]          (terms with s - k outside [0, L) are zero)
    d_w[k]          = sum_t gm[t] * padded[t + k]     (over the batch and every t)

Why a kernel: compiled, the backward of ``KimiDeltaAttention.convolved_heads`` was four inductor kernels and four
reductions that wrote and read fp32 ``[B, L, C]`` intermediates (the recomputed ``z``, ``gm``, the fp32 sum behind
``d_padded``). In the H200 profile of a `base` step at 512k (benchmarks/results/indexer_scoring_2026-12-03/
call3_5233a82) they took about 0.62 s of 14.75 s; on one 32k chunk of `base` 3.3 ms, and 2.8 ms for the torch backward
compiled alone (benchmarks/results/kda_conv_2026-12-03/).

The kernel slides along time: each program takes ``block_channels`` channels of ``segments`` runs of
``segment_rows`` consecutive rows, side by side in a ``[segments, block_channels]`` tile, and steps down them one row
at a time. It keeps the last three padded rows and the last three ``gm`` rows in registers, so each step reads one
new row of ``padded`` and of ``g`` and writes one row of ``d_padded``: ``z`` and ``gm`` are computed once a row, and
only the three rows before a segment again (its start state). ``d_w``'s share of a program stays in registers as
four ``[segments, block_channels]`` sums; the per-program partials are summed afterwards in a fixed order
(deterministic, no atomics). A first form recomputed ``gm`` at all K shifts of a tile of rows, one tile-wide
reduction a tap: on the same chunk it took 1.7-3.7 ms depending on its tiles (the same folder).

Sums run in fp32 in the order of conv.py's torch backward (``z`` over ascending taps, ``d_padded`` over ascending k),
so the two differ by rounding only (a fused multiply-add here and there). Runs on CUDA, or on CPU tensors under
``TRITON_INTERPRET=1`` (tests/gpu/triton_interpreter_check.py). Imports Triton at call time only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


MAX_TAPS = 4


@dataclass(frozen=True)
class ConvBackwardConfig:
    """Tiles of the backward kernel: each program walks ``segments`` runs of ``segment_rows`` rows side by side, over
    ``block_channels`` channels; ``benchmarks/bench_kda_conv.py`` times candidates on the H200."""

    segment_rows: int = 64
    segments: int = 8
    block_channels: int = 64
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("segments", "block_channels"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.segment_rows < 4 or self.segment_rows % 4:
            raise ValueError(f"segment_rows must be a positive multiple of 4 (the kernel's rows a pass), got "
                             f"{self.segment_rows}")


DEFAULT_BACKWARD_CONFIG = ConvBackwardConfig()


@functools.cache
def _backward_kernel():
    from genolc.model.ops.kda import conv_kernels

    return conv_kernels.conv_silu_backward_kernel


def unsupported_reason(grad_out: torch.Tensor, padded: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why the kernel cannot take these (a dtype outside ``KERNEL_DTYPES``, more than ``MAX_TAPS`` taps), or None.
    Pure torch."""
    for name, tensor in (("grad_out", grad_out), ("padded", padded), ("weight", weight)):
        if tensor.dtype not in KERNEL_DTYPES:
            return f"{name} is {tensor.dtype}, not one of {KERNEL_DTYPES}"
    if weight.dim() != 2 or not 1 <= weight.shape[1] <= MAX_TAPS:
        return f"weight must be [C, K] with 1 <= K <= {MAX_TAPS}, got {tuple(weight.shape)}"
    return None


def conv_silu_backward(grad_out: torch.Tensor, padded: torch.Tensor, weight: torch.Tensor,
                       config: ConvBackwardConfig = DEFAULT_BACKWARD_CONFIG) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d_padded [B, L + K - 1, C] in padded's dtype, d_weight [C, K] in weight's dtype)`` for ``grad_out [B, L,
    C]``, ``padded [B, L + K - 1, C]`` and ``weight [C, K]`` (conv.py's shapes; the formulas in the module notes)."""
    import triton

    reason = unsupported_reason(grad_out, padded, weight)
    if reason is not None:
        raise ValueError(f"KDA convolution backward kernel: {reason}; use conv.py's torch backward")
    batch, padded_length, channels = padded.shape
    taps = weight.shape[1]
    length = padded_length - taps + 1
    if grad_out.shape != (batch, length, channels) or weight.shape[0] != channels:
        raise ValueError(f"KDA convolution backward kernel: grad_out must be [B, L, C] = {(batch, length, channels)} "
                         f"and weight [C, K] with C = {channels}; got {tuple(grad_out.shape)} and "
                         f"{tuple(weight.shape)}")
    grad_out, padded, weight = grad_out.contiguous(), padded.contiguous(), weight.contiguous()
    d_padded = torch.empty_like(padded)
    segments = triton.cdiv(padded_length, config.segment_rows)
    groups = triton.cdiv(segments, config.segments)
    if batch == 0 or padded_length == 0 or channels == 0:
        d_padded.zero_()
        return d_padded, torch.zeros_like(weight)
    partial = torch.empty((batch * groups, channels, taps), dtype=torch.float32, device=padded.device)
    grid = (groups, triton.cdiv(channels, config.block_channels), batch)
    _backward_kernel()[grid](grad_out, padded, weight, d_padded, partial, length, padded_length, channels,
                             grad_out.stride(0), grad_out.stride(1), padded.stride(0), padded.stride(1),
                             d_padded.stride(0), d_padded.stride(1), TAPS=taps,
                             SEGMENT_ROWS=config.segment_rows, SEGMENTS=config.segments,
                             BLOCK_C=config.block_channels, num_warps=config.num_warps)
    return d_padded, partial.sum(0).to(weight.dtype)
