"""The indexer's Triton kernels: the scoring of a query chunk's pools (``pool_score_kernel``, launched by
:func:`genolc.model.ops.indexer.triton.pool_score_block`) and those of
:func:`genolc.model.ops.indexer.triton_topk.top_pools` (the algorithm is described there).

Scores are compared as :func:`_ordered` int32 patterns throughout; ``LOWEST`` stands for "no score". Four launches per
score block (three with the tops from the scoring): ``group_tops_kernel`` and ``candidates_kernel`` on every (row,
segment), ``floors_kernel`` and ``select_kernel`` on every row. ``score_group_tops_kernel`` writes the same block as
the scoring kernel and the groups' two best scores as it scores, in place of ``group_tops_kernel``
(triton.streamed_select, with ``triton.SCORE_GROUP_TOPS``).

Imports Triton at import time: :mod:`genolc.model.ops.indexer.triton` and ``triton_topk`` import this module when
they first run.
"""

import triton
import triton.language as tl

LOWEST = tl.constexpr(-2147483648)
NO_POOL = tl.constexpr(2147483647)
RADIX_BINS = tl.constexpr(256)


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
def _run_keys(pooled_ptr, pools, dims, n_pools, stride_pp, DIM: tl.constexpr):
    # The pool keys of a tile's columns, [D, N].
    return tl.load(pooled_ptr + pools[None, :] * stride_pp + dims[:, None],
                   mask=(pools[None, :] < n_pools) & (dims[:, None] < DIM), other=0.0)


@triton.jit
def _head_operands(q_ptr, w_ptr, rows, row_ok, dims, head, stride_qt, stride_qh, stride_wt, DIM: tl.constexpr):
    # One head's query tile [M, D] and weight column [M, 1].
    queries = tl.load(q_ptr + rows[:, None].to(tl.int64) * stride_qt + head * stride_qh + dims[None, :],
                      mask=row_ok[:, None] & (dims[None, :] < DIM), other=0.0)
    weight = tl.load(w_ptr + rows.to(tl.int64) * stride_wt + head, mask=row_ok, other=0.0)
    return queries, weight[:, None]


@triton.jit
def _head_scores(queries, keys, weight, softmax_scale, IEEE: tl.constexpr):
    # One head's share of a tile's scores: w * relu(scale * q . k).
    if IEEE:
        dots = tl.dot(queries, keys, input_precision="ieee")
    else:
        dots = tl.dot(queries, keys)
    return weight * tl.maximum(dots * softmax_scale, 0.0)


@triton.jit
def pool_score_kernel(q_ptr, w_ptr, pooled_ptr, out_ptr, q0, n_queries, n_pools, kpool, softmax_scale,
                      stride_qt, stride_qh, stride_wt, stride_pp, stride_ot,
                      HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)            # query rows inside the chunk
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)            # pool ids
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < n_queries
    col_ok = cols < n_pools
    visible = (q0 + rows + 1) // kpool                         # complete causal pools per query
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Tiles wholly past every row's causal horizon only need their -inf fill.
    first_col = pid_n * BLOCK_N
    last_visible = (q0 + tl.minimum(pid_m * BLOCK_M + BLOCK_M, n_queries)) // kpool
    if first_col < last_visible:
        keys = _run_keys(pooled_ptr, cols, dims, n_pools, stride_pp, DIM)
        # A rolled loop: unrolled (tl.static_range), the eight heads' query tiles were all loaded up front and the
        # kernel spilled 2.5 KB a thread at 64 x 128 tiles (tests/gpu/triton_lowering_check.py).
        for head in range(HEADS):
            queries, weight = _head_operands(q_ptr, w_ptr, rows, row_ok, dims, head, stride_qt, stride_qh, stride_wt,
                                             DIM)
            acc += _head_scores(queries, keys, weight, softmax_scale, IEEE)
    acc = tl.where(cols[None, :] < visible[:, None], acc, float("-inf"))
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_ot + cols[None, :], acc,
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _finish_run(first, second, row_ptr, pools, acc, visible, row_ok, n_pools):
    # Stores one run's scores (-inf where not causal) and returns the two best of each (row, group) so far, given
    # the run's one score each: equal scores fill both places.
    causal = (pools[None, :] < visible[:, None]) & (pools[None, :] < n_pools) & row_ok[:, None]
    tl.store(row_ptr + pools[None, :], tl.where(causal, acc, float("-inf")),
             mask=row_ok[:, None] & (pools[None, :] < n_pools))
    value = tl.where(causal, _ordered(acc), LOWEST)
    return tl.maximum(first, value), tl.maximum(second, tl.minimum(first, value))


@triton.jit
def score_group_tops_kernel(q_ptr, w_ptr, pooled_ptr, out_ptr, tops_ptr, q0, n_queries, n_pools, kpool,
                            softmax_scale, stride_qt, stride_qh, stride_wt, stride_pp, stride_ot, stride_t,
                            HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                            GROUPS: tl.constexpr, GROUP_BLOCK: tl.constexpr, SEGMENT: tl.constexpr,
                            IEEE: tl.constexpr):
    """The scoring kernel's block (the same scores, -inf where not causal) and, for the same rows,
    ``group_tops_kernel``'s output. One program per (rows, ``GROUP_BLOCK`` groups, segment) walks its segment four
    pools of each of its groups a step (pool ``i`` in group ``i mod GROUPS``): four ``GROUP_BLOCK``-pool runs,
    ``GROUPS`` apart, each its own product and accumulator (one [rows, 4 runs] tile reshaped for the groups' maxima
    spilled: tests/gpu/triton_lowering_check.py), and each group's two best scores are kept in registers across the
    steps. The block is then read once (candidates) instead of twice."""
    pid_m = tl.program_id(0)
    pid_g = tl.program_id(1)
    segment = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_queries
    visible = (q0 + rows + 1) // kpool
    last_visible = (q0 + tl.minimum(pid_m * BLOCK_M + BLOCK_M, n_queries)) // kpool
    groups = pid_g * GROUP_BLOCK + tl.arange(0, GROUP_BLOCK)
    dims = tl.arange(0, BLOCK_D)
    first = tl.full([BLOCK_M, GROUP_BLOCK], LOWEST, tl.int32)
    second = tl.full([BLOCK_M, GROUP_BLOCK], LOWEST, tl.int32)
    row_ptr = out_ptr + rows[:, None].to(tl.int64) * stride_ot
    seg_start = segment * SEGMENT
    for start in range(seg_start, tl.minimum(seg_start + SEGMENT, n_pools), 4 * GROUPS):
        pools0 = start + groups
        pools1 = pools0 + GROUPS
        pools2 = pools1 + GROUPS
        pools3 = pools2 + GROUPS
        acc0 = tl.zeros((BLOCK_M, GROUP_BLOCK), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_M, GROUP_BLOCK), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, GROUP_BLOCK), dtype=tl.float32)
        acc3 = tl.zeros((BLOCK_M, GROUP_BLOCK), dtype=tl.float32)
        # Steps wholly past every row's causal horizon only need their -inf fill (and leave the tops as they are).
        # The test is per step: on the causal diagonal up to three of a step's runs are scored past the horizon.
        if start < last_visible:
            keys0 = _run_keys(pooled_ptr, pools0, dims, n_pools, stride_pp, DIM)
            keys1 = _run_keys(pooled_ptr, pools1, dims, n_pools, stride_pp, DIM)
            keys2 = _run_keys(pooled_ptr, pools2, dims, n_pools, stride_pp, DIM)
            keys3 = _run_keys(pooled_ptr, pools3, dims, n_pools, stride_pp, DIM)
            for head in range(HEADS):
                queries, weight = _head_operands(q_ptr, w_ptr, rows, row_ok, dims, head, stride_qt, stride_qh,
                                                 stride_wt, DIM)
                acc0 += _head_scores(queries, keys0, weight, softmax_scale, IEEE)
                acc1 += _head_scores(queries, keys1, weight, softmax_scale, IEEE)
                acc2 += _head_scores(queries, keys2, weight, softmax_scale, IEEE)
                acc3 += _head_scores(queries, keys3, weight, softmax_scale, IEEE)
        first, second = _finish_run(first, second, row_ptr, pools0, acc0, visible, row_ok, n_pools)
        first, second = _finish_run(first, second, row_ptr, pools1, acc1, visible, row_ok, n_pools)
        first, second = _finish_run(first, second, row_ptr, pools2, acc2, visible, row_ok, n_pools)
        first, second = _finish_run(first, second, row_ptr, pools3, acc3, visible, row_ok, n_pools)
    tops = tops_ptr + rows[:, None].to(tl.int64) * stride_t + segment * 2 * GROUPS + groups[None, :]
    tl.store(tops, first, mask=row_ok[:, None])
    tl.store(tops + GROUPS, second, mask=row_ok[:, None])


@triton.jit
def floors_kernel(tops_ptr, floors_ptr, counts_ptr, first_query, n_cols, kpool, keep, stride_t,
                  GROUPS: tl.constexpr, SEGMENT: tl.constexpr):
    """Per row: floor (the ``keep``-th largest of the groups' two best scores), highest score; zeroes the row's two
    counters."""
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
    # A bisection over the ordered patterns: count(>= lo) >= keep > count(>= hi). The 2 G tops are scores of
    # distinct pools, so at least `keep` of the row's scores lie at or above the floor.
    lo = tl.min(second, axis=0).to(tl.int64)
    hi = tl.max(first, axis=0).to(tl.int64) + 1
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        count = tl.sum((first >= mid).to(tl.int32) + (second >= mid).to(tl.int32), axis=0)
        if count >= keep:
            lo = mid
        else:
            hi = mid
    tl.store(floors_ptr + 2 * row, lo.to(tl.int32))
    tl.store(floors_ptr + 2 * row + 1, tl.max(first, axis=0))
    tl.store(counts_ptr + 2 * row, 0)
    tl.store(counts_ptr + 2 * row + 1, 0)


@triton.jit
def _segment_block(scores, start, offs, seg_end):
    # A block of the row's scores as stored (fp32), 0.0 past the segment's end (``_take_candidates`` masks those).
    return tl.load(scores + start + offs, mask=start + offs < seg_end, other=0.0)


@triton.jit
def _take_candidates(block, start, offs, seg_end, floor, counter, cand_vals, cand_ids, above, CAP: tl.constexpr):
    # One block's scores at or above the floor into the row's slots (``counter``: the row's slot count); returns
    # the count above the floor so far.
    inside = start + offs < seg_end
    value = _ordered(block)
    passing = (value >= floor) & inside
    # One atomic add per passing score (about 600 of a row's on random features, 1 in 220 at 128k pools): no
    # reduction or scan in the loop, which made it 2.7 times slower than the first read (bench_indexer_topk.py).
    # Relaxed: only the select kernel reads the slots, after this launch; Triton's default (acq_rel) fences each.
    slot = tl.atomic_add(counter + tl.zeros_like(offs), tl.full(offs.shape, 1, tl.int32), mask=passing,
                         sem="relaxed")
    tl.store(cand_vals + slot, value, mask=passing & (slot < CAP))
    tl.store(cand_ids + slot, start + offs, mask=passing & (slot < CAP))
    return above + ((value > floor) & inside).to(tl.int32)


@triton.jit
def candidates_kernel(scores_ptr, floors_ptr, counts_ptr, cand_vals_ptr, cand_ids_ptr, first_query, n_cols, kpool,
                      keep, stride_s, stride_c, BLOCK: tl.constexpr, SEGMENT: tl.constexpr, CAP: tl.constexpr,
                      PREFETCH: tl.constexpr):
    """Copies the segment's scores at or above the row's floor (and their pool ids) to the row's candidate slots,
    each slot taken with an atomic add on counts[row, 0]; counts[row, 1] gathers the scores above the floor.
    ``PREFETCH``: each step loads the next block's scores before it takes its own block's slots."""
    row = tl.program_id(0)
    segment = tl.program_id(1)
    n = _visible(first_query, row, kpool, n_cols)
    seg_start = segment * SEGMENT
    if (seg_start < n) & (n > keep):
        scores = scores_ptr + row.to(tl.int64) * stride_s
        seg_end = tl.minimum(seg_start + SEGMENT, n)
        floor = tl.load(floors_ptr + 2 * row)
        cand_vals = cand_vals_ptr + row.to(tl.int64) * stride_c
        cand_ids = cand_ids_ptr + row.to(tl.int64) * stride_c
        counter = counts_ptr + 2 * row
        offs = tl.arange(0, BLOCK)
        above = tl.zeros([BLOCK], tl.int32)
        if PREFETCH:
            # A block with a passing score waits for its slot to come back from the L2 before its stores. Loaded
            # ahead, the next block's scores arrive during that wait instead of after it (the last step's load is
            # masked off whole: nothing is read past the segment).
            block = _segment_block(scores, seg_start, offs, seg_end)
            for start in range(seg_start, seg_end, BLOCK):
                next_block = _segment_block(scores, start + BLOCK, offs, seg_end)
                above = _take_candidates(block, start, offs, seg_end, floor, counter, cand_vals, cand_ids, above,
                                         CAP)
                block = next_block
        else:
            for start in range(seg_start, seg_end, BLOCK):
                above = _take_candidates(_segment_block(scores, start, offs, seg_end), start, offs, seg_end, floor,
                                         counter, cand_vals, cand_ids, above, CAP)
        tl.atomic_add(counts_ptr + 2 * row + 1, tl.sum(above, axis=0), sem="relaxed")


@triton.jit
def _radix_key(value):
    # An ordered int32 pattern as uint32 with the same order (the sign bit flipped).
    return (value ^ LOWEST).to(tl.uint32, bitcast=True)


@triton.jit
def _radix_choose(hist, prefix, need, shift: tl.constexpr):
    # One step of a k-th largest radix selection from the step's histogram of the digit at ``shift`` (over the keys
    # that match ``prefix`` above it): the digit of the ``need``-th largest of them joins the prefix, and ``need``
    # drops by the keys of larger digits.
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
def _cut_over_row(scores, n, keep, BLOCK: tl.constexpr):
    # The keep-th largest score of the row and how many lie above it, for candidates that overflowed their slots:
    # a radix selection, 8 bits a step from the top, each step's 256-bin histogram summed over a read of the row
    # (four reads, where a bisection read the row once per step, up to 32 times).
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
        floor = tl.load(floors_ptr + 2 * row)
        highest = tl.load(floors_ptr + 2 * row + 1)
        copied = tl.load(counts_ptr + 2 * row)
        above = tl.load(counts_ptr + 2 * row + 1)
        lo = floor.to(tl.int64)
        hi = highest.to(tl.int64) + 1
        count_hi = 0
        if above < keep:
            hi = lo + 1
            count_hi = above
        if copied <= CAP:
            offs = tl.arange(0, CAP)
            valid = offs < copied
            cand_vals = cand_vals_ptr + row.to(tl.int64) * stride_c
            cand_ids = cand_ids_ptr + row.to(tl.int64) * stride_c
            value = tl.where(valid, tl.load(cand_vals + offs, mask=valid, other=LOWEST), LOWEST)
            pool = tl.load(cand_ids + offs, mask=valid, other=NO_POOL)
            while hi - lo > 1:
                mid = lo + (hi - lo) // 2
                count = tl.sum((valid & (value >= mid)).to(tl.int32), axis=0)
                if count >= keep:
                    lo = mid
                else:
                    hi = mid
                    count_hi = count
            # The slots were filled in whatever order the segments' atomics ran: among the scores at the cut keep
            # the lowest-numbered pools, found by a second bisection over the pool ids.
            at_cut = valid & (value == lo)
            wanted_at_cut = keep - count_hi
            last_pool = n
            if tl.sum(at_cut.to(tl.int32), axis=0) > wanted_at_cut:
                id_lo = -1
                while last_pool - id_lo > 1:
                    id_mid = id_lo + (last_pool - id_lo) // 2
                    if tl.sum((at_cut & (pool <= id_mid)).to(tl.int32), axis=0) >= wanted_at_cut:
                        last_pool = id_mid
                    else:
                        id_lo = id_mid
            chosen = (valid & (value > lo)) | (at_cut & (pool <= last_pool))
            slot = tl.cumsum(chosen.to(tl.int32), axis=0) - 1
            tl.store(pools + slot, pool, mask=chosen & (slot < keep))
        else:
            scores = scores_ptr + row.to(tl.int64) * stride_s
            cut = floor
            if above >= keep:
                cut, count_hi = _cut_over_row(scores, n, keep, BLOCK)
            _write_row_pools(scores, n, cut, keep - count_hi, keep, pools, BLOCK)
        tl.debug_barrier()
        kept = tl.load(pools + slots, mask=slots < keep, other=-1)
        kept = tl.sort(tl.where(kept < 0, NO_POOL, kept))
        tl.store(pools + slots, tl.where(kept == NO_POOL, -1, kept), mask=slots < keep)
