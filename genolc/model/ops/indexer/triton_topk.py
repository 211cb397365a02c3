"""The indexer's selection on the GPU: each query's best pools out of its score row, in four Triton launches (three
where the scoring kernel has written the first read's result: ``tops_ready``).

:func:`top_pools` takes the ``[Cq, P]`` fp32 score block of :func:`genolc.model.ops.indexer.triton.pool_score_block`
and writes, per row ``t``, the ids of the ``keep`` best of the row's first ``n_t = min((first_query + t + 1) // kpool,
P)`` scores (its complete causal pools; nothing past them is read), in ascending pool order, -1 after them. It replaces
``torch.topk`` over the whole block, whose radix select read every row, causal or not, in four passes and a gather
(1.8 s of a `base` step at 512k, benchmarks/results/training_speed_2026-12-01.md).

Scores are compared as their ordered bit patterns (-0.0 ranks just below +0.0; NaNs above +inf or below -inf by
their sign, where ``torch.topk`` ranks every NaN highest). Rows are cut into segments of ``SEGMENT`` pools, one
program each, so that a block of a thousand long rows still fills the GPU (one program per row was latency-bound:
slower than ``torch.topk`` at 1M, benchmarks/results/indexer_topk_2026-12-02/):

1. One read (every row and segment): the two largest scores of each of ``G`` strided groups (pool ``i`` is in
   group ``i mod G``, ``G`` the power of two at or above ``keep``); per row the groups' tops over all segments are
   merged, and the ``keep``-th largest of those ``2 G`` scores of distinct pools, the floor (a bisection over them),
   has at least ``keep`` scores at or above it.
2. A second read copies every score at or above the floor, with its pool id, to the row's ``CAP`` candidate slots
   (each slot taken by an atomic add). On the benchmark's scores (random features, ``keep`` 512) about 1.2 ``keep``
   of a row's pass; the cap is 8 ``keep``. The floor was the lowest of ``keep / 2`` groups' second-largest scores
   until 2026-12-03: about 4 ``keep`` passed, and about one row in a thousand overflowed its slots. This read is
   the slower: 0.51 ms against the first read's 0.37 on a 512k block, 0.47 against 0.31 at 1M (2.1 against 2.9
   TB/s at 512k; benchmarks/results/indexer_scoring_2026-12-03/call3_5233a82/topk.log). There its time followed the
   warps an SM holds rather than the bytes in flight: 0.51 ms in 1024-score blocks (48 registers, 40 warps an SM),
   0.92 in 2048 (96, 20 warps), 1.01 in 4096 with 8 warps (120, 16) and 1.68 with 4 (254, 8), with 32-40 KB an SM
   in flight in each (registers as tests/gpu/triton_lowering_check.py builds them for sm_90 here). Each warp's
   chain (load, an atomic slot whose return its stores wait for, the stores) bounds it. Two launches wait for a
   GPU (off until then; bench_indexer_topk.py times them beside the default): 512-score blocks
   (``launch_shape(block=512)``: 32 registers, 64 warps an SM), and ``LaunchShape.prefetch``, which loads a step's
   next block before its own block's atomics so that the load overlaps the slot's wait (80 registers in 1024-score
   blocks, 48 in 512). Loading the first read's next tile ahead took it from 64 to 199 registers and was not kept.
3. Per row, the cut (the ``keep``-th best score): a bisection over the candidates' ordered patterns in registers
   (at most 32 counts), then among the scores at the cut the lowest-numbered pools (a bisection over their ids).
   Where fewer than ``keep`` scores lie above the floor the floor is the cut. When the candidates overflowed their
   slots (a mass of equal scores, such as ReLU zeros, at the floor), the rows are read again instead: once for the
   kept pools, and, where ``keep`` or more scores lie above the floor, four times before for a radix selection of
   the cut (8 bits a read, a 256-bin histogram each; a bisection read such a row up to 32 times). In registers
   the bisections stay: radix selections there (tl.histogram) made the selection slower, 412 against 310 ms in
   `base`'s 512k step and 0.147 against 0.086 ms on spread scores at 1M (benchmarks/results/
   indexer_topk_radix_2026-12-03/).
4. The kept pools, sorted ascending.

The result is a top-``keep`` of each row, the same whatever order the atomics ran in: the kept scores are the
``keep`` largest, as a multiset, and among equal scores at the cut the lowest pool ids are kept (``torch.topk`` may
choose others among them). :func:`genolc.model.ops.indexer.reference.top_pools` is this in pure torch; the GPU
tests compare the two exactly.

Imports Triton at call time only (CUDA code paths; see ``genolc.model.ops.dispatch``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 1024
TILE = 4096
SEGMENT = 16384
CAP_PER_KEPT = 8


@dataclass(frozen=True)
class LaunchShape:
    keep_block: int       # the output block: a power of two >= keep
    groups: int           # strided groups: a power of two, 2 G >= keep, at least 16
    group_rows: int       # rows of a [group_rows, groups] tile in the first read
    segment: int          # pools per (row, segment) program
    cap: int              # candidate slots a row
    block: int = BLOCK    # scores per step of the second read
    warps: int = 4        # warps of the per-segment programs
    select_warps: int = 8  # warps of the per-row selection
    prefetch: bool = False  # the second read loads each step's next block before taking its own block's slots

    def segments(self, n_cols: int) -> int:
        return max(1, -(-n_cols // self.segment))

    @property
    def scoring_writes_tops(self) -> bool:
        """Whether the scoring kernel can write the first read's tops (genolc.model.ops.indexer.triton's
        SCORE_GROUP_TOPS): it walks four pools of each group a step, so a segment must hold a whole number of
        steps (keep <= 4096)."""
        return not self.segment % (4 * self.groups)


def launch_shape(keep: int, *, segment: int = SEGMENT, block: int = BLOCK, tile: int = TILE,
                 warps: int = 4, select_warps: int = 8, groups: int | None = None,
                 prefetch: bool = False) -> LaunchShape:
    """The kernels' block sizes for ``keep`` pools a row (the keywords: powers of two, for
    benchmarks/bench_indexer_topk.py's sweep)."""
    if keep < 1:
        raise ValueError(f"keep must be positive, got {keep}")
    # The row-wide radix selection's tl.histogram of a block of scores: Triton releases before the fix for
    # duplicated histogram inputs (triton-lang/triton#7938) count a block smaller than the threads more than once.
    if block < 32 * select_warps:
        raise ValueError(f"block ({block}) must be at least 32 * select_warps ({32 * select_warps})")
    keep_block = 1 << (keep - 1).bit_length()
    groups = max(16, keep_block) if groups is None else groups
    if groups & (groups - 1) or 2 * groups < keep:
        raise ValueError(f"groups ({groups}) must be a power of two with 2 * groups >= keep ({keep})")
    group_rows = max(1, tile // groups)
    return LaunchShape(keep_block=keep_block, groups=groups, group_rows=group_rows,
                       segment=max(segment, group_rows * groups, block),
                       cap=max(CAP_PER_KEPT * keep_block, 4 * groups, block), block=block, warps=warps,
                       select_warps=select_warps, prefetch=prefetch)


@dataclass(frozen=True)
class TopPoolsBuffers:
    """Work space of :func:`top_pools` for blocks of up to ``rows`` x ``cols`` (int32): the groups' tops per
    segment ``[rows, segments * 2 * G]``, floor and highest ``[rows, 2]``, the candidate counters ``[rows, 2]``, the
    candidates' ordered scores and pool ids ``[rows, CAP]`` each. 128 MiB at 2048 rows of 128k pools, keep 512."""
    rows: int
    cols: int
    tops: torch.Tensor
    floors: torch.Tensor
    counts: torch.Tensor
    cand_vals: torch.Tensor
    cand_ids: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, cols: int, keep: int, device: torch.device,
                 shape: LaunchShape | None = None) -> "TopPoolsBuffers":
        shape = launch_shape(keep) if shape is None else shape

        def buffer(*dims):
            return torch.empty(dims, dtype=torch.int32, device=device)

        return cls(rows=rows, cols=cols, tops=buffer(rows, shape.segments(cols) * 2 * shape.groups),
                   floors=buffer(rows, 2), counts=buffer(rows, 2), cand_vals=buffer(rows, shape.cap),
                   cand_ids=buffer(rows, shape.cap))


def top_pools(scores: torch.Tensor, *, first_query: int, kpool: int, keep: int, out: torch.Tensor,
              buffers: TopPoolsBuffers | None = None, shape: LaunchShape | None = None,
              stages: list | None = None, tops_ready: bool = False) -> torch.Tensor:
    """The ``keep`` best causal pools of each row of ``scores [Cq, P]`` (fp32, row ``t`` the query at
    ``first_query + t``, which sees pools ``0 .. min((first_query + t + 1) // kpool, P) - 1``): fills ``out [Cq, keep]``
    (int32 or int64) with their ids in ascending order, -1 after them, and returns it. ``buffers``: the work space
    (:class:`TopPoolsBuffers` for ``keep``, at least Cq x P, on the scores' device), allocated here when not given.
    ``shape``: other block sizes than :func:`launch_shape`'s; ``stages``: a list that gets a CUDA event after each
    launch (the benchmark's per-kernel times); ``tops_ready``: ``buffers.tops`` already holds the first read's
    result for these rows and ``shape`` (the scoring kernel wrote it, ``triton.pool_score_block(..., tops=)``), so the
    block is read once."""
    n_rows, n_cols = scores.shape
    if scores.dtype != torch.float32 or scores.stride(-1) != 1:
        raise ValueError(f"scores must be float32 with a contiguous last dimension, got {scores.dtype} "
                         f"strides {scores.stride()}")
    if out.shape != (n_rows, keep) or out.dtype not in (torch.int32, torch.int64) or out.stride(-1) != 1:
        raise ValueError(f"out must be [{n_rows}, {keep}] int32/int64 with a contiguous last dimension, got "
                         f"{tuple(out.shape)} {out.dtype} strides {out.stride()}")
    shape = launch_shape(keep) if shape is None else shape
    if buffers is None:
        if tops_ready:
            raise ValueError("tops_ready needs the buffers whose tops the scoring kernel wrote")
        buffers = TopPoolsBuffers.allocate(n_rows, n_cols, keep, scores.device, shape)
    if buffers.tops.device != scores.device or out.device != scores.device:
        raise ValueError(f"scores ({scores.device}), out ({out.device}) and buffers ({buffers.tops.device}) must be "
                         "on one device")
    if (buffers.rows < n_rows or buffers.cols < n_cols or buffers.cand_vals.shape[1] != shape.cap
            or buffers.tops.shape[1] < shape.segments(n_cols) * 2 * shape.groups):
        raise ValueError(f"buffers for {buffers.rows} x {buffers.cols} (cap {buffers.cand_vals.shape[1]}) do not "
                         f"fit a {n_rows} x {n_cols} block at keep {keep}")
    if not n_rows:
        return out
    from genolc.model.ops.indexer import triton_topk_kernel as kernels

    segments = shape.segments(n_cols)
    tops, floors, counts = buffers.tops, buffers.floors, buffers.counts
    vals, ids = buffers.cand_vals, buffers.cand_ids
    if not tops_ready:
        kernels.group_tops_kernel[(n_rows, segments)](
            scores, tops, first_query, n_cols, kpool, scores.stride(0), tops.stride(0),
            GROUPS=shape.groups, GROUP_ROWS=shape.group_rows, SEGMENT=shape.segment, num_warps=shape.warps)
        _mark(stages)
    kernels.floors_kernel[(n_rows,)](
        tops, floors, counts, first_query, n_cols, kpool, keep, tops.stride(0),
        GROUPS=shape.groups, SEGMENT=shape.segment, num_warps=4)
    _mark(stages)
    kernels.candidates_kernel[(n_rows, segments)](
        scores, floors, counts, vals, ids, first_query, n_cols, kpool, keep, scores.stride(0), vals.stride(0),
        BLOCK=shape.block, SEGMENT=shape.segment, CAP=shape.cap, PREFETCH=shape.prefetch, num_warps=shape.warps)
    _mark(stages)
    kernels.select_kernel[(n_rows,)](
        scores, floors, counts, vals, ids, out, first_query, n_cols, kpool, keep, scores.stride(0), vals.stride(0),
        out.stride(0), KEEP_BLOCK=shape.keep_block, BLOCK=shape.block, CAP=shape.cap, num_warps=shape.select_warps)
    _mark(stages)
    return out


def _mark(stages: list | None) -> None:
    if stages is not None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        stages.append(event)
