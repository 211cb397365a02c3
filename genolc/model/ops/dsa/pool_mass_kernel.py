"""The Triton kernel of :func:`genolc.model.ops.dsa.triton.sparse_pool_mass` (what it computes is said there).

Imports Triton at import time: dsa/triton.py imports this module when the pool mass first runs.
"""

import triton
import triton.language as tl


@triton.jit
def _slot_scores(q, c_ptr, row_ptr, c_offset, scs, slots, limit, ranks, rank_ok, softmax_scale,
                 PRECISION: tl.constexpr):
    """The scaled scores ``q @ C.T`` of a block of one index row's ``slots`` (its entries at ``row_ptr``; those at or
    past ``limit`` and the empty ones are not valid, their latent rows not read) and which slots are valid."""
    rows = tl.load(row_ptr + slots, mask=slots < limit, other=-1).to(tl.int64)
    valid = rows >= 0
    kv = tl.load(c_ptr + c_offset + tl.where(valid, rows, 0)[:, None] * scs + ranks[None, :],
                 mask=valid[:, None] & rank_ok[None, :], other=0.0)
    return valid, tl.dot(q, tl.trans(kv), input_precision=PRECISION) * softmax_scale


@triton.jit
def pool_mass_kernel(q_ptr, c_ptr, idx_ptr, lse_ptr, out_ptr, softmax_scale,
                     seq_len, scb, scs, sib, sit,
                     HEADS: tl.constexpr, RANK: tl.constexpr, WIDTH: tl.constexpr, TOPK: tl.constexpr,
                     KPOOL: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
                     PRECISION: tl.constexpr, HAS_LSE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    ranks = tl.arange(0, BLOCK_R)
    rank_ok = ranks < RANK
    row = b * seq_len + t
    index_row = idx_ptr + b * sib + t * sit
    pools_per_row: tl.constexpr = TOPK // KPOOL
    block_pools: tl.constexpr = BLOCK_W // KPOOL
    for h0 in range(0, HEADS, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)
        head_ok = heads < HEADS
        tile = row * HEADS * RANK + heads[:, None].to(tl.int64) * RANK + ranks[None, :]
        q = tl.load(q_ptr + tile, mask=head_ok[:, None] & rank_ok[None, :], other=0.0)
        if HAS_LSE:
            # The attention forward's own log-sum-exp over the row (+inf for an empty row): no first pass.
            lse = tl.load(lse_ptr + row * HEADS + heads, mask=head_ok, other=float("inf"))
        else:
            m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
            l = tl.zeros((BLOCK_H,), dtype=tl.float32)
            for w0 in range(0, WIDTH, BLOCK_W):
                valid, scores = _slot_scores(q, c_ptr, index_row, b * scb, scs, w0 + tl.arange(0, BLOCK_W), WIDTH,
                                             ranks, rank_ok, softmax_scale, PRECISION)
                scores = tl.where(valid[None, :], scores, float("-inf"))
                m_new = tl.maximum(m, tl.max(scores, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(scores - m_safe[:, None]), axis=1)
                m = m_new
            # +inf for padded heads and empty rows: every probability below is then exp(-inf) = 0.
            lse = tl.where((l > 0.0) & head_ok, m + tl.log(tl.where(l > 0.0, l, 1.0)), float("inf"))
        for w0 in range(0, TOPK, BLOCK_W):
            valid, scores = _slot_scores(q, c_ptr, index_row, b * scb, scs, w0 + tl.arange(0, BLOCK_W), TOPK, ranks,
                                         rank_ok, softmax_scale, PRECISION)
            probs = tl.where(valid[None, :], tl.exp(scores - lse[:, None]), 0.0)
            per_pool = tl.sum(tl.reshape(tl.sum(probs, axis=0), (block_pools, KPOOL)), axis=1)
            pools = w0 // KPOOL + tl.arange(0, block_pools)
            # This program owns the row: later head blocks add to what the earlier ones stored.
            target = out_ptr + row * pools_per_row + pools
            pool_ok = pools < pools_per_row
            tl.store(target, tl.load(target, mask=pool_ok, other=0.0) + per_pool, mask=pool_ok)
