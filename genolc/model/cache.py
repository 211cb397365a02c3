"""The model's chunk interface: run a window in consecutive chunks, each chunk seeing what earlier chunks left.

Every layer of the architecture is causal, and only three things cross positions:

- the KDA recurrent state and the last ``kernel - 1`` inputs of its short convolution ("carried" entries: each chunk
  hands the next one a fixed-size value);
- the DSA layers' latent KV rows of every earlier token and, in layers with an indexer, the pooled indexer keys of
  every earlier complete pool ("row" entries: each chunk appends its rows to the window's);
- the keys and gate logits of the indexer pool that straddles a chunk boundary (carried).

mHC, norms, MoE and the loss are per token. So ``GenomeLM.forward(ids[:, s:e], cache=ChunkCache(...))`` computes
exactly the logits of positions ``s .. e-1`` of the whole window, given in ``cache`` what positions ``0 .. s-1``
left behind (``LayerCache.past``); each layer writes what its own positions leave behind into
``LayerCache.present``. Entry names and kinds:

    KDA layers    "state" [B, H, Dk, Dv] fp32 (carried), "conv_tail" [B, <= kernel - 1, 3 W] (carried)
    DSA layers    "latent" [B, rows, R] (rows), and with an indexer "pooled" [B, pools, Di] (rows),
                  "pool_tail_keys" / "pool_tail_gates" [B, s % kpool, Di] (carried)

A past row entry holds the rows of all earlier positions; the present one only the rows this chunk adds. A past
carried entry is the value after the previous chunk; the present one the value after this chunk.

One more entry crosses passes rather than positions: a DSA layer with an indexer asked to (``keep_selection``)
writes the pools it chose for its own positions, ``"selection" [B, T, topk // kpool]`` (int32, -1 empty), and a
later pass over the same chunk that is handed them (``LayerCache.selection``) attends to those pools rather than
choosing again. The chunked training step keeps them from its first pass for its second and for per-layer recompute
(the last chunk's, which skips the first pass, from its one forward for its replay: :meth:`LayerCache.replay`): the
choice (scoring every earlier pool, a top-k over them) costs time that grows with the window, and the same pools in
every pass make the backward that of the forward whose caches later chunks read. A DSA layer's sparse attention
forward can cross passes too: asked to (``keep_attention``) in a pass without grad, the layer writes its ``(o_lat,
lse)`` as ``"attention_out"`` / ``"attention_lse"``, and a later pass handed them (``LayerCache.attention``) runs
only the attention's backward (genolc/train/kept_attention.py). ``WindowCache`` leaves these to its caller. A KDA
layer asked to (``keep_kda_intermediates``, a pass with grad) has its op keep what its backward would compute again
(genolc/model/ops/kda/fla.py); the caller plans that memory.

Window-wide quantities that a chunk cannot see but the whole-window loss uses come with the cache, so the chunks'
losses add up to the whole window's: the window length (the indexer KL is a mean over the window's rows) and, for
the MoE balance loss, each layer's fraction of token slots per expert over the window (known after a no-grad pass;
or, for the chunk that pass left out, the other chunks' slots, to which the layer adds its own).
``aux=False`` skips the auxiliary losses (a pass that only fills caches). The trainer's chunked step
(genolc/train/chunked.py) and chunked evaluation drive this interface; the layers only read and write it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

# Entries that grow by one row per token (or per pool) of the window; all others but SELECTION are carried chunk to
# chunk.
ROW_ENTRIES = frozenset({"latent", "pooled"})
SELECTION = "selection"
# A DSA layer's sparse-attention forward, kept from one pass for the next (``LayerCache.keep_attention``).
ATTENTION_OUT = "attention_out"
ATTENTION_LSE = "attention_lse"


@dataclass
class LayerCache:
    """One decoder layer's view of the window outside the current chunk (see the module docstring)."""

    start: int                                             # absolute position of the chunk's first token
    window_len: int                                        # tokens in the whole window
    past: dict[str, torch.Tensor] = field(default_factory=dict)
    present: dict[str, torch.Tensor] = field(default_factory=dict)
    expert_fraction: torch.Tensor | None = None            # MoE: [E] share of the window's token slots per expert
    expert_counts_elsewhere: torch.Tensor | None = None    # MoE: [E] slots of the window's other chunks (the layer
                                                           # adds its own for the share, when no fraction is given)
    aux: bool = True                                       # compute this chunk's share of the auxiliary losses
    keep_selection: bool = False                           # DSA: write the chosen pools to present["selection"]
    selection: torch.Tensor | None = None                  # DSA: pools an earlier pass chose for these positions
    keep_attention: bool = False                           # DSA: write (o_lat, lse) of a no-grad pass to present
    attention: tuple[torch.Tensor, torch.Tensor] | None = None  # DSA: (o_lat, lse) an earlier pass kept
    keep_kda_intermediates: bool = False                   # KDA: the op keeps its intermediates for backward

    def replay(self) -> "LayerCache":
        """The same view with a present of its own, for a forward that runs again only to recompute activations
        (per-layer recompute): its entries are thrown away, so they cannot keep the replay's graph alive. Pools
        that this view's forward chose and kept (``keep_selection``) become the replay's ``selection``: it attends
        to them without choosing again."""
        selection = self.selection if self.selection is not None else self.present.get(SELECTION)
        return replace(self, present={}, selection=selection, keep_selection=False)


@dataclass
class ChunkCache:
    """What ``GenomeLM.forward`` needs to run one chunk of a window: one :class:`LayerCache` per decoder layer."""

    start: int
    window_len: int
    layers: list[LayerCache]

    @classmethod
    def empty(cls, num_layers: int, *, start: int, window_len: int, aux: bool = True,
              keep_selection: bool = False) -> "ChunkCache":
        if start < 0 or window_len < 1 or start >= window_len:
            raise ValueError(f"a chunk must start inside its window: start {start}, window {window_len}")
        return cls(start, window_len, [LayerCache(start, window_len, aux=aux, keep_selection=keep_selection)
                                       for _ in range(num_layers)])


def chunk_bounds(length: int, chunk: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``0 .. length`` in chunks of ``chunk`` tokens (the last may be shorter)."""
    if chunk < 1:
        raise ValueError(f"chunk length must be positive, got {chunk}")
    return [(start, min(start + chunk, length)) for start in range(0, length, chunk)]


def append_rows(past: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    """``past [B, n, X]`` followed by ``rows [B, m, X]`` along dim 1 in the past's dtype (``rows`` alone when there is
    no past): a window's rows stay in the dtype it keeps them in (:class:`WindowCache`'s ``row_dtypes``)."""
    if past is None or past.shape[1] == 0:
        return rows
    return torch.cat([past, rows.to(past.dtype)], dim=1)


class RowStore:
    """One row entry of a whole window (e.g. a DSA layer's latent rows), appended chunk by chunk into a buffer that
    grows to the window's size once (its final length is extrapolated from the first chunks). ``dtype``: the
    buffer's (None: that of the first rows appended)."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self.buffer: torch.Tensor | None = None
        self.length = 0

    def append(self, rows: torch.Tensor, progress: float) -> None:
        """``rows [B, n, X]``; ``progress``: the share of the window done after this chunk (sizes the buffer)."""
        needed = self.length + rows.shape[1]
        if self.buffer is None or needed > self.buffer.shape[1]:
            capacity = max(needed, int(needed / max(progress, 1e-9)) + 1)
            dtype = self.dtype or (rows.dtype if self.buffer is None else self.buffer.dtype)
            grown = rows.new_empty((rows.shape[0], capacity, *rows.shape[2:]), dtype=dtype)
            if self.buffer is not None:
                grown[:, : self.length] = self.buffer[:, : self.length]
            self.buffer = grown
        self.buffer[:, self.length: needed] = rows.detach()
        self.length = needed

    def prefix(self, length: int | None = None) -> torch.Tensor:
        if self.buffer is None:
            raise RuntimeError("no rows stored yet")
        return self.buffer[:, : self.length if length is None else length]


class WindowCache:
    """What a window's chunks have left so far, for running them in order (inference, and the first pass of the
    chunked training step): the latest carried entries and every row entry.

    ``cache = window.chunk(start, stop)`` gives the :class:`ChunkCache` for the next chunk, ``window.commit(cache)``
    takes in what it left (detached copies: a present is often a view of a chunk-sized tensor). With
    ``keep_selections`` the DSA layers' chosen pools are kept too, for :meth:`selection` to hand to a later pass.
    ``row_dtypes`` names row entries kept in another dtype than the layers write them in (the chunked training step
    keeps the DSA latent rows in the compute dtype); later chunks read them in it (:func:`append_rows`).
    """

    def __init__(self, num_layers: int, window_len: int, *, keep_selections: bool = False,
                 filled_len: int | None = None, row_dtypes: dict[str, torch.dtype] | None = None) -> None:
        unknown = set(row_dtypes or {}) - ROW_ENTRIES
        if unknown:
            raise ValueError(f"row_dtypes names {sorted(unknown)}, not row entries ({sorted(ROW_ENTRIES)})")
        self.num_layers = num_layers
        self.window_len = window_len
        self.keep_selections = keep_selections
        self.row_dtypes = dict(row_dtypes or {})
        # How far the committed chunks will reach (the whole window unless a caller stops short): sizes the rows'
        # buffers.
        self.filled_len = window_len if filled_len is None else filled_len
        self.carried: dict[tuple[int, str], torch.Tensor] = {}
        self.rows: dict[tuple[int, str], RowStore] = {}
        self.selections: dict[int, RowStore] = {}

    def row_lengths(self) -> dict[tuple[int, str], int]:
        return {key: store.length for key, store in self.rows.items()}

    def selection(self, layer: int, start: int, stop: int) -> torch.Tensor | None:
        """The pools layer ``layer`` chose for positions ``start .. stop - 1`` (None when it kept none for them)."""
        store = self.selections.get(layer)
        if store is None or store.length < stop:
            return None
        return store.buffer[:, start:stop]

    def chunk(self, start: int, *, aux: bool = False) -> ChunkCache:
        cache = ChunkCache.empty(self.num_layers, start=start, window_len=self.window_len, aux=aux,
                                 keep_selection=self.keep_selections)
        for (layer, name), value in self.carried.items():
            cache.layers[layer].past[name] = value
        for (layer, name), store in self.rows.items():
            cache.layers[layer].past[name] = store.prefix()
        return cache

    def commit(self, cache: ChunkCache, stop: int) -> None:
        carried = {}
        for layer, layer_cache in enumerate(cache.layers):
            for name, value in layer_cache.present.items():
                if name in (ATTENTION_OUT, ATTENTION_LSE):
                    continue
                if name == SELECTION:
                    if self.keep_selections:
                        self.selections.setdefault(layer, RowStore()).append(value, stop / self.filled_len)
                elif name in ROW_ENTRIES:
                    if (layer, name) not in self.rows:
                        self.rows[(layer, name)] = RowStore(self.row_dtypes.get(name))
                    self.rows[(layer, name)].append(value, stop / self.filled_len)
                else:
                    carried[(layer, name)] = value.detach().clone()
        self.carried = carried

    def fork(self, batch_rows: torch.Tensor, window_len: int) -> "WindowCache":
        """A copy that holds only batch rows ``batch_rows`` (in that order) of what the chunks so far left, for
        continuing those rows, possibly repeated, as windows of ``window_len`` tokens that share this prefix. Kept
        selections are not copied: they belong to a pass over this window's own chunks."""
        if window_len < max((store.length for store in self.rows.values()), default=0):
            raise ValueError(f"a fork's window ({window_len}) must hold the prefix it continues")
        fork = WindowCache(self.num_layers, window_len, row_dtypes=self.row_dtypes)
        fork.carried = {key: value.index_select(0, batch_rows.to(value.device)) for key, value in self.carried.items()}
        for key, store in self.rows.items():
            copy = RowStore(store.dtype)
            copy.buffer = store.prefix().index_select(0, batch_rows.to(store.buffer.device))
            copy.length = store.length
            fork.rows[key] = copy
        return fork
