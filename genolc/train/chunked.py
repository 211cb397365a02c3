"""Chunk-recurrent exact training: one window's forward and backward, chunk by chunk.

Every layer is causal and only the cache entries of genolc/model/cache.py cross positions, so a window of ``T``
tokens trains in chunks of ``C`` with exactly the whole window's gradients (to rounding), in two passes:

1. Fill (no grad), chunks in order: each chunk runs with the entries the earlier chunks left (KDA states and
   convolution tails, the pool straddling the boundary: "carried"; DSA latent rows and pooled indexer keys of every
   earlier position: "rows") and leaves its own. The MoE load of the whole window is counted here too: the balance
   loss needs each layer's share of token slots per expert over the window before any chunk's backward.
2. Backward, chunks last to first: chunk j's forward runs again with grad, its past entries as leaves that require
   grad; backward starts from chunk j's loss and from the gradients that later chunks already sent to what chunk j
   left (its carried entries' gradient from chunk j + 1, its rows' gradient summed over every later chunk, in
   fp32). The gradients reaching chunk j's past leaves go to the chunks before it.

Parameters accumulate their gradients over the chunks as over micro-batches. Cost: two forwards and one backward, as
per-layer recompute; memory: one chunk's activations plus the window's caches (O(T) rows of the DSA latent and the
pool keys, and their fp32 gradients), so the window length is no longer bounded by activations.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable

import torch

from genolc.model.cache import ROW_ENTRIES, ChunkCache, chunk_bounds
from genolc.train.balance import add_expert_counts
from genolc.train.loss import LossParts, LossTerms, micro_batch_loss

EntryKey = tuple[int, str]          # (layer index, entry name)


@dataclass
class MicroBatchResult:
    """What one micro-batch's forward and backward leave for the step's metrics (all detached)."""

    lm: torch.Tensor
    aux: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens_per_expert: dict[int, torch.Tensor] = field(default_factory=dict)


class RowStore:
    """One row entry of the whole window (e.g. a DSA layer's latent rows), appended chunk by chunk into a buffer
    that grows to the window's size once (its final length is extrapolated from the first chunks)."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.length = 0

    def append(self, rows: torch.Tensor, progress: float) -> None:
        """``rows [B, n, X]``; ``progress``: the share of the window done after this chunk (sizes the buffer)."""
        needed = self.length + rows.shape[1]
        if self.buffer is None or needed > self.buffer.shape[1]:
            capacity = max(needed, int(needed / max(progress, 1e-9)) + 1)
            grown = rows.new_empty((rows.shape[0], capacity, *rows.shape[2:]))
            if self.buffer is not None:
                grown[:, : self.length] = self.buffer[:, : self.length]
            self.buffer = grown
        self.buffer[:, self.length: needed] = rows
        self.length = needed

    def prefix(self, length: int) -> torch.Tensor:
        if self.buffer is None:
            raise RuntimeError("no rows stored yet")
        return self.buffer[:, :length]


def _chunk_cache(model, start: int, window_len: int, aux: bool) -> ChunkCache:
    return ChunkCache.empty(model.config.num_hidden_layers, start=start, window_len=window_len, aux=aux)


def chunked_forward_backward(model: torch.nn.Module, ids: torch.Tensor, weights: torch.Tensor, terms: LossTerms,
                             chunk: int, autocast: Callable[[], AbstractContextManager],
                             on_loss: Callable[[torch.Tensor], torch.Tensor] | None = None) -> MicroBatchResult:
    """Forward and backward of one micro-batch ``ids [B, T + 1]`` (inputs ``[:, :-1]``, targets ``[:, 1:]``,
    target weights ``[B, T]``) in chunks of ``chunk`` tokens; parameters' ``.grad`` accumulate as for
    ``micro_batch_loss(model(ids[:, :-1])).loss.backward()``. ``autocast()`` opens the compute-precision context;
    ``on_loss`` sees (and may replace, or refuse by raising) each chunk's loss before its backward."""
    inputs, targets = ids[:, :-1], ids[:, 1:]
    window_len = inputs.shape[1]
    bounds = chunk_bounds(window_len, chunk)
    mode = terms.indexer_mode

    carried: list[dict[EntryKey, torch.Tensor]] = [{} for _ in bounds]
    rows: dict[EntryKey, RowStore] = {}
    row_starts: list[dict[EntryKey, int]] = []
    counts: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for j, (start, stop) in enumerate(bounds):
            cache = _chunk_cache(model, start, window_len, aux=False)
            for (layer, name), value in carried[j].items():
                cache.layers[layer].past[name] = value
            row_starts.append({key: store.length for key, store in rows.items()})
            for (layer, name), store in rows.items():
                cache.layers[layer].past[name] = store.prefix(store.length)
            with autocast():
                out = model(inputs[:, start:stop], indexer_loss=mode, cache=cache)
            add_expert_counts(counts, out.tokens_per_expert)
            for layer, layer_cache in enumerate(cache.layers):
                for name, value in layer_cache.present.items():
                    if name in ROW_ENTRIES:
                        rows.setdefault((layer, name), RowStore()).append(value, stop / window_len)
                    elif j + 1 < len(bounds):
                        # A copy: the present is often a view of a whole chunk-sized tensor.
                        carried[j + 1][(layer, name)] = value.clone()
            del out, cache
    fractions = {layer: (c.double() / c.sum().clamp_min(1)).float() for layer, c in counts.items()}

    row_grads = {key: torch.zeros(store.buffer.shape[0], store.length, *store.buffer.shape[2:],
                                  dtype=torch.float32, device=store.buffer.device) for key, store in rows.items()}
    carried_grads: dict[EntryKey, torch.Tensor] = {}
    lm = torch.zeros((), dtype=torch.float64)
    aux: dict[str, torch.Tensor] = {}
    for j in range(len(bounds) - 1, -1, -1):
        start, stop = bounds[j]
        cache = _chunk_cache(model, start, window_len, aux=True)
        leaves: dict[EntryKey, torch.Tensor] = {}
        for key, value in carried[j].items():
            leaves[key] = value.detach().requires_grad_(value.is_floating_point())
        for key, length in row_starts[j].items():
            leaves[key] = rows[key].prefix(length).detach().requires_grad_(True)
        for (layer, name), leaf in leaves.items():
            cache.layers[layer].past[name] = leaf
        for layer, fraction in fractions.items():
            cache.layers[layer].expert_fraction = fraction
        with autocast():
            out = model(inputs[:, start:stop], indexer_loss=mode, cache=cache)
        parts: LossParts = micro_batch_loss(out, targets[:, start:stop], weights[:, start:stop], terms)
        loss = parts.loss if on_loss is None else on_loss(parts.loss)
        roots, root_grads = [loss], [None]
        for layer, layer_cache in enumerate(cache.layers):
            for name, value in layer_cache.present.items():
                key = (layer, name)
                if not value.requires_grad:
                    continue
                if name in ROW_ENTRIES:
                    if j == len(bounds) - 1:
                        continue            # no later chunk reads the last chunk's rows
                    offset = row_starts[j].get(key, 0)
                    grad = row_grads[key][:, offset: offset + value.shape[1]]
                else:
                    grad = carried_grads.pop(key, None)
                if grad is not None:
                    roots.append(value)
                    root_grads.append(grad.to(value.dtype))
        torch.autograd.backward(roots, root_grads)
        for key, leaf in leaves.items():
            if leaf.grad is None:
                continue
            if key[1] in ROW_ENTRIES:
                row_grads[key][:, : leaf.shape[1]] += leaf.grad
            else:
                carried_grads[key] = leaf.grad
        lm += parts.lm.double().cpu()
        for name, value in parts.aux.items():
            aux[name] = aux.get(name, 0) + value
        carried[j] = {}
        del out, cache, leaves, roots, root_grads, parts, loss
    return MicroBatchResult(lm=lm, aux=aux, tokens_per_expert=counts)
