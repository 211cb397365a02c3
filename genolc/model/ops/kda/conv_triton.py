"""The backward of KDA's short convolution with SiLU (conv.py) in one Triton kernel.

With ``z[t] = sum_j w[j] * padded[t + j]`` (per channel, K taps) and ``y = silu(z)``, given ``g = dL/dy``:

    gm[t]           = g[t] * silu'(z[t]),  silu'(z) = sigmoid(z) * (1 + z * (1 - sigmoid(z)))
    d_padded[s]     = sum_k w[k] * gm[s - k]          (terms with s - k outside [0, L) are zero)
    d_w[k]          = sum_t gm[t] * padded[t + k]     (over the batch and every t)

Why a kernel: compiled, the backward of ``KimiDeltaAttention.convolved_heads`` was four or five inductor kernels that
wrote and read fp32 ``[B, L, C]`` intermediates (the recomputed ``z``, ``gm`` and the fp32 sum behind ``d_padded``).
In the H200 profile of a `base` step at 512k (benchmarks/results/indexer_scoring_2026-12-03/call3_5233a82) those
kernels took about 0.62 s of 14.75 s, ~3 ms per layer and 32k chunk, some 30 bytes moved per element; `small` about
0.3 s of 6.52 s. This kernel reads ``padded`` and ``g`` once from memory and writes ``d_padded`` once (6 bytes per
element in bf16): each program takes ``block_channels`` channels of ``rows_per_program`` rows of ``d_padded``, and for
every tile of ``block_rows`` rows recomputes ``gm`` at the K shifts it needs from the ``2K - 1`` shifted tiles of
``padded`` (the same rows, hence cache hits; the loads of one shift share address and mask, so the compiler keeps one
of each). ``d_w``'s share of a program stays in registers; the per-program partials are summed afterwards in a fixed
order (deterministic, no atomics).

Sums run in fp32 in the order of conv.py's torch backward (``z`` over ascending taps, ``d_padded`` over ascending k),
so the two differ by rounding only (a fused multiply-add here and there). Runs on CUDA, or on CPU tensors under
``TRITON_INTERPRET=1`` (tests/gpu/triton_interpreter_check.py). Imports Triton at call time only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class ConvBackwardConfig:
    """Tiles of the backward kernel; ``benchmarks/bench_kda_conv.py`` times candidates on the H200."""

    block_rows: int = 16
    block_channels: int = 64
    rows_per_program: int = 1024
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("block_rows", "block_channels"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.rows_per_program < self.block_rows or self.rows_per_program % self.block_rows:
            raise ValueError(f"rows_per_program ({self.rows_per_program}) must be a positive multiple of block_rows "
                             f"({self.block_rows})")


DEFAULT_BACKWARD_CONFIG = ConvBackwardConfig()


@functools.cache
def _backward_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def conv_silu_backward_kernel(grad_ptr, padded_ptr, weight_ptr, d_padded_ptr, d_weight_ptr,
                                  length, padded_length, channels,
                                  stride_gb, stride_gt, stride_pb, stride_pt, stride_db, stride_dt,
                                  TAPS: tl.constexpr, TAPS_P2: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
                                  BLOCK_ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
        group = tl.program_id(0)
        batch = tl.program_id(2)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = cols < channels
        taps = tl.arange(0, TAPS_P2)
        grad_base = grad_ptr + batch.to(tl.int64) * stride_gb
        padded_base = padded_ptr + batch.to(tl.int64) * stride_pb
        d_padded_base = d_padded_ptr + batch.to(tl.int64) * stride_db
        d_weight = tl.zeros((BLOCK_C, TAPS_P2), dtype=tl.float32)
        first = group * ROWS_PER_PROGRAM
        for r0 in range(first, tl.minimum(first + ROWS_PER_PROGRAM, padded_length), BLOCK_ROWS):
            rows = r0 + tl.arange(0, BLOCK_ROWS)
            acc = tl.zeros((BLOCK_ROWS, BLOCK_C), dtype=tl.float32)
            for k in tl.static_range(TAPS):
                t = rows - k
                t_ok = (t >= 0) & (t < length)
                z = tl.zeros((BLOCK_ROWS, BLOCK_C), dtype=tl.float32)
                for j in tl.static_range(TAPS):
                    # Masked by the row read, not by t: loads of one shift (j - k) are then identical.
                    src = rows + (j - k)
                    src_ok = (src >= 0) & (src < padded_length)
                    x = tl.load(padded_base + src.to(tl.int64)[:, None] * stride_pt + cols[None, :],
                                mask=src_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
                    tap = tl.load(weight_ptr + cols * TAPS + j, mask=col_ok, other=0.0).to(tl.float32)
                    z += x * tap[None, :]
                g = tl.load(grad_base + t.to(tl.int64)[:, None] * stride_gt + cols[None, :],
                            mask=t_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
                gate = tl.sigmoid(z)
                gm = (z * (1.0 - gate) + 1.0) * gate * g
                tap_k = tl.load(weight_ptr + cols * TAPS + k, mask=col_ok, other=0.0).to(tl.float32)
                acc += gm * tap_k[None, :]
                if k == 0:
                    # gm at t = rows: each t in [0, L) is one program's row once, so d_w sums every term once.
                    for j in tl.static_range(TAPS):
                        src = rows + j
                        src_ok = (src >= 0) & (src < padded_length)
                        x = tl.load(padded_base + src.to(tl.int64)[:, None] * stride_pt + cols[None, :],
                                    mask=src_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
                        part = tl.sum(gm * x, axis=0)
                        d_weight += tl.where(taps[None, :] == j, part[:, None], 0.0)
            row_ok = rows < padded_length
            tl.store(d_padded_base + rows.to(tl.int64)[:, None] * stride_dt + cols[None, :],
                     acc.to(d_padded_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
        slot = batch * tl.num_programs(0) + group
        tl.store(d_weight_ptr + (slot.to(tl.int64) * channels + cols[:, None]) * TAPS + taps[None, :], d_weight,
                 mask=col_ok[:, None] & (taps[None, :] < TAPS))

    return conv_silu_backward_kernel


def unsupported_reason(grad_out: torch.Tensor, padded: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why the kernel cannot take these (a dtype outside ``KERNEL_DTYPES``, an fp64 weight), or None. Pure torch."""
    for name, tensor in (("grad_out", grad_out), ("padded", padded), ("weight", weight)):
        if tensor.dtype not in KERNEL_DTYPES:
            return f"{name} is {tensor.dtype}, not one of {KERNEL_DTYPES}"
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
    groups = triton.cdiv(padded_length, config.rows_per_program)
    if batch == 0 or padded_length == 0 or channels == 0:
        d_padded.zero_()
        return d_padded, torch.zeros_like(weight)
    partial = torch.empty((batch * groups, channels, taps), dtype=torch.float32, device=padded.device)
    grid = (groups, triton.cdiv(channels, config.block_channels), batch)
    _backward_kernel()[grid](grad_out, padded, weight, d_padded, partial, length, padded_length, channels,
                             grad_out.stride(0), grad_out.stride(1), padded.stride(0), padded.stride(1),
                             d_padded.stride(0), d_padded.stride(1), TAPS=taps,
                             TAPS_P2=triton.next_power_of_2(taps), ROWS_PER_PROGRAM=config.rows_per_program,
                             BLOCK_ROWS=config.block_rows, BLOCK_C=config.block_channels,
                             num_warps=config.num_warps)
    return d_padded, partial.sum(0).to(weight.dtype)
