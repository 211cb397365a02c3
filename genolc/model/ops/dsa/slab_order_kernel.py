"""The Triton kernel of :func:`genolc.model.ops.dsa.slab_order.slab_order_triton` (what it computes is said there).

Imports Triton at import time: slab_order.py imports this module when the kernel first runs.
"""

import triton
import triton.language as tl


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _slab_keys(idx_ptr, start, offs, width, slab_rows, n_slabs):
    """A block of one index row: its entries, which lie inside the row, which are valid (non-negative), and each
    entry's slab (an index past the last slab counts in it; an empty slot's key is ``n_slabs``)."""
    inside = start + offs < width
    idx = tl.load(idx_ptr + start + offs, mask=inside, other=-1)
    valid = idx >= 0
    slab = tl.minimum(tl.where(valid, idx, 0) // slab_rows, n_slabs - 1).to(tl.int32)
    return idx, inside, valid, tl.where(valid, slab, n_slabs)


@triton.jit
def slab_order_kernel(idx_ptr, rows_ptr, offsets_ptr, seq_len, width, slab_rows, n_slabs, sib, sit,
                      BLOCK: tl.constexpr, BINS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    src = idx_ptr + b * sib + t * sit
    row = b * seq_len + t
    dst = rows_ptr + row * width
    offs = tl.arange(0, BLOCK)
    bins = tl.arange(0, BINS)

    # First read: the slots per slab, and whether the valid slots' slabs never fall along the row (they do not in
    # the Triton selector's ascending rows).
    counts = tl.zeros([BINS], tl.int32)
    n_valid = 0
    highest = -1
    falls = 0
    for start in range(0, width, BLOCK):
        idx, inside, valid, slab = _slab_keys(src, start, offs, width, slab_rows, n_slabs)
        counts += tl.histogram(slab, BINS, mask=valid)
        seen = tl.where(valid, slab, -1)
        running = tl.maximum(tl.associative_scan(seen, 0, _larger), highest)
        falls += tl.sum((valid & (slab < running)).to(tl.int32), axis=0)
        highest = tl.maximum(highest, tl.max(seen, axis=0))
        n_valid += tl.sum(valid.to(tl.int32), axis=0)
    starts = tl.cumsum(counts, axis=0) - counts
    tl.store(offsets_ptr + row * (n_slabs + 1) + bins, starts, mask=bins <= n_slabs)

    # Second read: each slot to its place. Where the slabs never fall, grouping by slab keeps the row's order, so
    # the valid slots are packed in order and the empty ones after them.
    if falls == 0:
        valid_before = 0
        empty_before = 0
        for start in range(0, width, BLOCK):
            idx, inside, valid, slab = _slab_keys(src, start, offs, width, slab_rows, n_slabs)
            empty = inside & ~valid
            valid_rank = tl.cumsum(valid.to(tl.int32), axis=0)
            empty_rank = tl.cumsum(empty.to(tl.int32), axis=0)
            dest = tl.where(valid, valid_before + valid_rank, n_valid + empty_before + empty_rank) - 1
            tl.store(dst + dest, idx.to(tl.int32), mask=inside)
            valid_before += tl.sum(valid.to(tl.int32), axis=0)
            empty_before += tl.sum(empty.to(tl.int32), axis=0)
    else:
        # Rows in any order: a stable counting sort, one scan of the block per slab.
        placed = tl.zeros([BINS], tl.int32)
        for start in range(0, width, BLOCK):
            idx, inside, valid, slab = _slab_keys(src, start, offs, width, slab_rows, n_slabs)
            dest = tl.full([BLOCK], -1, tl.int32)
            for s in range(0, n_slabs + 1):
                match = inside & (slab == s)
                base = tl.sum(tl.where(bins == s, starts + placed, 0), axis=0)
                dest = tl.where(match, base + tl.cumsum(match.to(tl.int32), axis=0) - 1, dest)
                placed += tl.where(bins == s, tl.sum(match.to(tl.int32), axis=0), 0)
            tl.store(dst + dest, idx.to(tl.int32), mask=inside)
