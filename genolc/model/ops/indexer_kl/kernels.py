"""The Triton kernels of :mod:`genolc.model.ops.indexer_kl.triton` (what they compute is said there).

Imports Triton at import time: triton.py imports this module when the op first runs.
"""

import triton
import triton.language as tl

LOG_EPS = tl.constexpr(1e-10)
STATS = tl.constexpr(5)


@triton.jit
def _row_operands(q_ptr, w_ptr, b, t, sqb, sqt, sqh, swb, swt, HEADS: tl.constexpr, DIM: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The row's query heads ``[H, D]`` and head weights ``[H]`` in fp32 (zero past HEADS and DIM)."""
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    head_ok = heads < HEADS
    dim_ok = dims < DIM
    q = tl.load(q_ptr + b * sqb + t * sqt + heads[:, None] * sqh + dims[None, :],
                mask=head_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    w = tl.load(w_ptr + b * swb + t * swt + heads, mask=head_ok, other=0.0).to(tl.float32)
    return q, w, heads, dims, head_ok, dim_ok


@triton.jit
def _pool_scores(q, w, pooled_ptr, pooled_row0, stride_pp, idx_row, slots, n_slots, dims, dim_ok, softmax_scale,
                 KPOOL: tl.constexpr, PRECISION: tl.constexpr):
    """A block of one row's pool slots: the pool each holds (slot j's is its index row's entry ``j * KPOOL``
    divided by KPOOL; -1 for an empty slot, whose key is not read), their keys ``[P, D]`` (fp32), the per-head dots
    ``[H, P]``, the ReLU'd scaled dots (NaN kept) and the scores ``sum_h w[h] relu(scale dot[h])``."""
    first = tl.load(idx_row + slots * KPOOL, mask=slots < n_slots, other=-1).to(tl.int64)
    valid = first >= 0
    ids = tl.where(valid, first // KPOOL, 0)
    keys = tl.load(pooled_ptr + pooled_row0 + ids[:, None] * stride_pp + dims[None, :],
                   mask=valid[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    dots = tl.dot(q, tl.trans(keys), input_precision=PRECISION)
    activated = tl.maximum(dots * softmax_scale, 0.0, propagate_nan=tl.PropagateNan.ALL)
    return valid, ids, keys, dots, activated, tl.sum(w[:, None] * activated, axis=0)


@triton.jit
def sparse_kl_forward_kernel(q_ptr, w_ptr, pooled_ptr, idx_ptr, mass_ptr, scores_ptr, kl_ptr, stats_ptr,
                             softmax_scale, n_rows, n_slots,
                             sqb, sqt, sqh, swb, swt, spb, spp, sib, sit, smb, smt,
                             HEADS: tl.constexpr, DIM: tl.constexpr, KPOOL: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, PRECISION: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    q, w, heads, dims, head_ok, dim_ok = _row_operands(q_ptr, w_ptr, b, t, sqb, sqt, sqh, swb, swt, HEADS, DIM,
                                                       BLOCK_H, BLOCK_D)
    idx_row = idx_ptr + b * sib + t * sit
    mass_row = mass_ptr + b * smb + t * smt
    scores_row = scores_ptr + (b * n_rows + t) * n_slots
    m = tl.full((), float("-inf"), dtype=tl.float32)
    l = tl.zeros((), dtype=tl.float32)
    mass_sum = tl.zeros((), dtype=tl.float32)
    pools = tl.zeros((), dtype=tl.float32)
    for p0 in range(0, n_slots, BLOCK_P):
        slots = p0 + tl.arange(0, BLOCK_P)
        valid, _, _, _, _, scores = _pool_scores(q, w, pooled_ptr, b * spb, spp, idx_row, slots, n_slots, dims,
                                                 dim_ok, softmax_scale, KPOOL, PRECISION)
        # The row's scores go to a scratch row that this program reads back (from L2) in its second pass.
        tl.store(scores_row + slots, scores, mask=slots < n_slots)
        mass_sum += tl.sum(tl.load(mass_row + slots, mask=valid, other=0.0))
        pools += tl.sum(valid.to(tl.float32))
        masked = tl.where(valid, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(masked, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(masked - m_safe), axis=0)
        m = m_new
    has_pool = pools > 0.0
    # The log-sum-exp kept as m and log(l) (their sum rounds away a large score's low bits); for a row without a
    # pool m = 0 and log(l) = +inf, so every probability formed from them is exp(-inf) = 0. A NaN score makes l NaN.
    m = tl.where(has_pool, m, 0.0)
    log_l = tl.where(has_pool, tl.log(l), float("inf"))
    mass_norm = tl.maximum(mass_sum, 1.1754943508222875e-38)
    kl = tl.zeros((), dtype=tl.float32)
    spread = tl.zeros((), dtype=tl.float32)
    for p0 in range(0, n_slots, BLOCK_P):
        slots = p0 + tl.arange(0, BLOCK_P)
        in_row = slots < n_slots
        valid = tl.load(idx_row + slots * KPOOL, mask=in_row, other=-1) >= 0
        scores = tl.load(scores_row + slots, mask=in_row, other=0.0)
        target = tl.where(valid, tl.load(mass_row + slots, mask=valid, other=0.0) / mass_norm, 0.0)
        probs = tl.where(valid, tl.exp((scores - m) - log_l), 0.0)
        kl += tl.sum(tl.where(valid, target * (tl.log(target + LOG_EPS) - tl.log(probs + LOG_EPS)), 0.0), axis=0)
        spread += tl.sum(target * probs / (probs + LOG_EPS), axis=0)
    row = b * n_rows + t
    tl.store(kl_ptr + row, tl.where(has_pool, kl, 0.0))
    tl.store(stats_ptr + row * STATS, m)
    tl.store(stats_ptr + row * STATS + 1, log_l)
    tl.store(stats_ptr + row * STATS + 2, mass_norm)
    tl.store(stats_ptr + row * STATS + 3, spread)
    tl.store(stats_ptr + row * STATS + 4, pools)


@triton.jit
def sparse_kl_backward_kernel(grad_ptr, q_ptr, w_ptr, pooled_ptr, idx_ptr, mass_ptr, stats_ptr,
                              dq_ptr, dw_ptr, dpooled_ptr, softmax_scale, n_rows, n_slots,
                              sqb, sqt, sqh, swb, swt, spb, spp, sib, sit, smb, smt, sgb, sgt, sdpb, sdpp,
                              HEADS: tl.constexpr, DIM: tl.constexpr, KPOOL: tl.constexpr, BLOCK_H: tl.constexpr,
                              BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, PRECISION: tl.constexpr,
                              POOLED_GRAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    q, w, heads, dims, head_ok, dim_ok = _row_operands(q_ptr, w_ptr, b, t, sqb, sqt, sqh, swb, swt, HEADS, DIM,
                                                       BLOCK_H, BLOCK_D)
    row = b * n_rows + t
    m = tl.load(stats_ptr + row * STATS)
    log_l = tl.load(stats_ptr + row * STATS + 1)
    mass_norm = tl.load(stats_ptr + row * STATS + 2)
    spread = tl.load(stats_ptr + row * STATS + 3)
    grad = tl.load(grad_ptr + b * sgb + t * sgt).to(tl.float32)
    idx_row = idx_ptr + b * sib + t * sit
    mass_row = mass_ptr + b * smb + t * smt
    dq = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
    dw = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for p0 in range(0, n_slots, BLOCK_P):
        slots = p0 + tl.arange(0, BLOCK_P)
        # The forward's blocks of slots, so the scores come out bit for bit as they did there.
        valid, ids, keys, dots, activated, scores = _pool_scores(q, w, pooled_ptr, b * spb, spp, idx_row, slots,
                                                                 n_slots, dims, dim_ok, softmax_scale, KPOOL,
                                                                 PRECISION)
        target = tl.where(valid, tl.load(mass_row + slots, mask=valid, other=0.0) / mass_norm, 0.0)
        probs = tl.where(valid, tl.exp((scores - m) - log_l), 0.0)
        # d KL / d score_p = probs_p * sum_q u_q - u_p with u = target * probs / (probs + eps) (eps of the logs).
        d_scores = grad * (probs * spread - target * probs / (probs + LOG_EPS))
        dw += tl.sum(activated * d_scores[None, :], axis=1)
        d_dots = tl.where(dots * softmax_scale > 0.0, w[:, None] * d_scores[None, :] * softmax_scale, 0.0)
        dq += tl.dot(d_dots, keys, input_precision=PRECISION)
        if POOLED_GRAD:
            d_keys = tl.dot(tl.trans(d_dots), q, input_precision=PRECISION)
            tl.atomic_add(dpooled_ptr + b * sdpb + ids[:, None] * sdpp + dims[None, :], d_keys,
                          mask=valid[:, None] & dim_ok[None, :], sem="relaxed")
    tile = row * HEADS * DIM + heads[:, None] * DIM + dims[None, :]
    tl.store(dq_ptr + tile, dq.to(dq_ptr.dtype.element_ty), mask=head_ok[:, None] & dim_ok[None, :])
    tl.store(dw_ptr + row * HEADS + heads, dw.to(dw_ptr.dtype.element_ty), mask=head_ok)
