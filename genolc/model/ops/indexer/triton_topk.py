"""The indexer's selection on the GPU: each query's best pools out of its score row, one Triton program per row.

:func:`top_pools` takes the ``[Cq, P]`` fp32 score block of :func:`genolc.model.ops.indexer.triton.pool_score_block`
and writes, per row ``t``, the ids of the ``keep`` best of the row's first ``n_t = (first_query + t + 1) // kpool``
scores (its complete causal pools; nothing past them is read), in ascending pool order, -1 after them. It replaces
``torch.topk`` over the whole block, whose radix select read every row, causal or not, in four passes and a gather
(1.8 s of a `base` step at 512k, benchmarks/results/training_speed_2026-12-01.md).

Per row, with scores compared as their ordered bit patterns (:func:`_ordered`; -0.0 ranks just below +0.0):

1. One read: the two largest scores of each of ``G`` strided groups (pool ``i`` is in group ``i mod G``,
   ``2 G >= keep``). The lowest of the groups' second-largest scores, the floor, has at least ``2 G`` scores at or
   above it.
2. A second read copies every score at or above the floor, with its pool id, in pool order, to the row's ``CAP``
   candidate slots. If a row's scores were drawn alike at random, about 4 ``keep`` of them would pass at ``keep``
   512 over 128k pools; the cap is 8 ``keep``.
3. The cut, the ``keep``-th best score: a bisection over the ordered patterns, each step a count of the scores at or
   above its middle (at most 32 steps) among the candidates, or over the whole row when they did not fit (each
   count one more read of the row). Where fewer than ``keep`` scores lie above the floor the floor is the cut.
4. The kept pools in pool order: every one above the cut, then the lowest-numbered ones at the cut until ``keep``.

The result is a top-``keep`` of each row: the kept scores are the ``keep`` largest, as a multiset; only which of
several equal scores at the cut are kept can differ from ``torch.topk``'s choice.

Imports Triton at call time only (CUDA code paths; see ``genolc.model.ops.dispatch``).
"""

from __future__ import annotations

import torch

BLOCK = 1024
GROUP_ROWS = 8
CAP_PER_KEPT = 8


def launch_shape(keep: int) -> tuple[int, int, int]:
    """(KEEP_BLOCK, GROUPS, CAP) of the kernel for ``keep`` pools a row: the output block (a power of two >=
    keep), the strided groups (a power of two, 2 G >= keep, at least 16) and the candidate slots a row."""
    if keep < 1:
        raise ValueError(f"keep must be positive, got {keep}")
    keep_block = 1 << (keep - 1).bit_length()
    groups = max(16, keep_block // 2)
    return keep_block, groups, max(CAP_PER_KEPT * keep_block, 4 * groups, BLOCK)


def top_pools(scores: torch.Tensor, *, first_query: int, kpool: int, keep: int, out: torch.Tensor,
              candidates: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The ``keep`` best causal pools of each row of ``scores [Cq, P]`` (fp32, row ``t`` the query at
    ``first_query + t``, which sees pools ``0 .. (first_query + t + 1) // kpool - 1``): fills ``out [Cq, keep]``
    (int32 or int64) with their ids in ascending order, -1 after them, and returns it. ``candidates``: two int32
    ``[>= Cq, CAP]`` work buffers (:func:`candidate_buffers`), allocated here when not given."""
    n_rows, n_cols = scores.shape
    if scores.dtype != torch.float32 or scores.stride(-1) != 1:
        raise ValueError(f"scores must be float32 with a contiguous last dimension, got {scores.dtype} "
                         f"strides {scores.stride()}")
    if out.shape != (n_rows, keep) or out.dtype not in (torch.int32, torch.int64) or out.stride(-1) != 1:
        raise ValueError(f"out must be [{n_rows}, {keep}] int32/int64 with a contiguous last dimension, got "
                         f"{tuple(out.shape)} {out.dtype}")
    keep_block, groups, cap = launch_shape(keep)
    vals, ids = candidate_buffers(n_rows, keep, scores.device) if candidates is None else candidates
    if vals.shape[0] < n_rows or vals.shape[1:] != (cap,) or ids.shape != vals.shape:
        raise ValueError(f"candidates must be two [>= {n_rows}, {cap}] int32 buffers, got {tuple(vals.shape)}")
    if n_rows:
        from genolc.model.ops.indexer.triton_topk_kernel import top_pools_kernel

        top_pools_kernel[(n_rows,)](
            scores, out, vals, ids, first_query, n_cols, kpool, keep,
            scores.stride(0), out.stride(0), vals.stride(0),
            KEEP_BLOCK=keep_block, GROUPS=groups, GROUP_ROWS=GROUP_ROWS, BLOCK=BLOCK, CAP=cap, num_warps=4)
    return out


def candidate_buffers(n_rows: int, keep: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's per-row candidate slots: two int32 ``[n_rows, CAP]`` buffers (ordered scores, pool ids);
    32 MiB each at 2048 rows and keep 512."""
    cap = launch_shape(keep)[2]
    return (torch.empty((n_rows, cap), dtype=torch.int32, device=device),
            torch.empty((n_rows, cap), dtype=torch.int32, device=device))
