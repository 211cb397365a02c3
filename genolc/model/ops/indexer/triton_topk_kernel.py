"""The Triton kernel of :func:`genolc.model.ops.indexer.triton_topk.top_pools` (its algorithm is described there).

Imports Triton at import time: :mod:`genolc.model.ops.indexer.triton_topk` imports this module when it first runs
the kernel.
"""

import triton
import triton.language as tl


@triton.jit
def _ordered(x):
    # fp32 -> int32 whose signed order is the floats' order: flip the magnitude bits of negative values.
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _load_ordered(ptr, start, offs, n, FROM_CANDIDATES: tl.constexpr):
    inside = start + offs < n
    if FROM_CANDIDATES:
        value = tl.load(ptr + start + offs, mask=inside, other=-2147483648)
    else:
        value = _ordered(tl.load(ptr + start + offs, mask=inside, other=0.0))
    return tl.where(inside, value, -2147483648), inside


@triton.jit
def _count_at_least(ptr, n, threshold, offs, BLOCK: tl.constexpr, FROM_CANDIDATES: tl.constexpr):
    count = 0
    for start in range(0, n, BLOCK):
        value, inside = _load_ordered(ptr, start, offs, n, FROM_CANDIDATES)
        count += tl.sum(((value >= threshold) & inside).to(tl.int32), axis=0)
    return count


@triton.jit
def _select(vals, ids, n, lo, hi, count_hi, keep, pools, offs, BLOCK: tl.constexpr,
            FROM_CANDIDATES: tl.constexpr):
    # Invariant: at least `keep` scores >= lo, count_hi (< keep) scores >= hi.
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        count = _count_at_least(vals, n, mid, offs, BLOCK, FROM_CANDIDATES)
        if count >= keep:
            lo = mid
        else:
            hi = mid
            count_hi = count
    cut = lo
    wanted_at_cut = keep - count_hi
    written = 0
    seen_at_cut = 0
    for start in range(0, n, BLOCK):
        value, inside = _load_ordered(vals, start, offs, n, FROM_CANDIDATES)
        at_cut = (value == cut) & inside
        rank_at_cut = seen_at_cut + tl.cumsum(at_cut.to(tl.int32), axis=0)
        chosen = ((value > cut) & inside) | (at_cut & (rank_at_cut <= wanted_at_cut))
        slot = written + tl.cumsum(chosen.to(tl.int32), axis=0) - 1
        if FROM_CANDIDATES:
            pool = tl.load(ids + start + offs, mask=chosen, other=-1)
        else:
            pool = start + offs
        tl.store(pools + slot, pool, mask=chosen & (slot < keep))
        written += tl.sum(chosen.to(tl.int32), axis=0)
        seen_at_cut += tl.sum(at_cut.to(tl.int32), axis=0)


@triton.jit
def top_pools_kernel(scores_ptr, pools_ptr, cand_vals_ptr, cand_ids_ptr, first_query, n_cols, kpool, keep,
                     stride_s, stride_p, stride_c,
                     KEEP_BLOCK: tl.constexpr, GROUPS: tl.constexpr, GROUP_ROWS: tl.constexpr,
                     BLOCK: tl.constexpr, CAP: tl.constexpr):
    row = tl.program_id(0)
    n = tl.minimum((first_query + row + 1) // kpool, n_cols)
    scores = scores_ptr + row.to(tl.int64) * stride_s
    pools = pools_ptr + row.to(tl.int64) * stride_p
    slots = tl.arange(0, KEEP_BLOCK)
    if n <= keep:
        tl.store(pools + slots, tl.where(slots < n, slots, -1), mask=slots < keep)
    else:
        # A row whose scores do not give `keep` distinct ordered values (NaNs) keeps fewer: -1 first.
        tl.store(pools + slots, tl.full([KEEP_BLOCK], -1, tl.int32), mask=slots < keep)
        lowest = -2147483648
        first = tl.full([GROUPS], lowest, tl.int32)
        second = tl.full([GROUPS], lowest, tl.int32)
        tile = tl.arange(0, GROUP_ROWS)[:, None] * GROUPS + tl.arange(0, GROUPS)[None, :]
        for start in range(0, n, GROUP_ROWS * GROUPS):
            inside = start + tile < n
            value = tl.where(inside, _ordered(tl.load(scores + start + tile, mask=inside, other=0.0)), lowest)
            top = tl.max(value, axis=0)
            is_top = value == top[None, :]
            ties = tl.sum(is_top.to(tl.int32), axis=0)
            runner_up = tl.where(ties > 1, top, tl.max(tl.where(is_top, lowest, value), axis=0))
            second = tl.maximum(tl.minimum(first, top), tl.maximum(second, runner_up))
            first = tl.maximum(first, top)
        floor = tl.min(second, axis=0)
        highest = tl.max(first, axis=0)

        offs = tl.arange(0, BLOCK)
        cand_vals = cand_vals_ptr + row.to(tl.int64) * stride_c
        cand_ids = cand_ids_ptr + row.to(tl.int64) * stride_c
        copied = 0
        above = 0
        for start in range(0, n, BLOCK):
            value, inside = _load_ordered(scores, start, offs, n, False)
            passing = (value >= floor) & inside
            slot = copied + tl.cumsum(passing.to(tl.int32), axis=0) - 1
            tl.store(cand_vals + slot, value, mask=passing & (slot < CAP))
            tl.store(cand_ids + slot, start + offs, mask=passing & (slot < CAP))
            copied += tl.sum(passing.to(tl.int32), axis=0)
            above += tl.sum(((value > floor) & inside).to(tl.int32), axis=0)
        # The candidates were written by other threads of this program; the -1 fill must land before the ids.
        tl.debug_barrier()

        lo = floor.to(tl.int64)
        hi = highest.to(tl.int64) + 1
        count_hi = 0
        if above < keep:
            hi = lo + 1
            count_hi = above
        if copied <= CAP:
            _select(cand_vals, cand_ids, copied, lo, hi, count_hi, keep, pools, offs, BLOCK, True)
        else:
            _select(scores, scores, n, lo, hi, count_hi, keep, pools, offs, BLOCK, False)
