"""Chunk-recurrent exact training: one window's forward and backward, chunk by chunk.

Every layer is causal and only the cache entries of genolc/model/cache.py cross positions, so a window of ``T``
tokens trains in chunks of ``C`` with exactly the whole window's gradients (to rounding), in two passes:

1. Fill (no grad), chunks in order but the last: each chunk runs with the entries the earlier chunks left (KDA
   states and convolution tails, the pool straddling the boundary: "carried"; DSA latent rows and pooled indexer
   keys of every earlier position: "rows") and leaves its own. The MoE load of these chunks is counted here too:
   the balance loss needs each layer's share of token slots per expert over the window before a chunk's backward,
   and the last chunk, whose forward runs first in pass 2, adds its own slots to these in its MoE layers. The DSA
   layers' chosen pools are kept (int32, ``topk // kpool`` per token and layer) unless the step strategy says not
   to (``keep_selections``, genolc/train/strategy.py) or the process holds only a shard of each chunk. Nothing reads
   these forwards' outputs, so they make no logits and their last layer stops at its router (``logits=False``).
2. Backward, chunks last to first: chunk j's forward runs again with grad (the last chunk's for the first time:
   nothing later reads what it leaves, so a pass 1 forward of it would be thrown away), its past entries as leaves
   that require grad, attending to the pools pass 1 chose where they were kept (choosing again scores every earlier
   pool a second time, and a third under recompute); backward starts from chunk j's loss and from the gradients that
   later chunks already sent to what chunk j left (its carried entries' gradient from chunk j + 1, its rows'
   gradient summed over every later chunk, in fp32). The gradients reaching chunk j's past leaves go to the chunks
   before it. Given a :class:`genolc.train.kept_attention.KeptAttention`, the DSA layers' sparse-attention forwards
   of pass 1 are kept there (in host memory on CUDA) and pass 2 runs only their backward. With
   ``keep_kda_intermediates`` pass 2's KDA layers have fla keep what its backward would compute again
   (genolc/model/ops/kda/fla.py).

A process holding a shard of each chunk (context parallelism) fills every chunk in pass 1: its MoE layers' shares
are summed over the processes after that pass.

Parameters accumulate their gradients over the chunks as over micro-batches. Cost: two forwards (one for the last
chunk) and one backward, as per-layer recompute; memory: one chunk's activations plus the window's caches (O(T) rows
of the DSA latent and the pool keys, and their fp32 gradients; the chosen pools), so the window length is no longer
bounded by activations.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from genolc.model.cache import ATTENTION_LSE, ATTENTION_OUT, ROW_ENTRIES, ChunkCache, WindowCache, chunk_bounds
from genolc.model.layers.moe import window_fraction
from genolc.model.ops.weight_casts import weight_casts_per_step
from genolc.train.balance import add_expert_counts
from genolc.train.kept_attention import KeptAttention
from genolc.train.loss import LossParts, LossTerms, micro_batch_loss

EntryKey = tuple[int, str]          # (layer index, entry name)


class PassClock:
    """Marks on the device's own timeline: CUDA events on CUDA, which nothing waits for until :meth:`seconds` (the
    trainer reads them after the step has synchronised anyway), the host's clock elsewhere (CPU ops run as they are
    called)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._marks: list = []

    def mark(self) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Seconds between consecutive marks (on CUDA, once the last mark's work is done)."""
        if self.device.type != "cuda":
            return [end - start for start, end in zip(self._marks, self._marks[1:])]
        if self._marks:
            self._marks[-1].synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in zip(self._marks, self._marks[1:])]


@dataclass
class MicroBatchResult:
    """What one micro-batch's forward and backward leave for the step's metrics (all detached). ``passes``: the
    chunked step's marks at its start, after its first pass and at its end (:meth:`pass_seconds`)."""

    lm: torch.Tensor
    aux: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens_per_expert: dict[int, torch.Tensor] = field(default_factory=dict)
    passes: PassClock | None = None

    def pass_seconds(self) -> dict[str, float]:
        """``{"fill_pass_seconds", "grad_pass_seconds"}``: the chunked step's first pass (forwards without grad of
        every chunk but the last) and its second (every chunk's forward with grad and backward), on the device's
        timeline; empty for a step that is not chunked."""
        if self.passes is None:
            return {}
        fill, grad = self.passes.seconds()
        return {"fill_pass_seconds": fill, "grad_pass_seconds": grad}


class ChunkShard(Protocol):
    """How a process that holds only part of each chunk takes part (context parallelism, genolc/parallel):
    ``take(tensor, start, stop)`` gives its positions of chunk ``start .. stop`` of a whole-window ``[B, T, ...]``
    tensor (and readies the model for that chunk); ``window_counts(counts)`` sums the first pass's tokens per expert
    over the processes sharing the window. The model must then leave the chunk's cache entries identical on every
    such process (see genolc/parallel/context.py for why the backward stays exact)."""

    def take(self, tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor: ...

    def window_counts(self, counts: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]: ...


def chunked_forward_backward(model: torch.nn.Module, ids: torch.Tensor, weights: torch.Tensor, terms: LossTerms,
                             chunk: int, autocast: Callable[[], AbstractContextManager],
                             on_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
                             shard: ChunkShard | None = None, keep_selections: bool = True,
                             kept_attention: KeptAttention | None = None,
                             keep_kda_intermediates: bool = False) -> MicroBatchResult:
    """Forward and backward of one micro-batch ``ids [B, T + 1]`` (inputs ``[:, :-1]``, targets ``[:, 1:]``,
    target weights ``[B, T]``) in chunks of ``chunk`` tokens; parameters' ``.grad`` accumulate as for
    ``micro_batch_loss(model(ids[:, :-1])).loss.backward()``. ``autocast()`` opens the compute-precision context;
    ``on_loss`` sees (and may replace, or refuse by raising) each chunk's loss before its backward. ``shard``: this
    process holds only its share of each chunk (:class:`ChunkShard`); its ``.grad`` is then its share of the
    window's gradient, and the returned counts are its own tokens'. ``keep_selections``: keep the DSA pools the
    first pass chose for the second (off: choose them again; genolc/train/strategy.py decides which).
    ``kept_attention``: keep the DSA layers' sparse-attention forwards of the first pass there, for the second to
    run only their backward (genolc/train/kept_attention.py; only with the pools kept, and not under ``shard``).
    ``keep_kda_intermediates``: the second pass's KDA layers keep fla's intermediates for their backward (more memory,
    planned by genolc/train/strategy.py; not under ``shard``, whose KDA runs genolc/parallel's ops)."""
    if kept_attention is not None and (shard is not None or not keep_selections):
        raise ValueError("the DSA forwards can be kept only with the pools they attended to, and not on a shard")
    if keep_kda_intermediates and shard is not None:
        raise ValueError("KDA's intermediates are kept only by one process's chunks, not on a shard")
    # The routed experts' weights are cast to the compute dtype once for this micro-batch's every forward, and their
    # gradients added into .grad directly (genolc/model/ops/weight_casts.py).
    with weight_casts_per_step():
        return _chunked_forward_backward(model, ids, weights, terms, chunk, autocast, on_loss, shard, keep_selections,
                                         kept_attention, keep_kda_intermediates)


def compute_dtype_rows(autocast: Callable[[], AbstractContextManager], device: torch.device, *,
                       sharded: bool = False) -> dict[str, torch.dtype]:
    """The row entries the window keeps in the chunks' compute dtype: on CUDA under autocast, the DSA latent rows,
    unless the process holds a shard of each chunk.

    They come out of an fp32-weighted RMSNorm in fp32, but there every reader takes them in the compute dtype (the
    sparse-attention kernels and the indexer loss's target cast them, a dense attention's key/value projection too),
    so the window holds what they read. Kept in fp32, each chunk's forward concatenated the window's rows in fp32
    and cast the result ([B, S, R], S up to the window) for the kernels, and its backward cast their gradient back
    to fp32: some 18 bytes a row element more traffic per DSA layer and chunk, and twice the rows' memory. The
    values are the same (the cast of the concatenation is the concatenation of the casts; the kernels sum the
    rows' gradient in fp32 and round it once either way, and the window adds it up in fp32). Off CUDA the reference
    attention would sum that gradient in the rows' own dtype, so there they stay as written. On a shard (context
    parallel, genolc/parallel/dsa_cp.py) a rank's two zigzag pieces both read the window's rows, and autograd would
    add their two gradients in the rows' dtype: there too they stay fp32."""
    if device.type != "cuda" or sharded:
        return {}
    with autocast():
        if torch.is_autocast_enabled(device.type):
            return {"latent": torch.get_autocast_dtype(device.type)}
    return {}


def _chunked_forward_backward(model, ids, weights, terms, chunk, autocast, on_loss, shard, keep_selections,
                              kept_attention, keep_kda_intermediates) -> MicroBatchResult:
    inputs, targets = ids[:, :-1], ids[:, 1:]
    window_len = inputs.shape[1]

    def part(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return tensor[:, start:stop] if shard is None else shard.take(tensor, start, stop)

    bounds = chunk_bounds(window_len, chunk)
    mode = terms.indexer_mode
    passes = PassClock(ids.device)
    passes.mark()

    # The last chunk skips the first pass: nothing later reads what it leaves, so its one forward runs with grad
    # at the head of the second pass, its MoE layers adding their own slots to the other chunks' for the window's
    # shares. A shard's layers count the window's slots across processes after the first pass and need them all.
    filled = bounds if shard is not None else bounds[:-1]
    # The DSA layers' chosen pools are kept from the first pass for the second (genolc/model/cache.py); a shard's
    # layers choose per piece (genolc/parallel/dsa_cp.py) and keep none.
    window = WindowCache(model.config.num_hidden_layers, window_len, keep_selections=keep_selections and shard is None,
                         filled_len=filled[-1][1] if filled else window_len,
                         row_dtypes=compute_dtype_rows(autocast, ids.device, sharded=shard is not None))
    carried: list[dict[EntryKey, torch.Tensor]] = []      # the carried entries at each chunk's start
    row_starts: list[dict[EntryKey, int]] = []            # each row entry's length at each chunk's start
    counts: dict[int, torch.Tensor] = {}
    if kept_attention is not None:
        kept_attention.clear()
    with torch.no_grad():
        for start, stop in filled:
            carried.append(window.carried)
            row_starts.append(window.row_lengths())
            cache = window.chunk(start)
            for layer_cache in cache.layers:
                layer_cache.keep_attention = kept_attention is not None
            with autocast():
                out = model(part(inputs, start, stop), indexer_loss=mode, cache=cache, logits=False)
            add_expert_counts(counts, out.tokens_per_expert)
            if kept_attention is not None:
                for layer, layer_cache in enumerate(cache.layers):
                    if ATTENTION_OUT in layer_cache.present:
                        kept_attention.put(start, layer, layer_cache.present.pop(ATTENTION_OUT),
                                           layer_cache.present.pop(ATTENTION_LSE))
            window.commit(cache, stop)
            del out, cache
    passes.mark()
    if len(filled) < len(bounds):
        carried.append(window.carried)
        row_starts.append(window.row_lengths())
    rows = window.rows
    fractions = {}
    if len(filled) == len(bounds):
        window_counts = counts if shard is None else shard.window_counts(counts)
        fractions = {layer: window_fraction(c) for layer, c in window_counts.items()}
    no_slots = torch.zeros(model.config.n_routed_experts, dtype=torch.int64, device=ids.device)

    row_grads = {key: torch.zeros(store.prefix().shape, dtype=torch.float32, device=store.buffer.device)
                 for key, store in rows.items()}
    carried_grads: dict[EntryKey, torch.Tensor] = {}
    # Summed on the device and read back once: a read-back per chunk would drain the launch queue each time.
    lm = torch.zeros((), dtype=torch.float64, device=ids.device)
    aux: dict[str, torch.Tensor] = {}
    for j in range(len(bounds) - 1, -1, -1):
        start, stop = bounds[j]
        cache = ChunkCache.empty(model.config.num_hidden_layers, start=start, window_len=window_len, aux=True)
        leaves: dict[EntryKey, torch.Tensor] = {}
        for key, value in carried[j].items():
            leaves[key] = value.detach().requires_grad_(value.is_floating_point())
        for key, length in row_starts[j].items():
            leaves[key] = rows[key].prefix(length).detach().requires_grad_(True)
        for (layer, name), leaf in leaves.items():
            cache.layers[layer].past[name] = leaf
        for layer, fraction in fractions.items():
            cache.layers[layer].expert_fraction = fraction
        if j == len(filled):
            for layer, layer_cache in enumerate(cache.layers):
                layer_cache.expert_counts_elsewhere = counts.get(layer, no_slots)
                # Its pools are chosen here; kept, a per-layer replay attends to them rather than choosing again.
                layer_cache.keep_selection = window.keep_selections
        for layer, layer_cache in enumerate(cache.layers):
            layer_cache.selection = window.selection(layer, start, stop)
            layer_cache.keep_kda_intermediates = keep_kda_intermediates
            if kept_attention is not None:
                layer_cache.attention = kept_attention.take(start, layer, ids.device)
        if kept_attention is not None and j > 0:
            # The previous chunk's forwards come back while this chunk computes.
            kept_attention.prefetch(bounds[j - 1][0], ids.device)
        with autocast():
            out = model(part(inputs, start, stop), indexer_loss=mode, cache=cache)
        if j == len(filled):
            add_expert_counts(counts, out.tokens_per_expert)
            fractions = {layer: window_fraction(c) for layer, c in counts.items()}
        parts: LossParts = micro_batch_loss(out, part(targets, start, stop), part(weights, start, stop), terms)
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
        lm += parts.lm.double()
        for name, value in parts.aux.items():
            aux[name] = aux.get(name, 0) + value
        carried[j] = {}
        del out, cache, leaves, roots, root_grads, parts, loss
    passes.mark()
    return MicroBatchResult(lm=lm.cpu(), aux=aux, tokens_per_expert=counts, passes=passes)
