"""The DSA k-pool indexer in pure torch: which keys each query of a DSA layer attends to.

GLM-5.3-Flash's indexer (DeepSeek Sparse Attention with k-pool compression) scores *pools* of ``kpool``
consecutive keys, not single keys:

1. Pool keys. Complete pools ``p`` cover tokens ``[p * kpool, (p + 1) * kpool)``. A pool's key is a per-channel
   softmax-weighted mean of its tokens' indexer keys, the weights coming from a learned gate on the hidden state
   plus a learned bias per position inside the pool (:func:`genolc.model.ops.indexer.pooling.pool_keys`).
2. Scores. ``score[t, p] = sum_h w[t, h] * relu(scale * <q[t, h], pool_key[p]>)`` (:func:`pool_scores`).
3. Selection. Query ``t`` may pick pool ``p`` only when the pool is complete and causal: ``(p + 1) * kpool <= t + 1``.
   It keeps the ``topk // kpool`` best-scoring such pools, expanded back to their tokens, and (when
   ``select_tail``) the tokens of its own incomplete pool, ``[(t + 1) // kpool * kpool, t]``, which no pool
   covers yet (:func:`select_indices`).

Index rows are ``W = topk + (kpool - 1 if select_tail else 0)`` wide (:mod:`genolc.model.ops.indexer.layout`).

Memory: queries are scored in chunks of ``query_chunk`` rows against blocks of ``pool_block`` pools, keeping a
running top-k per query, so no ``[T, T / kpool]`` score matrix is ever built; the largest tensors are the inputs and
the ``[B, T, W]`` output, O(T * W).

A fast GPU kernel may replace :func:`select_indices`; it must return the same index sets (ties aside).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genolc.model.ops.indexer.layout import complete_pools_visible, index_rows, index_width
from genolc.model.ops.precision import autocast_off

DEFAULT_QUERY_CHUNK = 256
DEFAULT_POOL_BLOCK = 4096


@autocast_off
def pool_scores(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor,
                softmax_scale: float) -> torch.Tensor:
    """Indexer scores of queries against pools (no masking).

    Args:
        index_q: ``[B, Tq, H, D]`` indexer queries.
        head_weights: ``[B, Tq, H]`` per-query head weights (already multiplied by ``H ** -0.5``).
        pooled: ``[B, P, D]`` pool keys, or ``[B, Tq, P, D]`` with a separate pool list per query.
        softmax_scale: scale applied to the dot products before the ReLU.

    Returns:
        ``[B, Tq, P]`` float32: ``sum_h head_weights[h] * relu(softmax_scale * <index_q[h], pooled[p]>)``.
    """
    if index_q.dim() != 4 or head_weights.shape != index_q.shape[:3]:
        raise ValueError(f"index_q must be [B, Tq, H, D] and head_weights [B, Tq, H], got {tuple(index_q.shape)} and "
                         f"{tuple(head_weights.shape)}")
    if pooled.dim() == 3:
        if pooled.shape[0] != index_q.shape[0] or pooled.shape[-1] != index_q.shape[-1]:
            raise ValueError(f"pooled must be [B, P, D] matching index_q {tuple(index_q.shape)}, "
                             f"got {tuple(pooled.shape)}")
        dots = torch.einsum("bqhd,bpd->bqhp", index_q.float(), pooled.float())
    elif pooled.dim() == 4:
        if pooled.shape[:2] != index_q.shape[:2] or pooled.shape[-1] != index_q.shape[-1]:
            raise ValueError(f"pooled must be [B, Tq, P, D] matching index_q {tuple(index_q.shape)}, "
                             f"got {tuple(pooled.shape)}")
        dots = torch.einsum("bqhd,bqpd->bqhp", index_q.float(), pooled.float())
    else:
        raise ValueError(f"pooled must be [B, P, D] or [B, Tq, P, D], got {tuple(pooled.shape)}")
    activated = F.relu(dots * softmax_scale)
    return torch.einsum("bqh,bqhp->bqp", head_weights.float(), activated)


def check_selection_inputs(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor, *, kpool: int,
                           topk: int, query_offset: int = 0) -> None:
    """ValueError unless ``index_q [B, T, H, D]``, ``head_weights [B, T, H]``,
    ``pooled [B, (query_offset + T) // kpool, D]`` and ``topk`` a positive multiple of ``kpool`` (shared by the
    reference and the fast selection)."""
    if index_q.dim() != 4 or head_weights.shape != index_q.shape[:3]:
        raise ValueError(f"index_q must be [B, T, H, D] and head_weights [B, T, H], got {tuple(index_q.shape)} and "
                         f"{tuple(head_weights.shape)}")
    batch, seq_len, _, dim = index_q.shape
    if kpool < 1 or topk < kpool or topk % kpool:
        raise ValueError(f"topk ({topk}) must be a positive multiple of kpool ({kpool})")
    if query_offset < 0:
        raise ValueError(f"query_offset must be zero or positive, got {query_offset}")
    n_pools = (query_offset + seq_len) // kpool
    if pooled.shape != (batch, n_pools, dim):
        raise ValueError(f"pooled must be [B={batch}, (offset + T) // kpool={n_pools}, D={dim}], "
                         f"got {tuple(pooled.shape)}")


def select_indices(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor, *, kpool: int,
                   topk: int, select_tail: bool, softmax_scale: float, query_chunk: int = DEFAULT_QUERY_CHUNK,
                   pool_block: int = DEFAULT_POOL_BLOCK, query_offset: int = 0,
                   window_len: int | None = None, out_dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Causal top-k pool selection, expanded to token indices.

    Args:
        index_q: ``[B, T, H, D]`` indexer queries for positions ``query_offset .. query_offset + T - 1``.
        head_weights: ``[B, T, H]`` head weights (already multiplied by ``H ** -0.5``).
        pooled: ``[B, (query_offset + T) // kpool, D]`` pool keys from :func:`pool_keys` over the sequence up to
            the last query (a chunk of a window sees the pools of the chunks before it).
        kpool: pool size; ``topk`` must be a multiple of it.
        topk: token budget; ``topk // kpool`` pools are kept per query.
        select_tail: also select the query's own incomplete pool.
        softmax_scale: see :func:`pool_scores`.
        query_chunk, pool_block: working-set sizes (results do not depend on them, ties aside).
        query_offset: absolute position of the first query (0 for a whole window).
        window_len: length of the whole window these queries belong to (default: ``query_offset + T``); only
            shapes the candidate rows, see below.
        out_dtype: integer dtype of the rows (int64 by default; the model asks for int32 on CUDA).

    Returns:
        ``[B, T, W]`` ``out_dtype`` absolute token indices in the layout described in the module docstring, -1 for
        empty slots.
        Among pools with equal scores (ReLU makes many exactly 0) the choice is ``torch.topk``'s, which depends on
        the candidate row: each row is scored against whole blocks of ``pool_block`` pools (the last one cut at
        the window's last pool, ``window_len // kpool``), non-causal pools at -inf, so a query's row, and so its
        choice, is the same whether it runs in a whole window or in one chunk of it.
    """
    check_selection_inputs(index_q, head_weights, pooled, kpool=kpool, topk=topk, query_offset=query_offset)
    if query_chunk < 1 or pool_block < 1:
        raise ValueError(f"query_chunk and pool_block must be positive, got {query_chunk} and {pool_block}")
    batch, seq_len = index_q.shape[:2]
    device = index_q.device
    known_pools = pooled.shape[1]
    window_pools = max(known_pools, (window_len or 0) // kpool)
    pools_per_row = topk // kpool
    width = index_width(topk, kpool, select_tail)
    out = torch.empty((batch, seq_len, width), dtype=out_dtype, device=device)

    for q0 in range(0, seq_len, query_chunk):
        q1 = min(seq_len, q0 + query_chunk)
        positions = torch.arange(query_offset + q0, query_offset + q1, device=device)
        n_visible = complete_pools_visible(positions, kpool)  # [Cq]
        q_chunk, w_chunk = index_q[:, q0:q1], head_weights[:, q0:q1]

        best_scores = torch.empty(batch, q1 - q0, 0, device=device)
        best_pools = torch.empty(batch, q1 - q0, 0, dtype=torch.long, device=device)
        # Blocks wholly beyond the last query's visible range are masked for every query in the chunk: skip them.
        for p0 in range(0, int(n_visible[-1]), pool_block):
            p1 = min(window_pools, p0 + pool_block)
            block_ids = torch.arange(p0, p1, device=device)
            scores = pool_scores(q_chunk, w_chunk, pooled[:, p0:min(p1, known_pools)], softmax_scale)
            scores = F.pad(scores, (0, p1 - p0 - scores.shape[-1]), value=float("-inf"))
            scores = scores.masked_fill(block_ids[None, None, :] >= n_visible[None, :, None], float("-inf"))
            candidates = torch.cat([best_scores, scores], dim=-1)
            candidate_ids = torch.cat([best_pools, block_ids.expand(batch, q1 - q0, -1)], dim=-1)
            kept = candidates.topk(min(pools_per_row, candidates.shape[-1]), dim=-1)
            best_scores = kept.values
            best_pools = candidate_ids.gather(-1, kept.indices)

        # A masked pool is only kept when fewer than pools_per_row are visible; drop it by position, not score.
        pools = best_pools.new_full((batch, q1 - q0, pools_per_row), -1)
        pools[..., : best_pools.shape[-1]] = best_pools.masked_fill(best_pools >= n_visible[None, :, None], -1)
        index_rows(pools, query_offset=query_offset + q0, kpool=kpool, select_tail=select_tail, out=out[:, q0:q1])
    return out


def ordered_scores(scores: torch.Tensor) -> torch.Tensor:
    """fp32 -> int32 bit patterns whose signed order is the floats' (-0.0 just below +0.0; NaNs above +inf or below
    -inf by sign): how :mod:`genolc.model.ops.indexer.triton_topk` compares scores."""
    bits = scores.float().contiguous().view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def top_pools(scores: torch.Tensor, *, first_query: int, kpool: int, keep: int) -> torch.Tensor:
    """Pure-torch reference of :func:`genolc.model.ops.indexer.triton_topk.top_pools`: per row ``t`` of ``scores
    [Cq, P]``, the ``keep`` best of its first ``min((first_query + t + 1) // kpool, P)`` scores by
    :func:`ordered_scores`, the lowest pool ids among those tied at the cut, ascending, -1 after them
    (``[Cq, keep]`` int64)."""
    out = torch.full((scores.shape[0], keep), -1, dtype=torch.long, device=scores.device)
    for t in range(scores.shape[0]):
        n = min((first_query + t + 1) // kpool, scores.shape[1])
        # A stable descending sort keeps tied patterns in pool order, so its first `keep` are the kept pools.
        kept = torch.sort(ordered_scores(scores[t, :n]), descending=True, stable=True).indices[:keep]
        out[t, : kept.numel()] = kept.sort().values
    return out
