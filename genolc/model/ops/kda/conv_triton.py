"""KDA's short convolution with SiLU (conv.py) in two Triton kernels, forward and backward.

With ``z[t] = sum_j w[j] * padded[t + j]`` (per channel, K taps), ``y = silu(z)`` and, given ``g = dL/dy``:

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

The forward slides the same way (one new padded row a step, ``y`` stored) and writes its output split into ``parts``
tensors of ``C / parts`` channels each, contiguous: the layer's q, k and v, which fla takes as they are. Compiled,
the torch forward wrote an fp32 ``z`` and three more kernels cast and split it. The backward reads the gradients of
those parts where they are (no concatenation). A channel block must then lie in one part: ``C / parts`` a multiple
of ``block_channels`` (:func:`unsupported_reason`; the presets' 1,024 and 1,536 are).

Sums run in fp32 in the order of conv.py's torch code (``z`` over ascending taps, ``d_padded`` over ascending k), so
the two differ by rounding only (a fused multiply-add here and there; ``silu`` as ``z * sigmoid(z)``). Measured on the
H200 (the same folder): the layer's convolution, forward and backward, 3.99 -> 1.65 ms on a 32k chunk of `base` and
5.26 -> 1.53 ms on a 64k chunk of `small`. Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``
(tests/gpu/triton_interpreter_check.py). Imports Triton at call time only.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_TAPS = 4
MAX_PARTS = 3


@dataclass(frozen=True)
class ConvKernelConfig:
    """Tiles of both kernels: each program walks ``segments`` runs of ``segment_rows`` rows side by side, over
    ``block_channels`` channels. Of eight backward tiles timed on the H200 the default was the fastest for a chunk of
    `small` and 10 % behind the fastest for `base` (0.455 against 0.412 ms; that tile took 9 % longer for `small`);
    in a second run of seven, no tile was more than 5 % faster at either, forward or backward
    (benchmarks/results/kda_conv_2026-12-03/, ``benchmarks/bench_kda_conv.py``)."""

    segment_rows: int = 128
    segments: int = 8
    block_channels: int = 64
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("segments", "block_channels"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.segment_rows < 4 or self.segment_rows % 4:
            raise ValueError(f"segment_rows must be a positive multiple of 4 (the kernels' rows a pass), got "
                             f"{self.segment_rows}")


DEFAULT_CONFIG = ConvKernelConfig()


@functools.cache
def _kernels():
    from genolc.model.ops.kda import conv_kernels

    return conv_kernels.conv_silu_forward_kernel, conv_kernels.conv_silu_backward_kernel


def unsupported_reason(padded: torch.Tensor, weight: torch.Tensor, parts: int,
                       config: ConvKernelConfig = DEFAULT_CONFIG, grads: Sequence[torch.Tensor] = ()) -> str | None:
    """Why the kernels cannot take these (a dtype outside ``KERNEL_DTYPES``, more than ``MAX_TAPS`` taps, parts
    that are not whole channel blocks), or None; ``grads``: the backward's. conv.py's ops then run its torch code.
    Pure torch."""
    for name, tensor in (("padded", padded), ("weight", weight), *(("a gradient", g) for g in grads)):
        if tensor.dtype not in KERNEL_DTYPES:
            return f"{name} is {tensor.dtype}, not one of {KERNEL_DTYPES}"
    if weight.dim() != 2 or not 1 <= weight.shape[1] <= MAX_TAPS:
        return f"weight must be [C, K] with 1 <= K <= {MAX_TAPS}, got {tuple(weight.shape)}"
    channels = padded.shape[-1]
    if not 1 <= parts <= MAX_PARTS or channels % parts:
        return f"{channels} channels do not split into {parts} parts (1 to {MAX_PARTS})"
    if parts > 1 and (channels // parts) % config.block_channels:
        return f"parts of {channels // parts} channels are not whole blocks of {config.block_channels}"
    return None


def _check(padded: torch.Tensor, weight: torch.Tensor, parts: int, config: ConvKernelConfig,
           grads: Sequence[torch.Tensor] = ()) -> None:
    """ValueError unless the kernels take these: conv.py's shapes (its ops check them before they get here) and
    :func:`unsupported_reason`."""
    if padded.dim() != 3 or weight.dim() != 2 or weight.shape[0] != padded.shape[2] \
            or padded.shape[1] < weight.shape[1] - 1:
        raise ValueError(f"KDA convolution kernel: padded must be [B, L + K - 1, C] and weight [C, K] with L >= 0; got "
                         f"{tuple(padded.shape)} and {tuple(weight.shape)}")
    reason = unsupported_reason(padded, weight, parts, config, grads)
    if reason is not None:
        raise ValueError(f"KDA convolution kernel: {reason}; use conv.py's torch code")


def _launch_shape(padded: torch.Tensor, config: ConvKernelConfig) -> tuple[int, int, int]:
    import triton

    segments = triton.cdiv(padded.shape[1], config.segment_rows)
    return triton.cdiv(segments, config.segments), triton.cdiv(padded.shape[2], config.block_channels), padded.shape[0]


def conv_silu_forward(padded: torch.Tensor, weight: torch.Tensor, parts: int,
                      config: ConvKernelConfig = DEFAULT_CONFIG) -> tuple[torch.Tensor, ...]:
    """``silu(causal depthwise conv)`` of ``padded [B, L + K - 1, C]`` with ``weight [C, K]``, as ``parts`` contiguous
    ``[B, L, C / parts]`` tensors in padded's dtype (channel ranges in order)."""
    _check(padded, weight, parts, config)
    padded, weight = padded.contiguous(), weight.contiguous()
    batch, padded_length, channels = padded.shape
    taps = weight.shape[1]
    length = padded_length - taps + 1
    outs = tuple(padded.new_empty((batch, length, channels // parts)) for _ in range(parts))
    if batch and length and channels:
        forward, _ = _kernels()
        first = outs[0]
        forward[_launch_shape(padded, config)](
            padded, weight, first, outs[min(1, parts - 1)], outs[parts - 1], length, padded_length, channels,
            channels // parts, padded.stride(0), padded.stride(1), first.stride(0), first.stride(1), TAPS=taps,
            SEGMENT_ROWS=config.segment_rows, SEGMENTS=config.segments, BLOCK_C=config.block_channels,
            num_warps=config.num_warps)
    return outs


def conv_silu_backward(grads: Sequence[torch.Tensor], padded: torch.Tensor, weight: torch.Tensor,
                       config: ConvKernelConfig = DEFAULT_CONFIG) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d_padded [B, L + K - 1, C] in padded's dtype, d_weight [C, K] in weight's dtype)`` for the gradients of
    :func:`conv_silu_forward`'s parts (``[B, L, C / parts]`` each; the formulas in the module notes)."""
    parts = len(grads)
    _check(padded, weight, parts, config, grads)
    batch, padded_length, channels = padded.shape
    taps = weight.shape[1]
    length = padded_length - taps + 1
    if any(g.shape != (batch, length, channels // parts) for g in grads):
        raise ValueError(f"KDA convolution kernel: gradients must be {parts} x [B, L, C / parts] = "
                         f"{(batch, length, channels // parts)}; got {[tuple(g.shape) for g in grads]}")
    grads = [g.contiguous() for g in grads]
    padded, weight = padded.contiguous(), weight.contiguous()
    d_padded = torch.empty_like(padded)
    if batch == 0 or padded_length == 0 or channels == 0:
        d_padded.zero_()
        return d_padded, torch.zeros_like(weight)
    grid = _launch_shape(padded, config)
    partial = torch.empty((grid[0] * batch, channels, taps), dtype=torch.float32, device=padded.device)
    _, backward = _kernels()
    backward[grid](grads[0], grads[min(1, parts - 1)], grads[parts - 1], padded, weight, d_padded, partial, length,
                   padded_length, channels, channels // parts, grads[0].stride(0), grads[0].stride(1),
                   padded.stride(0), padded.stride(1), d_padded.stride(0), d_padded.stride(1), TAPS=taps,
                   SEGMENT_ROWS=config.segment_rows, SEGMENTS=config.segments, BLOCK_C=config.block_channels,
                   num_warps=config.num_warps)
    return d_padded, partial.sum(0).to(weight.dtype)
