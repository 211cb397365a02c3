"""DSA across context-parallel ranks: each piece's queries see the latent rows and pooled keys of the whole past.

Per DSA layer the ranks all-gather, for every position of the window, what later positions read: the latent row
``c [R]`` and, in layers with an indexer, the per-token indexer key and gate logits (``Di`` each). Every rank then
pools the keys over the WHOLE window in absolute positions (``pool_keys`` over positions ``0 .. T``), so a pool
that straddles a piece boundary (zigzag puts the two sides on different ranks) is the same pool, bit for bit, as in
one process; each piece takes the pools that end before its start and the keys of the pool it starts inside.
Gathering per-token keys rather than finished pools costs ``kpool`` times the pooled size (``Di`` against ``R``
per token, small beside the latent row) and makes the alignment hold by construction.

Each piece then runs the unchanged ``DSAAttention.forward`` as a chunk of the window (genolc/model/cache.py): the
gathered rows before its start are its ``past``, index rows are absolute positions, and its indexer KL is its
share of the window's (rows normalised by the window). Gradients reach the rows' owners through the gather's
reduce-scatter. Under the chunk-recurrent step the span is one chunk: the rows of earlier chunks come from the
cache (with the keys of the pool that straddles the chunk's start, so pools stay in absolute positions), and the
chunk's gathered rows, new pools and open pool go to ``cache.present`` on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genolc.model.cache import LayerCache, append_rows
from genolc.model.layers.dsa import DSAAttention, DSAOutput, indexer_grad, indexer_inputs
from genolc.parallel.collectives import anchor
from genolc.parallel.context import ContextParallel


@dataclass
class WindowRows:
    """One DSA layer's rows up to the end of the span, in absolute positions, the same on every rank."""

    latent: torch.Tensor                     # [B, stop, R]: positions 0 .. stop
    keys: torch.Tensor | None                # [B, stop - base, Di] indexer keys of positions base .. stop
    gates: torch.Tensor | None               # [B, stop - base, Di] their pool gate logits
    pooled: torch.Tensor | None              # [B, stop // kpool, Di] every complete pool, positions 0 .. stop
    base: int                                # first position of ``keys``: a pool boundary
    new_pools: torch.Tensor | None           # the pools the span completes
    span_latent: torch.Tensor                # [B, span, R] the span's own rows
    gathered: list[torch.Tensor]             # the collectives' outputs, for anchor()

    def past(self, start: int, kpool: int) -> dict[str, torch.Tensor]:
        """A chunk's ``LayerCache.past`` for a piece starting at ``start`` (genolc/model/cache.py)."""
        past = {"latent": self.latent[:, :start]}
        if self.pooled is not None:
            complete = start // kpool
            past["pooled"] = self.pooled[:, :complete]
            past["pool_tail_keys"] = self.keys[:, complete * kpool - self.base: start - self.base]
            past["pool_tail_gates"] = self.gates[:, complete * kpool - self.base: start - self.base]
        return past

    def present(self, kpool: int) -> dict[str, torch.Tensor]:
        """What the span leaves for later chunks, as ``DSAAttention.forward`` leaves it for one chunk."""
        present = {"latent": self.span_latent}
        if self.pooled is not None:
            complete = self.new_pools.shape[1] * kpool
            present["pooled"] = self.new_pools
            present["pool_tail_keys"] = self.keys[:, complete:]
            present["pool_tail_gates"] = self.gates[:, complete:]
        return present


def window_rows(layer, context: ContextParallel, hidden: torch.Tensor, indexer_loss: str | None,
                past: dict[str, torch.Tensor] | None = None) -> WindowRows:
    """All-gather one DSA layer's per-token rows of the span over the group, put them after the rows the chunk
    cache's ``past`` holds, and pool the indexer keys in absolute positions (from the last pool boundary before the
    span, whose keys the cache carries)."""
    past = past or {}
    latent = layer.latent_rows(hidden)
    latent_rows, gathered_latent = context.gather_pieces(context.split(latent))
    span_latent = torch.cat(latent_rows, dim=1)
    rows = WindowRows(latent=append_rows(past.get("latent"), span_latent), keys=None, gates=None, pooled=None,
                      base=0, new_pools=None, span_latent=span_latent, gathered=[gathered_latent])
    if layer.indexer is None:
        return rows
    with indexer_grad(indexer_loss):
        keys, gates = layer.indexer.key_rows(*indexer_inputs(indexer_loss, hidden))
    # Each gather is tied after the previous one so every rank runs the backward collectives in one order.
    key_rows, gathered_keys = context.gather_pieces(context.split(anchor(keys, gathered_latent)))
    gate_rows, gathered_gates = context.gather_pieces(context.split(anchor(gates, gathered_keys)))
    rows.gathered += [gathered_keys, gathered_gates]
    rows.keys = append_rows(past.get("pool_tail_keys"), torch.cat(key_rows, dim=1))
    rows.gates = append_rows(past.get("pool_tail_gates"), torch.cat(gate_rows, dim=1))
    rows.base = context.start // layer.kpool * layer.kpool
    with indexer_grad(indexer_loss):
        rows.new_pools = layer.indexer.pool(rows.keys, rows.gates)
    rows.pooled = append_rows(past.get("pooled"), rows.new_pools)
    return rows


def dsa_forward(layer, context: ContextParallel, hidden: torch.Tensor, shared_indices: torch.Tensor | None = None,
                indexer_loss: str | None = None, cache: LayerCache | None = None):
    """``DSAAttention.forward`` for this rank's concatenated pieces ``hidden [B, T_local, D]``; with ``cache`` the
    span is one chunk of the window (earlier rows in ``cache.past``, the chunk's rows to ``cache.present``)."""
    pieces = context.pieces
    rows = window_rows(layer, context, hidden, indexer_loss, None if cache is None else cache.past)
    if cache is not None:
        cache.present.update(rows.present(layer.kpool))
    aux = True if cache is None else cache.aux
    hiddens = context.split(hidden)
    shared = context.split(shared_indices) if shared_indices is not None else [None] * len(pieces)
    outputs, indices, kls = [], [], []
    for piece, piece_hidden, piece_shared in zip(pieces, hiddens, shared):
        piece_cache = LayerCache(start=piece.start, window_len=context.window_len,
                                 past=rows.past(piece.start, layer.kpool), aux=aux)
        out = DSAAttention.forward(layer, piece_hidden, shared_indices=piece_shared, indexer_loss=indexer_loss,
                                   cache=piece_cache)
        outputs.append(out.hidden)
        indices.append(out.indices)
        if out.indexer_kl is not None:
            kls.append(out.indexer_kl)
    kl = torch.stack(kls).sum() if kls else None
    return DSAOutput(hidden=anchor(torch.cat(outputs, dim=1), *rows.gathered), indices=torch.cat(indices, dim=1),
                     indexer_kl=kl)
