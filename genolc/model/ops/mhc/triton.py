"""The mHC mixing logits' forward in one Triton kernel: ``out = rsqrt(mean(x^2) + eps) * (x @ weight^T)``.

Each program takes ``BLOCK_ROWS`` tokens and walks their ``K = N * D`` stream values once, summing the squares and
the ``W`` products (a ``[BLOCK_ROWS, BLOCK_K] x [BLOCK_K, BLOCK_W]`` dot per step) side by side; the norm is folded
out of the product (``linear(x * r, weight) = r * linear(x, weight)``), so the normed copy of the streams is never
written. Before this kernel the step ran the norm as one kernel writing a bf16 copy and cuBLAS's product over that
copy, a ``[T, K] x [K, 24]`` GEMM that cuBLAS tiles into 64 programs reading 0.3-0.5 TB/s (1.42 ms per 32k chunk of
``base``; 2.2 s of a 29.2 s 512k step, benchmarks/results/profile_chunked_base_512k_2026-12-02.json).

The product: TF32 (``tf32=True``, what the op asks for under autocast: more bits than autocast's bf16 Linear) or
IEEE fp32. Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests/gpu/triton_interpreter_check.py).
Imports Triton at call time only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_LOGITS = 128


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch settings; ``benchmarks/bench_mhc.py`` compares candidates on the H200."""

    block_rows: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3


DEFAULT_CONFIG = KernelConfig()


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def mixing_logits_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, n_logits, eps,
                             stride_xm, stride_wn, stride_om,
                             BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr,
                             PRECISION: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        logits = tl.arange(0, BLOCK_W)
        row_ok = rows < n_rows
        logit_ok = logits < n_logits
        row_offsets = rows.to(tl.int64) * stride_xm
        products = tl.zeros((BLOCK_ROWS, BLOCK_W), dtype=tl.float32)
        squares = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
        for k0 in range(0, n_cols, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_ok = cols < n_cols
            x = tl.load(x_ptr + row_offsets[:, None] + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                        other=0.0).to(tl.float32)
            w = tl.load(w_ptr + logits[None, :] * stride_wn + cols[:, None], mask=logit_ok[None, :] & col_ok[:, None],
                        other=0.0).to(tl.float32)
            squares += tl.sum(x * x, axis=1)
            products = tl.dot(x, w, products, input_precision=PRECISION)
        scale = tl.rsqrt(squares / n_cols + eps)
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_om + logits[None, :], products * scale[:, None],
                 mask=row_ok[:, None] & logit_ok[None, :])

    return mixing_logits_kernel


def check_kernel_inputs(x: torch.Tensor, weight: torch.Tensor) -> None:
    """ValueError unless the kernel takes ``x [M, K]`` and ``weight [W, K]``: float dtypes of ``KERNEL_DTYPES``,
    contiguous last dimensions, one device, ``W <= MAX_LOGITS``."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x must be [M, K] and weight [W, K] with the same K; got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if x.dtype not in KERNEL_DTYPES or weight.dtype not in KERNEL_DTYPES:
        raise ValueError(f"x ({x.dtype}) and weight ({weight.dtype}) must be one of {KERNEL_DTYPES}")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"x and weight need a contiguous last dimension; got strides {x.stride()}, {weight.stride()}")
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} and weight on {weight.device}; put both on one device")
    if weight.shape[0] > MAX_LOGITS:
        raise ValueError(f"the kernel computes at most {MAX_LOGITS} logits per token, got {weight.shape[0]}")


def fused_mixing_logits(x: torch.Tensor, weight: torch.Tensor, eps: float, *, tf32: bool,
                        out: torch.Tensor | None = None, config: KernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """``x [M, K]``, ``weight [W, K]`` -> ``[M, W]`` fp32 logits (written into ``out`` when given)."""
    import triton

    check_kernel_inputs(x, weight)
    rows, logits = x.shape[0], weight.shape[0]
    if out is None:
        out = torch.empty((rows, logits), dtype=torch.float32, device=x.device)
    elif out.shape != (rows, logits) or out.dtype != torch.float32 or out.stride(-1) != 1:
        raise ValueError(f"out must be a float32 [{rows}, {logits}] tensor with a contiguous last dimension")
    if rows == 0:
        return out
    grid = (triton.cdiv(rows, config.block_rows),)
    _kernel()[grid](x, weight, out, rows, x.shape[1], logits, eps, x.stride(0), weight.stride(0), out.stride(0),
                    BLOCK_ROWS=config.block_rows, BLOCK_K=config.block_k,
                    BLOCK_W=max(16, triton.next_power_of_2(logits)), PRECISION="tf32" if tf32 else "ieee",
                    num_warps=config.num_warps, num_stages=config.num_stages)
    return out
