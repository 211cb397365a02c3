"""The Triton kernels of :mod:`genolc.model.ops.mhc.comb_triton` (the algorithm is described there).

Imports Triton at import time: comb_triton imports this module when it first runs.
"""

import triton
import triton.language as tl


@triton.jit
def _tile(pid, n_rows, N: tl.constexpr, NP: tl.constexpr, BLOCK: tl.constexpr):
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    idx = tl.arange(0, NP)
    offs = (rows.to(tl.int64)[:, None, None] * (N * N) + idx[None, :, None] * N + idx[None, None, :])
    valid = (rows < n_rows)[:, None, None] & (idx < N)[None, :, None] & (idx < N)[None, None, :]
    local = tl.arange(0, BLOCK)[:, None, None] * (NP * NP) + idx[None, :, None] * NP + idx[None, None, :]
    return offs, valid, local


@triton.jit
def _softmax(logits_ptr, offs, valid):
    z = tl.load(logits_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
    top = tl.max(z, axis=2)
    # Padding rows are all -inf; a zero max keeps them finite here (masked to zero below).
    top = tl.where(top == float("-inf"), 0.0, top)
    e = tl.exp(z - top[:, :, None])
    total = tl.sum(e, axis=2)
    return tl.where(valid, e / tl.where(total == 0.0, 1.0, total)[:, :, None], 0.0)


@triton.jit
def _columns(x, eps):
    return x / (tl.sum(x, axis=1)[:, None, :] + eps)


@triton.jit
def _rows(x, eps):
    return x / (tl.sum(x, axis=2)[:, :, None] + eps)


@triton.jit
def comb_forward_kernel(logits_ptr, out_ptr, n_rows, eps, N: tl.constexpr, NP: tl.constexpr,
                        ITERS: tl.constexpr, BLOCK: tl.constexpr):
    offs, valid, local = _tile(tl.program_id(0), n_rows, N, NP, BLOCK)
    m = tl.where(valid, _softmax(logits_ptr, offs, valid) + eps, 0.0)
    m = _columns(m, eps)
    for _ in range(ITERS - 1):
        m = _rows(m, eps)
        m = _columns(m, eps)
    tl.store(out_ptr + offs, m, mask=valid)


@triton.jit
def comb_backward_kernel(grad_ptr, logits_ptr, dlogits_ptr, scratch_ptr, n_rows, eps, N: tl.constexpr,
                         NP: tl.constexpr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs, valid, local = _tile(pid, n_rows, N, NP, BLOCK)
    step = BLOCK * NP * NP
    scratch = scratch_ptr + pid.to(tl.int64) * ((2 * ITERS - 1) * step)
    p = _softmax(logits_ptr, offs, valid)
    m = tl.where(valid, p + eps, 0.0)
    tl.store(scratch + local, m)
    m = _columns(m, eps)
    for it in range(ITERS - 1):
        tl.store(scratch + (1 + 2 * it) * step + local, m)
        m = _rows(m, eps)
        tl.store(scratch + (2 + 2 * it) * step + local, m)
        m = _columns(m, eps)
    tl.debug_barrier()
    g = tl.load(grad_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    for back in range(ITERS - 1):
        it = ITERS - 2 - back
        x = tl.load(scratch + (2 + 2 * it) * step + local)
        s = tl.sum(x, axis=1)[:, None, :] + eps
        # Padding entries stay zero: a padded column's sum is eps alone, so they would grow by 1 / eps a step.
        g = tl.where(valid, (g - tl.sum(g * (x / s), axis=1)[:, None, :]) / s, 0.0)
        x = tl.load(scratch + (1 + 2 * it) * step + local)
        s = tl.sum(x, axis=2)[:, :, None] + eps
        g = tl.where(valid, (g - tl.sum(g * (x / s), axis=2)[:, :, None]) / s, 0.0)
    x = tl.load(scratch + local)
    s = tl.sum(x, axis=1)[:, None, :] + eps
    g = tl.where(valid, (g - tl.sum(g * (x / s), axis=1)[:, None, :]) / s, 0.0)
    dz = p * (g - tl.sum(g * p, axis=2)[:, :, None])
    tl.store(dlogits_ptr + offs, dz, mask=valid)

