"""The Triton kernels of :func:`genolc.model.ops.indexer.triton_topk.top_pools` (the algorithm is described there).

Scores are compared as :func:`_ordered` int32 patterns throughout; ``LOWEST`` stands for "no score". Four launches
per score block: ``group_tops_kernel`` and ``candidates_kernel`` on every (row, segment), ``floors_kernel`` and
``select_kernel`` on every row.

Imports Triton at import time: :mod:`genolc.model.ops.indexer.triton_topk` imports this module when it first runs.
"""

import triton
import triton.language as tl

LOWEST = tl.constexpr(-2147483648)
NO_POOL = tl.constexpr(2147483647)
RADIX_BINS = tl.constexpr(256)
# Pool ids are below 2^24 (16M pools: 64M tokens at kpool 4): XOR with ID_MASK reverses their order, and their
# selection starts at bit 16.
ID_TOP_SHIFT = tl.constexpr(16)
ID_MASK = tl.constexpr((1 << 24) - 1)


@triton.jit
def _ordered(x):
    # fp32 -> int32 whose signed order is the floats' order: flip the magnitude bits of negative values.
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _visible(first_query, row, kpool, n_cols):
    return tl.minimum((first_query + row + 1) // kpool, n_cols)


@triton.jit
def _load_ordered(ptr, start, offs, n):
    inside = start + offs < n
    value = _ordered(tl.load(ptr + start + offs, mask=inside, other=0.0))
    return tl.where(inside, value, LOWEST), inside


@triton.jit
def group_tops_kernel(scores_ptr, tops_ptr, first_query, n_cols, kpool, stride_s, stride_t,
                      GROUPS: tl.constexpr, GROUP_ROWS: tl.constexpr, SEGMENT: tl.constexpr):
    """tops[row, segment] = the two best scores of each strided group (pool i in group i mod GROUPS) among the
    segment's causal pools: ``[2, GROUPS]``, best first."""
    row = tl.program_id(0)
    segment = tl.program_id(1)
    n = _visible(first_query, row, kpool, n_cols)
    seg_start = segment * SEGMENT
    if seg_start < n:
        scores = scores_ptr + row.to(tl.int64) * stride_s
        seg_end = tl.minimum(seg_start + SEGMENT, n)
        first = tl.full([GROUPS], LOWEST, tl.int32)
        second = tl.full([GROUPS], LOWEST, tl.int32)
        tile = tl.arange(0, GROUP_ROWS)[:, None] * GROUPS + tl.arange(0, GROUPS)[None, :]
        for start in range(seg_start, seg_end, GROUP_ROWS * GROUPS):
            inside = start + tile < seg_end
            value = tl.where(inside, _ordered(tl.load(scores + start + tile, mask=inside, other=0.0)), LOWEST)
            top = tl.max(value, axis=0)
            is_top = value == top[None, :]
            ties = tl.sum(is_top.to(tl.int32), axis=0)
            runner_up = tl.where(ties > 1, top, tl.max(tl.where(is_top, LOWEST, value), axis=0))
            second = tl.maximum(tl.minimum(first, top), tl.maximum(second, runner_up))
            first = tl.maximum(first, top)
        tops = tops_ptr + (row.to(tl.int64) * stride_t + segment * 2 * GROUPS)
        groups = tl.arange(0, GROUPS)
        tl.store(tops + groups, first)
        tl.store(tops + GROUPS + groups, second)


@triton.jit
def floors_kernel(tops_ptr, floors_ptr, counts_ptr, first_query, n_cols, kpool, stride_t,
                  GROUPS: tl.constexpr, SEGMENT: tl.constexpr):
    """Per row: the floor (the lowest group's second-best score); zeroes the row's two counters."""
    row = tl.program_id(0)
    n = _visible(first_query, row, kpool, n_cols)
    tops = tops_ptr + row.to(tl.int64) * stride_t
    groups = tl.arange(0, GROUPS)
    first = tl.full([GROUPS], LOWEST, tl.int32)
    second = tl.full([GROUPS], LOWEST, tl.int32)
    for segment in range(0, tl.cdiv(n, SEGMENT)):
        seg_first = tl.load(tops + segment * 2 * GROUPS + groups)
        seg_second = tl.load(tops + segment * 2 * GROUPS + GROUPS + groups)
        second = tl.maximum(tl.minimum(first, seg_first), tl.maximum(second, seg_second))
        first = tl.maximum(first, seg_first)
    tl.store(floors_ptr + row, tl.min(second, axis=0))
    tl.store(counts_ptr + 2 * row, 0)
    tl.store(counts_ptr + 2 * row + 1, 0)


@triton.jit
def candidates_kernel(scores_ptr, floors_ptr, counts_ptr, cand_vals_ptr, cand_ids_ptr, first_query, n_cols, kpool,
                      keep, stride_s, stride_c, BLOCK: tl.constexpr, SEGMENT: tl.constexpr, CAP: tl.constexpr):
    """Copies the segment's scores at or above the row's floor (and their pool ids) to the row's candidate slots,
    each slot taken with an atomic add on counts[row, 0]; counts[row, 1] gathers the scores above the floor."""
    row = tl.program_id(0)
    segment = tl.program_id(1)
    n = _visible(first_query, row, kpool, n_cols)
    seg_start = segment * SEGMENT
    if (seg_start < n) & (n > keep):
        scores = scores_ptr + row.to(tl.int64) * stride_s
        seg_end = tl.minimum(seg_start + SEGMENT, n)
        floor = tl.load(floors_ptr + row)
        cand_vals = cand_vals_ptr + row.to(tl.int64) * stride_c
        cand_ids = cand_ids_ptr + row.to(tl.int64) * stride_c
        offs = tl.arange(0, BLOCK)
        counter = counts_ptr + 2 * row + tl.zeros([BLOCK], tl.int32)
        ones = tl.full([BLOCK], 1, tl.int32)
        above = tl.zeros([BLOCK], tl.int32)
        for start in range(seg_start, seg_end, BLOCK):
            value, inside = _load_ordered(scores, start, offs, seg_end)
            passing = (value >= floor) & inside
            # One atomic add per passing score (about 2,000 of a row's, 1 in 65 at 128k pools): no reduction or
            # scan in the loop, which made it 2.7 times slower than the first read (bench_indexer_topk.py).
            slot = tl.atomic_add(counter, ones, mask=passing)
            tl.store(cand_vals + slot, value, mask=passing & (slot < CAP))
            tl.store(cand_ids + slot, start + offs, mask=passing & (slot < CAP))
            above += ((value > floor) & inside).to(tl.int32)
        tl.atomic_add(counts_ptr + 2 * row + 1, tl.sum(above, axis=0))


@triton.jit
def _radix_key(value):
    # An ordered int32 pattern as uint32 with the same order (the sign bit flipped).
    return (value ^ LOWEST).to(tl.uint32, bitcast=True)


@triton.jit
def _radix_digit(keys, match, prefix, need, shift: tl.constexpr):
    # One radix step of a k-th largest selection among ``keys`` (uint32) where ``match``: the digit at ``shift`` of
    # the ``need``-th largest matching key, with ``need`` lowered by the matching keys of larger digits and the digit
    # added to ``prefix``.
    hist = tl.histogram(((keys >> shift) & 0xFF).to(tl.int32), RADIX_BINS, mask=match)
    return _radix_choose(hist, prefix, need, shift)


@triton.jit
def _radix_choose(hist, prefix, need, shift: tl.constexpr):
    bins = tl.arange(0, RADIX_BINS)
    at_or_above = tl.cumsum(hist, axis=0, reverse=True)
    digit = tl.max(tl.where(at_or_above >= need, bins, -1), axis=0)
    need -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
    return prefix | (digit.to(tl.uint32) << shift), need


@triton.jit
def _above_prefix(keys, prefix, shift: tl.constexpr):
    # Whether each key's digits above ``shift`` equal the prefix's (every key, before the first digit is chosen).
    if shift >= 24:
        return keys == keys
    else:
        return (keys >> (shift + 8)) == (prefix >> (shift + 8))


@triton.jit
def _kth_largest(keys, valid, k, TOP_SHIFT: tl.constexpr):
    """(the ``k``-th largest of the ``valid`` uint32 ``keys``, how many valid keys are larger): a radix selection,
    8 bits a step from bit ``TOP_SHIFT`` down (every valid key's bits above ``TOP_SHIFT + 8`` must be zero), one
    histogram a step. At least ``k`` keys must be valid."""
    prefix = tl.zeros([], tl.uint32)
    need = k
    for step in tl.static_range(TOP_SHIFT // 8 + 1):
        prefix, need = _radix_digit(keys, valid & _above_prefix(keys, prefix, TOP_SHIFT - 8 * step), prefix, need,
                                    TOP_SHIFT - 8 * step)
    return prefix, k - need


@triton.jit
def _cut_over_row(scores, n, keep, BLOCK: tl.constexpr):
    # The keep-th largest score of the row and how many lie above it, for candidates that overflowed their slots:
    # the radix selection of _kth_largest with each step's histogram summed over the row (four reads of it).
    offs = tl.arange(0, BLOCK)
    prefix = tl.zeros([], tl.uint32)
    need = keep
    for step in tl.static_range(4):
        hist = tl.zeros([RADIX_BINS], tl.int32)
        for start in range(0, n, BLOCK):
            value, inside = _load_ordered(scores, start, offs, n)
            keys = _radix_key(value)
            hist += tl.histogram(((keys >> (24 - 8 * step)) & 0xFF).to(tl.int32), RADIX_BINS,
                                 mask=inside & _above_prefix(keys, prefix, 24 - 8 * step))
        prefix, need = _radix_choose(hist, prefix, need, 24 - 8 * step)
    return (prefix.to(tl.int32, bitcast=True) ^ LOWEST), keep - need


@triton.jit
def _write_row_pools(scores, n, cut, wanted_at_cut, keep, pools, BLOCK: tl.constexpr):
    # The kept pools straight from the row, ascending: above the cut, and the lowest-numbered ones at it.
    offs = tl.arange(0, BLOCK)
    written = 0
    seen_at_cut = 0
    for start in range(0, n, BLOCK):
        value, inside = _load_ordered(scores, start, offs, n)
        at_cut = (value == cut) & inside
        rank_at_cut = seen_at_cut + tl.cumsum(at_cut.to(tl.int32), axis=0)
        chosen = ((value > cut) & inside) | (at_cut & (rank_at_cut <= wanted_at_cut))
        slot = written + tl.cumsum(chosen.to(tl.int32), axis=0) - 1
        tl.store(pools + slot, start + offs, mask=chosen & (slot < keep))
        written += tl.sum(chosen.to(tl.int32), axis=0)
        seen_at_cut += tl.sum(at_cut.to(tl.int32), axis=0)


@triton.jit
def select_kernel(scores_ptr, floors_ptr, counts_ptr, cand_vals_ptr, cand_ids_ptr, pools_ptr, first_query, n_cols,
                  kpool, keep, stride_s, stride_c, stride_p,
                  KEEP_BLOCK: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr):
    """Per row: the cut among the candidates (in registers) or, when they overflowed, over the row; the kept pools
    in ascending order, -1 after them."""
    row = tl.program_id(0)
    n = _visible(first_query, row, kpool, n_cols)
    pools = pools_ptr + row.to(tl.int64) * stride_p
    slots = tl.arange(0, KEEP_BLOCK)
    if n <= keep:
        tl.store(pools + slots, tl.where(slots < n, slots, -1), mask=slots < keep)
    else:
        # Every path below writes exactly `keep` slots; the -1 fill first only keeps a slot that a fault left
        # unwritten from reading as a pool.
        tl.store(pools + slots, tl.full([KEEP_BLOCK], -1, tl.int32), mask=slots < keep)
        tl.debug_barrier()
        floor = tl.load(floors_ptr + row)
        copied = tl.load(counts_ptr + 2 * row)
        above = tl.load(counts_ptr + 2 * row + 1)
        if copied <= CAP:
            offs = tl.arange(0, CAP)
            valid = offs < copied
            cand_vals = cand_vals_ptr + row.to(tl.int64) * stride_c
            cand_ids = cand_ids_ptr + row.to(tl.int64) * stride_c
            value = tl.where(valid, tl.load(cand_vals + offs, mask=valid, other=LOWEST), LOWEST)
            pool = tl.load(cand_ids + offs, mask=valid, other=NO_POOL)
            # Fewer than keep scores above the floor: the floor is the cut.
            cut = floor
            count_above = above
            if above >= keep:
                cut_key, count_above = _kth_largest(_radix_key(value), valid, keep, 24)
                cut = cut_key.to(tl.int32, bitcast=True) ^ LOWEST
            # The slots were filled in whatever order the segments' atomics ran: among the scores at the cut keep
            # the lowest-numbered pools: the wanted-th smallest id is the wanted-th largest of id ^ ID_MASK.
            at_cut = valid & (value == cut)
            wanted_at_cut = keep - count_above
            last_pool = n
            if tl.sum(at_cut.to(tl.int32), axis=0) > wanted_at_cut:
                flipped, _ = _kth_largest((pool ^ ID_MASK).to(tl.uint32, bitcast=True), at_cut, wanted_at_cut,
                                          ID_TOP_SHIFT)
                last_pool = flipped.to(tl.int32, bitcast=True) ^ ID_MASK
            chosen = (valid & (value > cut)) | (at_cut & (pool <= last_pool))
            slot = tl.cumsum(chosen.to(tl.int32), axis=0) - 1
            tl.store(pools + slot, pool, mask=chosen & (slot < keep))
        else:
            scores = scores_ptr + row.to(tl.int64) * stride_s
            cut = floor
            count_above = above
            if above >= keep:
                cut, count_above = _cut_over_row(scores, n, keep, BLOCK)
            _write_row_pools(scores, n, cut, keep - count_above, keep, pools, BLOCK)
        tl.debug_barrier()
        kept = tl.load(pools + slots, mask=slots < keep, other=-1)
        kept = tl.sort(tl.where(kept < 0, NO_POOL, kept))
        tl.store(pools + slots, tl.where(kept == NO_POOL, -1, kept), mask=slots < keep)
