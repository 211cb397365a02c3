"""Index rows of the DSA k-pool indexer: their width, which pools a query may pick, and what a row holds.

Index rows are ``W = topk + (kpool - 1 if select_tail else 0)`` wide, laid out as ``topk // kpool`` slots of ``kpool``
consecutive tokens (one selected pool per slot; in the reference's rows best first, in the Triton op's ascending;
nothing reads the order) followed by ``kpool - 1`` tail slots. Empty slots hold -1. Every non-negative entry is ``<= t``
(causal) and no token appears twice in a row; the indexer (:mod:`genolc.model.ops.indexer.reference`, ``triton``), the
sparse attention (``genolc.model.ops.dsa``) and the indexer loss (``genolc.model.indexer_loss``) rely on this layout.
"""

from __future__ import annotations

import torch


def index_width(topk: int, kpool: int, select_tail: bool) -> int:
    """Width W of an index row: ``topk`` pool tokens plus ``kpool - 1`` tail slots when ``select_tail``."""
    return topk + (kpool - 1 if select_tail else 0)


def selects_all_causal(seq_len: int, topk: int, kpool: int, select_tail: bool) -> bool:
    """True when every query of a length-``seq_len`` sequence selects all of its causal keys ``[0, t]``.

    That holds when all complete pools fit into the ``topk // kpool`` budget and no token is left out of a pool
    (the tail is selected, or pools are single tokens). Then sparse attention equals dense causal attention.
    """
    return seq_len // kpool <= topk // kpool and (select_tail or kpool == 1)


def complete_pools_visible(query_positions: torch.Tensor, kpool: int) -> torch.Tensor:
    """Number of complete pools query ``t`` may select: ``(t + 1) // kpool`` (pools ``0 .. n - 1``)."""
    return torch.div(query_positions + 1, kpool, rounding_mode="floor")


def selected_pools(indices: torch.Tensor, topk: int, kpool: int) -> torch.Tensor:
    """Pool ids held by an index row's pool slots: ``[B, T, W] -> [B, T, topk // kpool]``, -1 for empty slots."""
    if indices.dim() != 3 or indices.shape[-1] < topk:
        raise ValueError(f"indices must be [B, T, W >= topk={topk}], got {tuple(indices.shape)}")
    firsts = indices[..., :topk:kpool]
    return torch.where(firsts >= 0, torch.div(firsts, kpool, rounding_mode="floor"), torch.full_like(firsts, -1))


def tail_slots(positions: torch.Tensor, kpool: int) -> torch.Tensor:
    """The ``kpool - 1`` tail slots of the queries at absolute ``positions [C]``: the tokens of each query's own
    incomplete pool up to itself, -1 past it (``[C, kpool - 1]``, positions' dtype)."""
    start = complete_pools_visible(positions, kpool) * kpool
    tail = start[:, None] + torch.arange(kpool - 1, device=positions.device, dtype=positions.dtype)[None, :]
    return tail.masked_fill(tail > positions[:, None], -1)


def index_rows(pools: torch.Tensor, *, query_offset: int, kpool: int, select_tail: bool,
               dtype: torch.dtype = torch.int64, out: torch.Tensor | None = None) -> torch.Tensor:
    """The index rows of the chosen ``pools [B, T, topk // kpool]`` (-1: empty slot, in any order) for queries at
    positions ``query_offset ..``: ``[B, T, W]`` in ``dtype`` (written into ``out`` when given). The selectors
    (reference, triton) build their rows with it, and ``index_rows(selected_pools(rows), ...)`` gives ``rows`` back
    exactly, so a selection can be kept at a quarter of its rows' size (kpool 4) and expanded when a later pass over
    the same positions needs it."""
    if pools.dim() != 3:
        raise ValueError(f"pools must be [B, T, topk // kpool], got {tuple(pools.shape)}")
    batch, seq_len, slots = pools.shape
    width = slots * kpool + (kpool - 1 if select_tail else 0)
    rows = torch.empty((batch, seq_len, width), dtype=dtype, device=pools.device) if out is None else out
    if rows.shape != (batch, seq_len, width) or rows.dtype != dtype:
        raise ValueError(f"out must be [B, T, W] = {[batch, seq_len, width]} {dtype}, got {tuple(rows.shape)} "
                         f"{rows.dtype}")
    within = torch.arange(kpool, device=pools.device, dtype=dtype)
    tokens = rows[..., : slots * kpool].view(batch, seq_len, slots, kpool)
    torch.add(within, pools.to(dtype)[..., None], alpha=kpool, out=tokens)
    tokens.masked_fill_((pools < 0)[..., None], -1)
    if select_tail and kpool > 1:
        positions = torch.arange(query_offset, query_offset + seq_len, device=pools.device)
        rows[..., slots * kpool:] = tail_slots(positions, kpool)[None].to(dtype)
    return rows
