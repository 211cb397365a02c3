"""Streamed indexer top-k on the GPU: per query chunk a Triton scoring kernel, then a Triton top-k kernel.

Same contract as :func:`genolc.model.ops.indexer.reference.select_indices` (index rows ``topk + kpool - 1`` wide
with ``select_tail``, -1 for empty slots; the pools in ascending order here, best first in the reference's). Per
query chunk of ``Cq`` rows the scoring kernel writes the ``[Cq, P_visible]`` fp32 score block

    score[t, p] = sum_h w[t, h] * relu(softmax_scale * <q[t, h], pooled[p]>)     (-inf where p >= (t + 1) // kpool)

with the head sum fused (no ``[Cq, H, P]`` intermediate), and :func:`genolc.model.ops.indexer.triton_topk.top_pools`
keeps each row's ``topk // kpool`` best causal pools (``fused_topk=False``: ``torch.topk`` over the block, as before
2026-12-02, kept for the benchmark). ``P_visible`` is the last query's causal pool count, so early chunks cost
little. The chunk size is chosen so the score block holds at most ``SCORE_BUDGET_ELEMENTS`` floats (1 GiB): working
memory is that block, the top-k's work space (at most about 192 MiB: 4096 queries at 256k) and the ``[B, T, W]`` output,
O(T * W), never O(T^2 / kpool).

The dot products sum in a different order than the reference's fp32 einsum, so pools whose scores tie to within
rounding may be chosen differently; everything else selects the same sets.

Imports Triton at call time only (CUDA code paths; see ``genolc.model.ops.dispatch``).
"""

from __future__ import annotations

import functools

import torch

from genolc.model.ops.indexer.layout import complete_pools_visible, index_rows, index_width
from genolc.model.ops.indexer.reference import check_selection_inputs
from genolc.model.ops.indexer.triton_topk import LaunchShape, TopPoolsBuffers, launch_shape, top_pools

SCORE_BUDGET_ELEMENTS = 1 << 28
MAX_QUERY_CHUNK = 4096
BLOCK_QUERIES = 64
BLOCK_POOLS = 128
# The scoring kernel that also writes the groups' tops: pools a run (128 bytes of scores), and warps. At 4 warps
# its four accumulators and the tops spilled 1.3 KB a thread on sm_90, at 8 none (tests/gpu/triton_lowering_check.py).
GROUP_BLOCK = 32
SCORE_TOPS_WARPS = 8
# Whether streamed_select scores with that kernel (one read of each score block by the top-k instead of two). Off
# until it has run on a GPU: it has passed Triton's interpreter and sm_90 lowering only. benchmarks/
# run_selection_checks.sh runs its GPU tests and times the step both ways, and says whether to turn it on.
SCORE_GROUP_TOPS = False


KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def prepare_inputs(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the scoring kernel is handed for the layer's ``(index_q, head_weights, pooled)``: both dot operands in
    one dtype, every tensor contiguous, head weights fp32. Pure torch (CPU-runnable; the CPU tests check it).

    The operands meet in a dot product, so the dtype is chosen as autocast chooses a matmul's: the autocast dtype
    when autocast is on for their device, else the wider of the two. Under CUDA autocast the layer hands over
    bf16 queries (a Linear's output) and fp32 pool keys (autocast runs ``layer_norm`` in fp32).
    """
    device_type = index_q.device.type
    if torch.is_autocast_enabled(device_type):
        common = torch.get_autocast_dtype(device_type)
    else:
        common = torch.promote_types(index_q.dtype, pooled.dtype)
    return (index_q.to(common).contiguous(), head_weights.float().contiguous(), pooled.to(common).contiguous())


def check_kernel_inputs(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor) -> None:
    """ValueError unless the scoring kernel can take these (full ``[B, T, H, D]`` tensors or one row's
    ``[Cq, H, D]`` slices): index_q and pooled one dtype of ``KERNEL_DTYPES``, head_weights fp32, last dims
    contiguous. Shared by :func:`pool_score_block` and the CPU tests of what the model hands this op."""
    if index_q.dtype not in KERNEL_DTYPES or index_q.dtype != pooled.dtype:
        raise ValueError(f"index_q ({index_q.dtype}) and pooled ({pooled.dtype}) must share one dtype of "
                         f"{KERNEL_DTYPES}")
    if head_weights.dtype != torch.float32:
        raise ValueError(f"head_weights must be float32 for the scoring kernel, got {head_weights.dtype}")
    if index_q.stride(-1) != 1 or pooled.stride(-1) != 1 or head_weights.stride(-1) != 1:
        raise ValueError(f"index_q, pooled and head_weights need a contiguous last dimension; got strides "
                         f"{index_q.stride()}, {pooled.stride()}, {head_weights.stride()}")


@functools.cache
def _score_kernel():
    from genolc.model.ops.indexer.triton_topk_kernel import pool_score_kernel

    return pool_score_kernel


def pool_score_block(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor, q0: int,
                     softmax_scale: float, kpool: int, out: torch.Tensor, *, block_queries: int = BLOCK_QUERIES,
                     block_pools: int = BLOCK_POOLS, warps: int | None = None, stages: int = 3,
                     tops: torch.Tensor | None = None, shape: LaunchShape | None = None) -> torch.Tensor:
    """Masked scores of one batch row's query chunk: index_q ``[Cq, H, D]``, head_weights ``[Cq, H]``,
    pooled ``[P, D]`` (the visible pools) -> fills and returns ``out [Cq, P]`` fp32 (-inf for non-causal pools).
    ``block_queries``, ``block_pools``, ``warps``, ``stages``: other launch shapes (powers of two, for
    benchmarks/bench_indexer_topk.py's ``--score-sweep``).

    ``tops`` (``TopPoolsBuffers.tops`` of the top-k's ``shape``): also writes each group's two best scores there, as
    ``top_pools``' first read would, and ``top_pools(..., tops_ready=True)`` then reads the block once
    (``triton_topk_kernel.score_group_tops_kernel``: tiles of four ``GROUP_BLOCK``-pool runs, ``block_pools``
    ignored; ``SCORE_TOPS_WARPS`` warps unless ``warps`` is given)."""
    import triton

    n_queries, heads, dim = index_q.shape
    n_pools = pooled.shape[0]
    check_kernel_inputs(index_q, head_weights, pooled)
    common = dict(HEADS=heads, DIM=dim, BLOCK_D=max(16, triton.next_power_of_2(dim)), BLOCK_M=block_queries,
                  IEEE=index_q.dtype == torch.float32, num_stages=stages)
    strides = (index_q.stride(0), index_q.stride(1), head_weights.stride(0), pooled.stride(0), out.stride(0))
    if tops is None:
        grid = (triton.cdiv(n_queries, block_queries), triton.cdiv(n_pools, block_pools))
        _score_kernel()[grid](index_q, head_weights, pooled, out, q0, n_queries, n_pools, kpool, softmax_scale,
                              *strides, BLOCK_N=block_pools, num_warps=warps or 4, **common)
        return out
    if shape is None:
        raise ValueError("pool_score_block writes the tops of a top-k LaunchShape: pass its shape with tops")
    if out.dtype != torch.float32:
        raise ValueError(f"out must be float32 where the tops are written (they are of the fp32 scores), got "
                         f"{out.dtype}")
    needed = shape.segments(n_pools) * 2 * shape.groups
    if tops.dtype != torch.int32 or tops.shape[0] < n_queries or tops.shape[1] < needed or tops.stride(-1) != 1:
        raise ValueError(f"tops must be int32 [>= {n_queries}, >= {needed}] with a contiguous last dimension, got "
                         f"{tops.dtype} {tuple(tops.shape)} strides {tops.stride()}")
    if not shape.scoring_writes_tops:
        raise ValueError(f"the fused scoring walks four pools of each group a step: segment {shape.segment} must be "
                         f"a multiple of 4 x {shape.groups} groups")
    from genolc.model.ops.indexer.triton_topk_kernel import score_group_tops_kernel

    group_block = min(GROUP_BLOCK, shape.groups)
    grid = (triton.cdiv(n_queries, block_queries), shape.groups // group_block, shape.segments(n_pools))
    score_group_tops_kernel[grid](index_q, head_weights, pooled, out, tops, q0, n_queries, n_pools, kpool,
                                  softmax_scale, *strides, tops.stride(0), GROUPS=shape.groups,
                                  GROUP_BLOCK=group_block, SEGMENT=shape.segment,
                                  num_warps=warps or SCORE_TOPS_WARPS, **common)
    return out


def default_query_chunk(n_pools: int) -> int:
    """Queries per chunk so the ``[Cq, n_pools]`` fp32 score block stays within ``SCORE_BUDGET_ELEMENTS``."""
    chunk = SCORE_BUDGET_ELEMENTS // max(n_pools, 1)
    chunk = max(BLOCK_QUERIES, min(MAX_QUERY_CHUNK, chunk))
    return chunk // BLOCK_QUERIES * BLOCK_QUERIES


def select_indices(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor, *, kpool: int,
                   topk: int, select_tail: bool, softmax_scale: float, query_chunk: int | None = None,
                   pool_block: int | None = None, out_dtype: torch.dtype = torch.int64,
                   query_offset: int = 0, window_len: int | None = None) -> torch.Tensor:
    """Drop-in for ``reference.select_indices`` on CUDA tensors.

    Args:
        index_q: ``[B, T, H, D]``; head_weights: ``[B, T, H]``; pooled: ``[B, (query_offset + T) // kpool, D]``.
        kpool, topk, select_tail, softmax_scale: as the reference.
        query_chunk: queries scored per step (default: :func:`default_query_chunk`). pool_block: ignored (the
            kernel tiles pools itself; kept for signature compatibility).
        out_dtype: int64 (the contract) or int32 (half the output memory).
        query_offset: absolute position of the first query (a chunk of a window), as the reference's.
        window_len: ignored. The reference pads candidate rows to the window's pool count so that tied scores
            choose the same pools in a chunk as in the whole window; here the top-k kernel keeps the lowest-numbered
            of the pools whose scores tie at the cut, so it may pick other pools than the reference among exactly
            equal scores.
    Returns:
        ``[B, T, W]`` token indices, layout as the reference's (pools ascending rather than best first), -1 for
        empty slots.
    """
    check_selection_inputs(index_q, head_weights, pooled, kpool=kpool, topk=topk, query_offset=query_offset)
    if not index_q.is_cuda:
        raise ValueError("genolc.model.ops.indexer.triton needs CUDA tensors; use reference.select_indices on CPU")
    if out_dtype not in (torch.int32, torch.int64):
        raise ValueError(f"out_dtype must be torch.int32 or torch.int64, got {out_dtype}")
    return streamed_select(index_q, head_weights, pooled, kpool=kpool, topk=topk, select_tail=select_tail,
                           softmax_scale=softmax_scale, query_chunk=query_chunk, out_dtype=out_dtype,
                           query_offset=query_offset)


def streamed_select(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor, *, kpool: int,
                    topk: int, select_tail: bool, softmax_scale: float, query_chunk: int | None,
                    out_dtype: torch.dtype, query_offset: int = 0, fused_topk: bool = True) -> torch.Tensor:
    """:func:`select_indices` after its input checks, on any device Triton runs on (CUDA, or CPU tensors under
    ``TRITON_INTERPRET=1``, which ``tests/gpu/triton_interpreter_check.py`` uses). ``fused_topk=False`` keeps the
    pools with ``torch.topk`` (best first) instead of the top-k kernel (ascending)."""
    batch, seq_len = index_q.shape[:2]
    device = index_q.device
    n_pools = (query_offset + seq_len) // kpool
    query_chunk = default_query_chunk(n_pools) if query_chunk is None else query_chunk
    if query_chunk < 1:
        raise ValueError(f"query_chunk must be positive, got {query_chunk}")
    pools_per_row = topk // kpool
    width = index_width(topk, kpool, select_tail)
    index_q, head_weights, pooled = prepare_inputs(index_q, head_weights, pooled)
    check_kernel_inputs(index_q, head_weights, pooled)
    out = torch.empty((batch, seq_len, width), dtype=out_dtype, device=device)
    rows = min(query_chunk, seq_len)
    scores = torch.empty(rows * max(n_pools, 1), dtype=torch.float32, device=device)
    shape = launch_shape(pools_per_row) if fused_topk and n_pools else None
    buffers = TopPoolsBuffers.allocate(rows, n_pools, pools_per_row, device, shape) if shape else None
    tops_from_scoring = fused_topk and SCORE_GROUP_TOPS and shape is not None and shape.scoring_writes_tops

    for q0 in range(0, seq_len, query_chunk):
        q1 = min(seq_len, q0 + query_chunk)
        visible_pools = (query_offset + q1) // kpool  # the chunk's last query sees the most pools
        # The top-k kernel writes every slot of the rows it is given; torch.topk fills only the visible pools' slots.
        if fused_topk and visible_pools:
            pools = torch.empty((batch, q1 - q0, pools_per_row), dtype=torch.long, device=device)
        else:
            pools = torch.full((batch, q1 - q0, pools_per_row), -1, dtype=torch.long, device=device)
        block = scores[: (q1 - q0) * visible_pools].view(q1 - q0, visible_pools)
        # Queries that see no complete pool yet choose none (their rows hold only the tail slots, if any).
        if visible_pools:
            if not fused_topk:
                n_visible = complete_pools_visible(torch.arange(query_offset + q0, query_offset + q1, device=device),
                                                   kpool)
            for b in range(batch):
                pool_score_block(index_q[b, q0:q1], head_weights[b, q0:q1], pooled[b, :visible_pools],
                                 query_offset + q0, softmax_scale, kpool, block,
                                 tops=buffers.tops if tops_from_scoring else None, shape=shape)
                if fused_topk:
                    top_pools(block, first_query=query_offset + q0, kpool=kpool, keep=pools_per_row, out=pools[b],
                              buffers=buffers, shape=shape, tops_ready=tops_from_scoring)
                    continue
                best_pools = block.topk(min(pools_per_row, visible_pools), dim=-1).indices
                # A non-causal pool is picked only when fewer than pools_per_row are visible: drop it by position.
                pools[b, :, : best_pools.shape[1]] = best_pools.masked_fill(best_pools >= n_visible[:, None], -1)
        index_rows(pools, query_offset=query_offset + q0, kpool=kpool, select_tail=select_tail, dtype=out_dtype,
                   out=out[:, q0:q1])
    return out
