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

Window-wide quantities that a chunk cannot see but the whole-window loss uses come with the cache, so the chunks'
losses add up to the whole window's: the window length (the indexer KL is a mean over the window's rows) and, for
the MoE balance loss, each layer's fraction of token slots per expert over the window (known after a no-grad pass).
``aux=False`` skips the auxiliary losses (a pass that only fills caches). The trainer's chunked step
(genolc/train/chunked.py) and chunked evaluation drive this interface; the layers only read and write it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Entries that grow by one row per token (or per pool) of the window; all others are carried chunk to chunk.
ROW_ENTRIES = frozenset({"latent", "pooled"})


@dataclass
class LayerCache:
    """One decoder layer's view of the window outside the current chunk (see the module docstring)."""

    start: int                                             # absolute position of the chunk's first token
    window_len: int                                        # tokens in the whole window
    past: dict[str, torch.Tensor] = field(default_factory=dict)
    present: dict[str, torch.Tensor] = field(default_factory=dict)
    expert_fraction: torch.Tensor | None = None            # MoE: [E] share of the window's token slots per expert
    aux: bool = True                                       # compute this chunk's share of the auxiliary losses


@dataclass
class ChunkCache:
    """What ``GenomeLM.forward`` needs to run one chunk of a window: one :class:`LayerCache` per decoder layer."""

    start: int
    window_len: int
    layers: list[LayerCache]

    @classmethod
    def empty(cls, num_layers: int, *, start: int, window_len: int, aux: bool = True) -> "ChunkCache":
        if start < 0 or window_len < 1 or start >= window_len:
            raise ValueError(f"a chunk must start inside its window: start {start}, window {window_len}")
        return cls(start, window_len, [LayerCache(start, window_len, aux=aux) for _ in range(num_layers)])


def chunk_bounds(length: int, chunk: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``0 .. length`` in chunks of ``chunk`` tokens (the last may be shorter)."""
    if chunk < 1:
        raise ValueError(f"chunk length must be positive, got {chunk}")
    return [(start, min(start + chunk, length)) for start in range(0, length, chunk)]


def append_rows(past: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    """``past [B, n, X]`` followed by ``rows [B, m, X]`` along dim 1 (``rows`` alone when there is no past)."""
    if past is None or past.shape[1] == 0:
        return rows
    return torch.cat([past.to(rows.dtype), rows], dim=1)
