"""The mHC mixing logits in two Triton kernels, and the block input's two. The logits' forward ``out = rsqrt(mean(x^2)
+ eps) * (x @ weight^T)`` and its backward (op.py has the formulas) are each one pass over the streams.

Each program takes ``BLOCK_ROWS`` tokens and walks their ``K = N * D`` stream values once, summing the squares and
the ``W`` products (a ``[BLOCK_ROWS, BLOCK_K] x [BLOCK_K, BLOCK_W]`` dot per step) side by side; the norm is folded
out of the product (``linear(x * r, weight) = r * linear(x, weight)``), so the normed copy of the streams is never
written. Alone, on a 32k chunk of `base`, this kernel took 0.27 ms with three pipeline stages, where the compiled
reference (inductor's norm writing a bf16 copy, then cuBLAS's product) took 0.46 ms; in the 512k step the
difference did not show beyond noise (benchmarks/results/mhc_fused_2026-12-02/README.md). It now runs one stage
by default, or pipelined with the streams' tile in registers (:class:`KernelConfig` says why).

The backward kernel takes ``block_k`` columns of ``rows_per_program`` tokens per program: it writes those
columns of ``dx`` and keeps their share of ``dweight`` in registers, so the streams are read once and ``dx``
written once; the per-group partial sums of ``dweight`` are added afterwards in a fixed order.

The block's input ``sum_n pre_n * stream_n`` (``block_input``: one read of the streams, ``pre`` formed from the
logits inside) and its backward's first pass (``block_input_backward``: ``pre``'s gradient, one read of the streams
and of the block input's gradient, then per token the logits' gradient with pre's share and the mixing backward's
operands) are kernels of their own (block_input_kernels.py); the mixing backward kernel above adds the block input's
share of x's gradient, ``pre[m, n] * g_block[m]``, when given ``pre`` and ``grad_block`` (op.py's
``BlockInputPassingStreams``), and the merge's share when given ``grad_x`` (the same function's third output):
the shares other than the product are summed first and the product is accumulated onto them, which keeps the
kernel within 255 registers without spilling (tests/gpu/triton_lowering_check.py).

The products: TF32 (``tf32=True``, what the op asks for under autocast: more bits than autocast's bf16 Linear) or
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
    """Tiles and pipelining of the forward kernel; ``benchmarks/bench_mhc.py`` compares candidates on the H200.

    The default loop is not software-pipelined (one stage). With fp32 streams (the trainer's until fa33e7c, now
    ``--stream-dtype float32``) and two to four stages, Triton 3.6 gives the streams' tile one shared-memory buffer
    fewer than the weight's and refills the slot that the step's own asynchronous TF32 wgmma may still be reading.
    The tile also feeds the sum of squares, which is likely why the two counts differ. Identical forwards then gave
    different logits now and then: on the H200 (2026-12-02), one run of six under ``CUDA_LAUNCH_BLOCKING=1``
    differed in ``layers.0.attn_hc`` (benchmarks/forward_determinism.py), and identical chunked steps landed 3e-2
    apart (benchmarks/chunked_vs_whole.py). tests/gpu/triton_lowering_check.py finds such refills in the compiled
    loop without a GPU. With bf16 streams the product reads the tile from registers, and that check found no race.

    ``tile_in_registers`` makes the fp32 tile the product's operand from registers too: the compiled loop then
    reads it from shared memory only into registers, and the check finds no race at three stages. Such a config
    may pipeline (``stages`` > 1); any other is refused. On the H200 (2026-12-02, benchmarks/bench_mhc.py, a 32k
    chunk, fp32 streams) the default, one stage in 64 x 64 tiles, took 0.183 ms for `small` and 0.287 ms for
    `base`, the fastest of seven (the registers' form at four stages 0.195 / 0.297 ms; the racy three-stage build
    0.27 ms for `base`); bf16 streams, the trainer's default now, were not timed. benchmarks/mhc_race_probe.py:
    the racy build gave other bits in 3 of 300 calls, one stage (64 x 128) and the registers' form in none.
    """

    block_rows: int = 64
    block_k: int = 64
    num_warps: int = 4
    stages: int = 1
    tile_in_registers: bool = False

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ValueError(f"stages must be at least 1, got {self.stages}")
        if self.stages > 1 and not self.tile_in_registers:
            raise ValueError(f"a pipelined mHC forward (stages={self.stages}) needs tile_in_registers=True: without "
                             "it Triton 3.6 refills the streams' tile while the TF32 product still reads it "
                             "(KernelConfig's note); use stages=1 or set tile_in_registers")


@dataclass(frozen=True)
class BackwardConfig:
    """The backward's tiles: each program takes ``block_k`` columns of ``rows_per_program`` tokens (2026-12-02 on
    the H200: the fastest of five, 0.61 ms for `base`'s 32k chunk, 2.6 TB/s read + written; 8192 rows a program
    1.02 ms)."""

    rows_per_program: int = 2048
    block_rows: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3


DEFAULT_CONFIG = KernelConfig()
DEFAULT_BACKWARD_CONFIG = BackwardConfig()


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def mixing_logits_kernel(x_ptr, w_ptr, out_ptr, rstd_ptr, n_rows, n_cols, n_logits, eps,
                             stride_xm, stride_wn, stride_om,
                             BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr,
                             PRECISION: tl.constexpr, TILE_IN_REGISTERS: tl.constexpr):
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
            tile_ok = row_ok[:, None] & col_ok[None, :]
            x = tl.load(x_ptr + row_offsets[:, None] + cols[None, :], mask=tile_ok, other=0.0).to(tl.float32)
            if TILE_IN_REGISTERS:
                # A value computed in registers (the same numbers): the product takes it from there, not from the
                # shared buffer that the pipeline refills (KernelConfig's note).
                x = tl.where(tile_ok, x, 0.0)
            w = tl.load(w_ptr + logits[None, :] * stride_wn + cols[:, None], mask=logit_ok[None, :] & col_ok[:, None],
                        other=0.0).to(tl.float32)
            squares += tl.sum(x * x, axis=1)
            products = tl.dot(x, w, products, input_precision=PRECISION)
        scale = tl.rsqrt(squares / n_cols + eps)
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_om + logits[None, :], products * scale[:, None],
                 mask=row_ok[:, None] & logit_ok[None, :])
        tl.store(rstd_ptr + rows, scale, mask=row_ok)

    return mixing_logits_kernel


@functools.cache
def _backward_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def mixing_logits_backward_kernel(scaled_ptr, coef_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, pre_ptr, g_block_ptr,
                                      g_x_ptr, n_rows, n_cols, n_logits, dim,
                                      stride_sm, stride_xm, stride_wn, stride_dxm, stride_dwg, stride_dwn,
                                      stride_pm, stride_gm, stride_gxm,
                                      ROWS_PER_PROGRAM: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                                      BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr, PRECISION: tl.constexpr,
                                      ADD_BLOCK_INPUT: tl.constexpr, TILE_IN_ONE_STREAM: tl.constexpr,
                                      ADD_GRAD_X: tl.constexpr):
        cols = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
        group = tl.program_id(1)
        logits = tl.arange(0, BLOCK_W)
        col_ok = cols < n_cols
        logit_ok = logits < n_logits
        # Column k of the streams is stream k // dim, channel k % dim (used with ADD_BLOCK_INPUT only).
        stream_of_col = cols // dim
        channel_of_col = cols - stream_of_col * dim
        w = tl.load(w_ptr + logits[:, None] * stride_wn + cols[None, :], mask=logit_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)                                                  # [W, K]
        dw = tl.zeros((BLOCK_W, BLOCK_K), dtype=tl.float32)
        for r0 in range(group * ROWS_PER_PROGRAM, tl.minimum((group + 1) * ROWS_PER_PROGRAM, n_rows), BLOCK_ROWS):
            rows = r0 + tl.arange(0, BLOCK_ROWS)
            row_ok = rows < n_rows
            scaled = tl.load(scaled_ptr + rows.to(tl.int64)[:, None] * stride_sm + logits[None, :],
                             mask=row_ok[:, None] & logit_ok[None, :], other=0.0)               # [M, W]
            coef = tl.load(coef_ptr + rows, mask=row_ok, other=0.0)
            tile_ok = row_ok[:, None] & col_ok[None, :]
            x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :], mask=tile_ok,
                        other=0.0).to(tl.float32)                                               # [M, K]
            # The shares that are not the product first, then the product accumulated onto them.
            dx = -coef[:, None] * x
            if ADD_BLOCK_INPUT:
                # The block input's share, pre[m, n] * g_block[m, d]: x's gradient is written once.
                if TILE_IN_ONE_STREAM:
                    # dim is a multiple of BLOCK_K: one weight a token (a [BLOCK_ROWS, BLOCK_K] gather of them took
                    # the fp32-streams build past 255 registers).
                    pre = tl.load(pre_ptr + rows.to(tl.int64) * stride_pm + (tl.program_id(0) * BLOCK_K) // dim,
                                  mask=row_ok, other=0.0)[:, None]
                else:
                    pre = tl.load(pre_ptr + rows.to(tl.int64)[:, None] * stride_pm + stream_of_col[None, :],
                                  mask=tile_ok, other=0.0)
                g_block = tl.load(g_block_ptr + rows.to(tl.int64)[:, None] * stride_gm + channel_of_col[None, :],
                                  mask=tile_ok, other=0.0).to(tl.float32)
                dx += pre * g_block
            if ADD_GRAD_X:
                # x's gradient from its other reader (the merge), added before dx is rounded: autograd's sum of
                # the two shares would read both and write a third tensor.
                dx += tl.load(g_x_ptr + rows.to(tl.int64)[:, None] * stride_gxm + cols[None, :], mask=tile_ok,
                              other=0.0).to(tl.float32)
            dx = tl.dot(scaled, w, dx, input_precision=PRECISION)
            tl.store(dx_ptr + rows.to(tl.int64)[:, None] * stride_dxm + cols[None, :],
                     dx.to(dx_ptr.dtype.element_ty), mask=tile_ok)
            dw = tl.dot(tl.trans(scaled), x, dw, input_precision=PRECISION)
        tl.store(dw_ptr + group.to(tl.int64) * stride_dwg + logits[:, None] * stride_dwn + cols[None, :], dw,
                 mask=logit_ok[:, None] & col_ok[None, :])

    return mixing_logits_backward_kernel


def unsupported_reason(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why the kernels cannot take ``x`` and ``weight`` (a dtype outside ``KERNEL_DTYPES``, more than ``MAX_LOGITS``
    logits), or None. ``ops.dispatch.mhc_mixing_logits`` (and through :func:`block_input_unsupported_reason`,
    ``mhc_block_input``) sends those to the reference; layouts are not a reason
    (the dispatch makes the last dimension contiguous). Pure torch: no Triton import."""
    if x.dtype not in KERNEL_DTYPES or weight.dtype not in KERNEL_DTYPES:
        return (f"x ({x.dtype}) and weight ({weight.dtype}) must each be one of {KERNEL_DTYPES}; cast them, or use "
                "genolc.model.ops.mhc.reference.mixing_logits")
    if weight.shape[0] > MAX_LOGITS:
        return (f"at most {MAX_LOGITS} logits per token ((2 + hc_mult) * hc_mult), got {weight.shape[0]}; use "
                "genolc.model.ops.mhc.reference.mixing_logits for more streams")
    return None


def block_input_unsupported_reason(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                                   n_streams: int) -> str | None:
    """Why the block-input kernels cannot take these operands (:func:`unsupported_reason`'s, N not a power of two
    dividing x's columns, scale or base of another dtype or device, too few of their values), or None."""
    reason = unsupported_reason(x, weight)
    if reason is not None:
        return reason
    if n_streams < 1 or n_streams & (n_streams - 1) or x.shape[-1] % n_streams:
        return f"{n_streams} streams: the block-input kernels take a power of two dividing x's {x.shape[-1]} columns"
    for name, tensor, least in (("scale", scale, 1), ("base", base, n_streams)):
        if tensor.dtype not in KERNEL_DTYPES or tensor.device != x.device or tensor.numel() < least:
            return (f"{name} is {tensor.dtype} with {tensor.numel()} values on {tensor.device}; the kernels take "
                    f"one of {KERNEL_DTYPES} with at least {least} on {x.device}")
    return None


def check_kernel_inputs(x: torch.Tensor, weight: torch.Tensor) -> None:
    """ValueError unless the kernel takes ``x [M, K]`` and ``weight [W, K]``: float dtypes of ``KERNEL_DTYPES``,
    contiguous last dimensions, one device, ``W <= MAX_LOGITS`` (:func:`unsupported_reason`)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"mHC mixing kernel: x must be [M, K] and weight [W, K] with the same K; got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)} (flatten the streams to [B * T, N * D])")
    reason = unsupported_reason(x, weight)
    if reason is not None:
        raise ValueError(f"mHC mixing kernel: {reason}")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"mHC mixing kernel: x and weight need a contiguous last dimension; got strides {x.stride()} "
                         f"and {weight.stride()}: pass x.contiguous() / weight.contiguous()")
    if x.device != weight.device:
        raise ValueError(f"mHC mixing kernel: x is on {x.device} and weight on {weight.device}; put both on one "
                         f"device")


def fused_mixing_logits(x: torch.Tensor, weight: torch.Tensor, eps: float, *, tf32: bool,
                        out: torch.Tensor | None = None, config: KernelConfig = DEFAULT_CONFIG
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]``, ``weight [W, K]`` -> ``([M, W] logits, [M] rstd)``, both fp32; ``rstd = rsqrt(mean(x^2) +
    eps)`` per token, which the backward needs. The logits go into ``out`` when given."""
    import triton

    check_kernel_inputs(x, weight)
    rows, logits = x.shape[0], weight.shape[0]
    if out is None:
        out = torch.empty((rows, logits), dtype=torch.float32, device=x.device)
    elif out.shape != (rows, logits) or out.dtype != torch.float32 or out.stride(-1) != 1:
        raise ValueError(f"out must be a float32 [{rows}, {logits}] tensor with a contiguous last dimension")
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows == 0:
        return out, rstd
    grid = (triton.cdiv(rows, config.block_rows),)
    _kernel()[grid](x, weight, out, rstd, rows, x.shape[1], logits, eps, x.stride(0), weight.stride(0),
                    out.stride(0), BLOCK_ROWS=config.block_rows, BLOCK_K=config.block_k,
                    BLOCK_W=max(16, triton.next_power_of_2(logits)), PRECISION="tf32" if tf32 else "ieee",
                    TILE_IN_REGISTERS=config.tile_in_registers, num_warps=config.num_warps,
                    num_stages=config.stages)
    return out, rstd


def fused_mixing_logits_backward(scaled: torch.Tensor, coef: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                 *, tf32: bool, pre: torch.Tensor | None = None,
                                 grad_block: torch.Tensor | None = None, grad_x: torch.Tensor | None = None,
                                 config: BackwardConfig = DEFAULT_BACKWARD_CONFIG
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``dx = scaled @ weight - coef * x`` (in x's dtype) and ``dweight = scaled^T @ x`` (in weight's dtype) in one
    pass over ``x``: ``scaled [M, W]`` fp32 (the logits' gradient times each token's rstd), ``coef [M]`` fp32 (see
    ``op.py``). Each program keeps its ``[W, block_k]`` share of ``dweight`` for ``rows_per_program`` tokens; the
    per-group partial sums are added in a fixed order (deterministic, no atomics).

    With ``pre [M, N]`` fp32 and ``grad_block [M, D]`` (the gradient of :func:`block_input`'s output, ``K = N *
    D``), ``dx`` also gets ``pre[m, n] * grad_block[m]`` in stream n's columns, the block input's share of x's
    gradient, added in fp32 before dx is rounded. ``grad_x [M, K]`` (any of ``KERNEL_DTYPES``): a gradient of x
    from elsewhere, added in fp32 before dx is rounded as well."""
    import triton

    check_kernel_inputs(x, weight)
    rows, cols, logits = x.shape[0], x.shape[1], weight.shape[0]
    if scaled.shape != (rows, logits) or scaled.dtype != torch.float32 or coef.shape != (rows,) \
            or coef.dtype != torch.float32:
        raise ValueError(f"scaled must be float32 [{rows}, {logits}] and coef float32 [{rows}]; got "
                         f"{scaled.dtype} {tuple(scaled.shape)} and {coef.dtype} {tuple(coef.shape)}")
    if (pre is None) != (grad_block is None):
        raise ValueError("pass pre and grad_block together (the block input's share of dx), or neither")
    if pre is not None:
        _check_block_share(x, pre, grad_block)
        pre, grad_block = pre.contiguous(), grad_block.contiguous()
    if grad_x is not None:
        if grad_x.shape != x.shape or grad_x.dtype not in KERNEL_DTYPES or grad_x.device != x.device:
            raise ValueError(f"grad_x must be {tuple(x.shape)} of one of {KERNEL_DTYPES} on {x.device}; got "
                             f"{grad_x.dtype} {tuple(grad_x.shape)} on {grad_x.device}")
        grad_x = grad_x if grad_x.stride(-1) == 1 else grad_x.contiguous()
    if config.rows_per_program % config.block_rows:
        raise ValueError(f"rows_per_program ({config.rows_per_program}) must be a multiple of block_rows "
                         f"({config.block_rows})")
    scaled, coef = scaled.contiguous(), coef.contiguous()
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    if rows == 0:
        return dx, torch.zeros_like(weight, memory_format=torch.contiguous_format)
    groups = triton.cdiv(rows, config.rows_per_program)
    partial = torch.empty((groups, logits, cols), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(cols, config.block_k), groups)
    adds_block_input = pre is not None
    # Pointers the kernel never reads (no block input's share, no grad_x): x stands in for them.
    pre_arg, grad_block_arg = (pre, grad_block) if adds_block_input else (x, x)
    grad_x_arg = x if grad_x is None else grad_x
    dim = grad_block.shape[1] if adds_block_input else cols
    _backward_kernel()[grid](scaled, coef, x, weight, dx, partial, pre_arg, grad_block_arg, grad_x_arg, rows, cols,
                             logits, dim, scaled.stride(0), x.stride(0), weight.stride(0), dx.stride(0),
                             partial.stride(0), partial.stride(1), pre_arg.stride(0), grad_block_arg.stride(0),
                             grad_x_arg.stride(0), ROWS_PER_PROGRAM=config.rows_per_program,
                             BLOCK_ROWS=config.block_rows, BLOCK_K=config.block_k,
                             BLOCK_W=max(16, triton.next_power_of_2(logits)), PRECISION="tf32" if tf32 else "ieee",
                             ADD_BLOCK_INPUT=adds_block_input, TILE_IN_ONE_STREAM=dim % config.block_k == 0,
                             ADD_GRAD_X=grad_x is not None, num_warps=config.num_warps,
                             num_stages=config.num_stages)
    return dx, partial.sum(0).to(weight.dtype)


def _check_block_share(x: torch.Tensor, pre: torch.Tensor, grad_block: torch.Tensor) -> None:
    rows, cols = x.shape
    n_streams = pre.shape[-1] if pre.dim() == 2 else 0
    if pre.shape != (rows, n_streams) or pre.dtype != torch.float32 or not n_streams or cols % n_streams:
        raise ValueError(f"pre must be float32 [{rows}, N] with N dividing x's {cols} columns; got {pre.dtype} "
                         f"{tuple(pre.shape)}")
    dim = cols // n_streams
    if grad_block.shape != (rows, dim) or grad_block.dtype not in KERNEL_DTYPES or grad_block.device != x.device:
        raise ValueError(f"grad_block must be [{rows}, {dim}] of one of {KERNEL_DTYPES} on {x.device}; got "
                         f"{grad_block.dtype} {tuple(grad_block.shape)} on {grad_block.device}")


BLOCK_INPUT_ROWS = 4
BLOCK_INPUT_BLOCK_D = 256
BLOCK_INPUT_WARPS = 4


@functools.cache
def _block_input_kernels():
    from genolc.model.ops.mhc import block_input_kernels

    return block_input_kernels.block_input_kernel, block_input_kernels.block_input_backward_kernel


def _check_pre_operands(x: torch.Tensor, logits: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                        n_streams: int) -> int:
    """``D`` after checking ``x [M, N * D]``, fp32 ``logits [M, >= N]``, ``scale [>= 1]`` and ``base [>= N]`` for the
    block-input kernels (N a power of two)."""
    rows, cols = x.shape
    if n_streams < 1 or n_streams & (n_streams - 1) or cols % n_streams:
        raise ValueError(f"the block-input kernels take a power-of-two number of streams dividing x's {cols} "
                         f"columns, got {n_streams}; use genolc.model.ops.mhc.reference.block_input")
    if logits.dim() != 2 or logits.shape[0] != rows or logits.shape[1] < n_streams or logits.dtype != torch.float32:
        raise ValueError(f"logits must be float32 [{rows}, >= {n_streams}], got {logits.dtype} {tuple(logits.shape)}")
    if scale.numel() < 1 or base.numel() < n_streams or scale.dtype not in KERNEL_DTYPES \
            or base.dtype not in KERNEL_DTYPES:
        raise ValueError(f"scale and base must be of {KERNEL_DTYPES} with at least 1 and {n_streams} values; got "
                         f"{scale.dtype} {tuple(scale.shape)} and {base.dtype} {tuple(base.shape)}")
    if x.stride(-1) != 1 or logits.stride(-1) != 1:
        raise ValueError(f"the block-input kernels need x and logits with a contiguous last dimension; got strides "
                         f"{x.stride()} and {logits.stride()}")
    if any(t.device != x.device for t in (logits, scale, base)):
        raise ValueError(f"x, logits, scale and base must be on one device; x is on {x.device}")
    return cols // n_streams


def block_input(x: torch.Tensor, logits: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, eps: float,
                n_streams: int) -> torch.Tensor:
    """``reference.weighted_streams(x, reference.pre_weights(logits, scale, base, N, eps))`` in one pass over ``x [M,
    N * D]``: the block's input ``[M, D]`` in x's dtype, its pre weights formed in the kernel from the fp32
    ``logits``."""
    import triton

    dim = _check_pre_operands(x, logits, scale, base, n_streams)
    rows = x.shape[0]
    scale, base = scale.contiguous(), base.contiguous()
    out = torch.empty((rows, dim), dtype=x.dtype, device=x.device)
    if rows:
        grid = (triton.cdiv(rows, BLOCK_INPUT_ROWS), triton.cdiv(dim, BLOCK_INPUT_BLOCK_D))
        _block_input_kernels()[0][grid](x, logits, scale, base, out, rows, dim, eps, x.stride(0), logits.stride(0),
                                        out.stride(0), N=n_streams, ROWS=BLOCK_INPUT_ROWS,
                                        BLOCK_D=BLOCK_INPUT_BLOCK_D, num_warps=BLOCK_INPUT_WARPS)
    return out


def block_input_backward(x: torch.Tensor, grad_block: torch.Tensor, grad_logits: torch.Tensor, logits: torch.Tensor,
                         rstd: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, eps: float
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass over ``x [M, N * D]`` and ``grad_block [M, D]`` for the backward of the block input and of the logits
    before their kernel: (``scaled [M, W]``, ``coef [M]``: :func:`fused_mixing_logits_backward`'s operands for the
    logits' gradient with the pre weights' share added; ``pre [M, N]``; ``[N + 1]`` sums: ``sum(dz)`` per stream,
    base's gradient, then ``sum(dz * logits[:, :N])``, scale[0]'s), all fp32 (op.py's formulas)."""
    import triton

    rows, cols = x.shape
    if grad_block.dim() != 2 or grad_block.shape[0] != rows or not grad_block.shape[1] or cols % grad_block.shape[1]:
        raise ValueError(f"grad_block must be [{rows}, D] with D dividing x's {cols} columns; got "
                         f"{tuple(grad_block.shape)}")
    n_streams = cols // grad_block.shape[1]
    dim = _check_pre_operands(x, logits, scale, base, n_streams)
    n_logits = logits.shape[1]
    if grad_logits.shape != logits.shape or rstd.shape != (rows,) or n_logits > MAX_LOGITS:
        raise ValueError(f"grad_logits must be {tuple(logits.shape)} and rstd [{rows}], at most {MAX_LOGITS} logits; "
                         f"got {tuple(grad_logits.shape)} and {tuple(rstd.shape)}")
    grad_block, grad_logits, rstd = grad_block.contiguous(), grad_logits.contiguous(), rstd.contiguous()
    scale, base = scale.contiguous(), base.contiguous()
    scaled = torch.empty((rows, n_logits), dtype=torch.float32, device=x.device)
    coef = torch.empty(rows, dtype=torch.float32, device=x.device)
    pre = torch.empty((rows, n_streams), dtype=torch.float32, device=x.device)
    programs = triton.cdiv(rows, BLOCK_INPUT_ROWS)
    # Every program writes its row of sums; only a launch of none needs a zero row.
    partial = torch.empty((programs, n_streams + 1), dtype=torch.float32, device=x.device) if rows else \
        torch.zeros((1, n_streams + 1), dtype=torch.float32, device=x.device)
    if rows:
        _block_input_kernels()[1][(programs,)](
            x, grad_block, grad_logits, logits, rstd, scale, base, scaled, coef, pre, partial, rows, dim, cols,
            n_logits, eps, x.stride(0), grad_block.stride(0), grad_logits.stride(0), logits.stride(0),
            scaled.stride(0), N=n_streams, ROWS=BLOCK_INPUT_ROWS, BLOCK_D=BLOCK_INPUT_BLOCK_D,
            BLOCK_W=max(16, triton.next_power_of_2(n_logits)), num_warps=BLOCK_INPUT_WARPS)
    return scaled, coef, pre, partial.sum(0)
