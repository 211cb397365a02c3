"""The indexer KL per query row in pure torch (the formula: genolc/model/indexer_loss.py's module notes).

:func:`kl_rows` takes scores already computed (both loss modes use it); :func:`sparse_kl_rows` is the sparse
mode's op: the indexer's scores over each query's selected pools, then :func:`kl_rows`. It gathers the selected
pools' keys ``[B, C, K, Di]`` in fp32 and keeps autograd's intermediates; ``triton.py`` computes the same in one
program per query without gathering into memory.
"""

from __future__ import annotations

import torch

from genolc.model.ops.indexer.layout import selected_pools
from genolc.model.ops.indexer.reference import pool_scores

LOG_EPS = 1e-10


def kl_rows(pool_mass: torch.Tensor, index_scores: torch.Tensor,
            candidate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(t) per row ``[B, C]`` (0 for a row without a candidate) and whether the row has a candidate ``[B, C]``;
    all inputs ``[B, C, P]``: the main attention's mass per pool, the indexer's scores and the candidate mask."""
    has_candidate = candidate.any(dim=-1)
    target = pool_mass.masked_fill(~candidate, 0.0)
    target = target / target.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(target.dtype).tiny)
    logits = index_scores.masked_fill(~candidate, float("-inf"))
    # A row without candidates would softmax to NaN; give it finite logits, its target is all zero anyway.
    logits = logits.masked_fill(~has_candidate[..., None], 0.0)
    index_probs = logits.softmax(dim=-1)
    kl = target * (torch.log(target + LOG_EPS) - torch.log(index_probs + LOG_EPS))
    return kl.masked_fill(~candidate, 0.0).sum(dim=-1), has_candidate


def sparse_kl_rows(pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor,
                   indices: torch.Tensor, softmax_scale: float, *, kpool: int,
                   topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(t) per row over the pools each row selected, and whether the row has one (both ``[B, C]``).

    ``pool_mass [B, C, topk // kpool]`` (the target's mass per pool slot, no gradient), ``index_q [B, C, Hi, Di]``,
    ``head_weights [B, C, Hi]``, ``pooled [B, P, Di]`` (every pool key of the window), ``indices [B, C, W]`` the rows'
    index rows (``W >= topk``; pool slot j holds the pool of entry ``j * kpool``, none where that is -1:
    ``genolc.model.ops.indexer.layout.selected_pools``)."""
    check_sparse_inputs(pool_mass, index_q, head_weights, pooled, indices, kpool=kpool, topk=topk)
    pools = selected_pools(indices, topk, kpool)
    batch_ids = torch.arange(pools.shape[0], device=pools.device)[:, None, None]
    chosen_keys = pooled[batch_ids, pools.clamp_min(0).long()]  # [B, C, K, Di]
    scores = pool_scores(index_q, head_weights, chosen_keys, softmax_scale)
    return kl_rows(pool_mass.float(), scores, pools >= 0)


def check_sparse_inputs(pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor,
                        pooled: torch.Tensor, indices: torch.Tensor, *, kpool: int, topk: int) -> None:
    """ValueError naming the operand whose shape does not fit :func:`sparse_kl_rows`'s contract."""
    if index_q.dim() != 4:
        raise ValueError(f"index_q must be [B, C, Hi, Di], got {tuple(index_q.shape)}")
    batch, rows, heads, dim = index_q.shape
    if head_weights.shape != (batch, rows, heads):
        raise ValueError(f"head_weights must be [B={batch}, C={rows}, Hi={heads}], got {tuple(head_weights.shape)}")
    if pooled.dim() != 3 or pooled.shape[0] != batch or pooled.shape[2] != dim:
        raise ValueError(f"pooled must be [B={batch}, P, Di={dim}], got {tuple(pooled.shape)}")
    if kpool < 1 or topk < kpool or topk % kpool:
        raise ValueError(f"topk ({topk}) must be a positive multiple of kpool ({kpool})")
    if indices.dim() != 3 or indices.shape[:2] != (batch, rows) or indices.shape[2] < topk:
        raise ValueError(f"indices must be [B={batch}, C={rows}, W >= topk={topk}], got {tuple(indices.shape)}")
    if pool_mass.shape != (batch, rows, topk // kpool):
        raise ValueError(f"pool_mass must be [B={batch}, C={rows}, topk // kpool={topk // kpool}], got "
                         f"{tuple(pool_mass.shape)}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be int32 or int64, got {indices.dtype}")
