"""The Triton kernels of :mod:`genolc.model.ops.indexer_kl.triton` (what they compute is said there).

Imports Triton at import time: triton.py imports this module when the op first runs.
"""

import triton
import triton.language as tl

LOG_EPS = tl.constexpr(1e-10)


@triton.jit
def _pool_scores(q, w, pooled_ptr, pooled_row0, stride_pp, pools_ptr, slots, n_slots, dims, dim_ok, softmax_scale):
    """A block of one row's pool slots: which hold a pool, their keys ``[P, D]`` (fp32, zero where empty), the
    per-head dots ``[H, P]`` and the ReLU'd scaled dots, and the scores ``sum_h w[h] relu(scale dot[h])``."""
    ids = tl.load(pools_ptr + slots, mask=slots < n_slots, other=-1).to(tl.int64)
    valid = ids >= 0
    keys = tl.load(pooled_ptr + pooled_row0 + tl.where(valid, ids, 0)[:, None] * stride_pp + dims[None, :],
                   mask=valid[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    dots = tl.dot(q, tl.trans(keys), input_precision="ieee")
    activated = tl.maximum(dots * softmax_scale, 0.0)
    return valid, keys, dots, activated, tl.sum(w[:, None] * activated, axis=0)


@triton.jit
def _row_operands(q_ptr, w_ptr, b, t, sqb, sqt, sqh, swb, swt, heads, dims, head_ok, dim_ok):
    q = tl.load(q_ptr + b * sqb + t * sqt + heads[:, None] * sqh + dims[None, :],
                mask=head_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    w = tl.load(w_ptr + b * swb + t * swt + heads, mask=head_ok, other=0.0).to(tl.float32)
    return q, w


@triton.jit
def sparse_kl_forward_kernel(q_ptr, w_ptr, pooled_ptr, pools_ptr, mass_ptr, scores_ptr, kl_ptr, stats_ptr,
                             softmax_scale, n_rows, n_slots,
                             sqb, sqt, sqh, swb, swt, spb, spp, sib, sit, smb, smt,
                             HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                             BLOCK_P: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    head_ok = heads < HEADS
    dim_ok = dims < DIM
    q, w = _row_operands(q_ptr, w_ptr, b, t, sqb, sqt, sqh, swb, swt, heads, dims, head_ok, dim_ok)
    pools_row = pools_ptr + b * sib + t * sit
    mass_row = mass_ptr + b * smb + t * smt
    scores_row = scores_ptr + (b * n_rows + t) * n_slots
    m = tl.full((), float("-inf"), dtype=tl.float32)
    l = tl.zeros((), dtype=tl.float32)
    mass_sum = tl.zeros((), dtype=tl.float32)
    for p0 in range(0, n_slots, BLOCK_P):
        slots = p0 + tl.arange(0, BLOCK_P)
        valid, _, _, _, scores = _pool_scores(q, w, pooled_ptr, b * spb, spp, pools_row, slots, n_slots, dims,
                                              dim_ok, softmax_scale)
        # The row's scores go to a scratch row that this program reads back (from L2) in its second pass.
        tl.store(scores_row + slots, scores, mask=slots < n_slots)
        mass_sum += tl.sum(tl.load(mass_row + slots, mask=valid, other=0.0))
        masked = tl.where(valid, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(masked, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(masked - m_safe), axis=0)
        m = m_new
    has_pool = l > 0.0
    # +inf for a row without a pool: every probability the backward forms from it is exp(-inf) = 0.
    lse = tl.where(has_pool, m + tl.log(tl.where(has_pool, l, 1.0)), float("inf"))
    mass_norm = tl.maximum(mass_sum, 1.1754943508222875e-38)
    kl = tl.zeros((), dtype=tl.float32)
    spread = tl.zeros((), dtype=tl.float32)
    for p0 in range(0, n_slots, BLOCK_P):
        slots = p0 + tl.arange(0, BLOCK_P)
        in_row = slots < n_slots
        valid = tl.load(pools_row + slots, mask=in_row, other=-1) >= 0
        scores = tl.load(scores_row + slots, mask=in_row, other=0.0)
        target = tl.where(valid, tl.load(mass_row + slots, mask=valid, other=0.0) / mass_norm, 0.0)
        probs = tl.where(valid, tl.exp(scores - lse), 0.0)
        kl += tl.sum(tl.where(valid, target * (tl.log(target + LOG_EPS) - tl.log(probs + LOG_EPS)), 0.0), axis=0)
        spread += tl.sum(target * probs / (probs + LOG_EPS), axis=0)
    row = b * n_rows + t
    tl.store(kl_ptr + row, tl.where(has_pool, kl, 0.0))
    tl.store(stats_ptr + row * 3, lse)
    tl.store(stats_ptr + row * 3 + 1, mass_norm)
    tl.store(stats_ptr + row * 3 + 2, spread)


@triton.jit
def sparse_kl_backward_kernel(grad_ptr, q_ptr, w_ptr, pooled_ptr, pools_ptr, mass_ptr, stats_ptr,
                              dq_ptr, dw_ptr, dpooled_ptr, softmax_scale, n_rows, n_slots,
                              sqb, sqt, sqh, swb, swt, spb, spp, sib, sit, smb, smt, sgb, sgt, sdpb, sdpp,
                              HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                              BLOCK_P: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    head_ok = heads < HEADS
    dim_ok = dims < DIM
    q, w = _row_operands(q_ptr, w_ptr, b, t, sqb, sqt, sqh, swb, swt, heads, dims, head_ok, dim_ok)
    row = b * n_rows + t
    lse = tl.load(stats_ptr + row * 3)
    mass_norm = tl.load(stats_ptr + row * 3 + 1)
    spread = tl.load(stats_ptr + row * 3 + 2)
    grad = tl.load(grad_ptr + b * sgb + t * sgt).to(tl.float32)
    # A row without a pool has lse = +inf: its probabilities, and so every gradient below, are 0.
    pools_row = pools_ptr + b * sib + t * sit
    mass_row = mass_ptr + b * smb + t * smt
    dq = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
    dw = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for p0 in range(0, n_slots, BLOCK_P):
        slots = p0 + tl.arange(0, BLOCK_P)
        valid, keys, dots, activated, scores = _pool_scores(q, w, pooled_ptr, b * spb, spp, pools_row, slots,
                                                            n_slots, dims, dim_ok, softmax_scale)
        target = tl.where(valid, tl.load(mass_row + slots, mask=valid, other=0.0) / mass_norm, 0.0)
        probs = tl.where(valid, tl.exp(scores - lse), 0.0)
        # d KL / d score_p = probs_p * sum_q u_q - u_p with u = target * probs / (probs + eps) (eps of the logs).
        d_scores = grad * (probs * spread - target * probs / (probs + LOG_EPS))
        dw += tl.sum(activated * d_scores[None, :], axis=1)
        d_dots = tl.where(dots * softmax_scale > 0.0, w[:, None] * d_scores[None, :] * softmax_scale, 0.0)
        dq += tl.dot(d_dots, keys, input_precision="ieee")
        d_keys = tl.dot(tl.trans(d_dots), q, input_precision="ieee")
        ids = tl.load(pools_row + slots, mask=slots < n_slots, other=-1).to(tl.int64)
        tl.atomic_add(dpooled_ptr + b * sdpb + tl.where(valid, ids, 0)[:, None] * sdpp + dims[None, :], d_keys,
                      mask=valid[:, None] & dim_ok[None, :], sem="relaxed")
    tile = row * HEADS * DIM + heads[:, None] * DIM + dims[None, :]
    tl.store(dq_ptr + tile, dq.to(dq_ptr.dtype.element_ty), mask=head_ok[:, None] & dim_ok[None, :])
    tl.store(dw_ptr + row * HEADS + heads, dw.to(dw_ptr.dtype.element_ty), mask=head_ok)
