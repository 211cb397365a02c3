"""The Triton kernels of the hyper-connection's block input (genolc/model/ops/mhc/triton.py's ``block_input`` and
``block_input_backward``; what they compute and why is said there and in op.py).

Imports Triton at import time: triton.py imports this module when it first runs.
"""

import triton
import triton.language as tl


@triton.jit
def _pre_weights(logits_ptr, scale_ptr, base_ptr, row64, live, stride_lm, eps, N: tl.constexpr):
    """``(logits[:, :N], sigmoid(z), pre)`` of these rows, ``z = logits[:, :N] * scale[0] + base[:N]``."""
    streams = tl.arange(0, N)
    logit = tl.load(logits_ptr + row64[:, None] * stride_lm + streams[None, :], mask=live[:, None], other=0.0)
    scale = tl.load(scale_ptr).to(tl.float32)
    sig = tl.sigmoid(logit * scale + tl.load(base_ptr + streams).to(tl.float32)[None, :])
    return logit, sig, sig + eps


@triton.jit
def block_input_kernel(x_ptr, logits_ptr, scale_ptr, base_ptr, out_ptr, n_rows, dim, eps,
                       stride_xm, stride_lm, stride_om,
                       N: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = row < n_rows
    row64 = row.to(tl.int64)
    streams = tl.arange(0, N)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    inside = live[:, None] & (cols < dim)[None, :]
    _, _, pre = _pre_weights(logits_ptr, scale_ptr, base_ptr, row64, live, stride_lm, eps, N)
    x = tl.load(x_ptr + row64[:, None, None] * stride_xm + streams[None, :, None] * dim + cols[None, None, :],
                mask=inside[:, None, :], other=0.0).to(tl.float32)
    out = tl.sum(pre[:, :, None] * x, axis=1)
    tl.store(out_ptr + row64[:, None] * stride_om + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def block_input_backward_kernel(x_ptr, g_ptr, grad_logits_ptr, logits_ptr, rstd_ptr, scale_ptr, base_ptr,
                                scaled_ptr, coef_ptr, pre_ptr, partial_ptr, n_rows, dim, n_cols, n_logits, eps,
                                stride_xm, stride_gm, stride_glm, stride_lm, stride_sm,
                                N: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                                BLOCK_W: tl.constexpr):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = row < n_rows
    row64 = row.to(tl.int64)
    streams = tl.arange(0, N)
    d_pre = tl.zeros([ROWS, N], tl.float32)
    for start in range(0, dim, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        inside = live[:, None] & (cols < dim)[None, :]
        g = tl.load(g_ptr + row64[:, None] * stride_gm + cols[None, :], mask=inside, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + row64[:, None, None] * stride_xm + streams[None, :, None] * dim + cols[None, None, :],
                    mask=inside[:, None, :], other=0.0).to(tl.float32)
        d_pre += tl.sum(x * g[:, None, :], axis=2)
    logit, sig, pre = _pre_weights(logits_ptr, scale_ptr, base_ptr, row64, live, stride_lm, eps, N)
    tl.store(pre_ptr + row64[:, None] * N + streams[None, :], pre, mask=live[:, None])
    dz = tl.where(live[:, None], d_pre * sig * (1 - sig), 0.0)
    # The logits' gradient with dz * scale[0] added to its first N columns (a one-hot sum puts [ROWS, N] there).
    columns = tl.arange(0, BLOCK_W)
    row_logits = live[:, None] & (columns < n_logits)[None, :]
    grad = tl.load(grad_logits_ptr + row64[:, None] * stride_glm + columns[None, :], mask=row_logits,
                   other=0.0).to(tl.float32)
    one_hot = (streams[:, None] == columns[None, :]).to(tl.float32)
    grad += tl.sum((dz * tl.load(scale_ptr).to(tl.float32))[:, :, None] * one_hot[None, :, :], axis=1)
    logits = tl.load(logits_ptr + row64[:, None] * stride_lm + columns[None, :], mask=row_logits, other=0.0)
    rstd = tl.load(rstd_ptr + row64, mask=live, other=0.0)
    tl.store(scaled_ptr + row64[:, None] * stride_sm + columns[None, :], grad * rstd[:, None], mask=row_logits)
    tl.store(coef_ptr + row64, rstd * rstd / n_cols * tl.sum(grad * logits, axis=1), mask=live)
    # Per program: sum(dz) per stream (base's gradient) and sum(dz * logit) (scale[0]'s), added up afterwards.
    partial = partial_ptr + tl.program_id(0).to(tl.int64) * (N + 1)
    tl.store(partial + streams, tl.sum(dz, axis=0))
    tl.store(partial + N, tl.sum(tl.sum(dz * logit, axis=1), axis=0))
