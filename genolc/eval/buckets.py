"""Position buckets, 16 kb target blocks and the stratified block bootstrap.

Position of a target = the number of tokens before it in its evaluation window (target ``i`` of a window has
``i`` tokens of visible context). Buckets are on a log2 scale: ``[0, 1k), [1k, 2k), [2k, 4k), …`` with k = 1024,
and the last bucket runs up to and including the largest position (``window tokens - 1``), so a window of
``seq + 1`` tokens ends with ``[seq/2, seq]`` instead of a one-token bucket.

Estimator. Loss is reported in bits per base: for a set of targets, ``sum(bits) / sum(bases)`` where a target
token's bits are ``-log2 p(token)`` and its bases are ``tokenizer.token_lengths`` (a ratio estimator: multi-base
tokens count once per base, so the number does not depend on the tokenizer). Targets are grouped into blocks of
16,384 bases (by each target's base offset inside its window), so a block is a contiguous run of targets of one
window. A bootstrap replicate redraws, inside each window (the strata), as many blocks as the window has, with
replacement; windows with a single block are pooled into one stratum so they still vary. Each replicate computes
the same ratio from the redrawn blocks' per-bucket sums; the 95% interval is the 2.5/97.5 percentiles of the
replicates (replicates in which a bucket drew no targets are left out for that bucket). A bucket whose targets
all lie in one block (e.g. the early buckets of a single scored window: [0,1k) … [8k,16k) share its first block)
gets no interval: that block is redrawn whole, so the replicates could not vary and a zero-width interval would
claim a precision the data cannot show. An interval from fewer than FEW_BLOCKS_FOR_CI blocks (e.g. every bucket
below 128k of two 512k windows: 2 to 8 blocks) is kept but flagged in the reports: it is the spread of a few
windows, not a 95% interval. Every statistic carries its block count (``Interval.blocks``). Blocks keep the
autocorrelation of loss along the sequence (repeats, isochores) inside a resampling unit, which a per-token
bootstrap would ignore and so give intervals that are far too narrow. Paired differences (model vs baseline,
truncated vs full context) use the same redrawn blocks for both sides, so shared sequence difficulty cancels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from genolc.units import format_length

FIRST_EDGE = 1024
# Blocks holding a bucket's targets needed for its interval (one block is redrawn whole: no variation).
MIN_BLOCKS_FOR_CI = 2
# Below this many blocks the percentile interval is the spread of a handful of windows, not a 95% interval: the
# reports keep it but mark it.
FEW_BLOCKS_FOR_CI = 10
BLOCK_BASES = 16 * 1024
LN2 = math.log(2.0)


def bucket_edges(max_position: int, first_edge: int = FIRST_EDGE) -> np.ndarray:
    """int64 edges ``e`` with bucket ``b = [e[b], e[b+1])`` covering positions ``0..max_position`` inclusive.

    >>> bucket_edges(4096).tolist()   # a window of 4097 tokens: positions 0..4096
    [0, 1024, 2048, 4097]
    """
    if max_position < 0:
        raise ValueError(f"max_position must be >= 0, got {max_position}")
    if first_edge < 1:
        raise ValueError(f"first_edge must be >= 1, got {first_edge}")
    edges = [0]
    edge = first_edge
    while edge < max_position:
        edges.append(edge)
        edge *= 2
    edges.append(max_position + 1)
    return np.asarray(edges, dtype=np.int64)


def bucket_index(positions: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bucket of each position (int64 [n]); ValueError for a position outside the edges."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size and (positions.min() < edges[0] or positions.max() >= edges[-1]):
        raise ValueError(f"positions span [{positions.min()}, {positions.max()}] outside edges [{edges[0]}, {edges[-1]})")
    return np.searchsorted(edges, positions, side="right") - 1


def bucket_labels(edges: np.ndarray) -> list[str]:
    """'[0,1k)', '[1k,2k)', …; the last bucket is shown closed at the largest position ('[256k,512k]')."""
    labels = []
    for b in range(len(edges) - 1):
        lo, hi = int(edges[b]), int(edges[b + 1])
        if b == len(edges) - 2:
            labels.append(f"[{format_length(lo)},{format_length(hi - 1)}]")
        else:
            labels.append(f"[{format_length(lo)},{format_length(hi)})")
    return labels


def bits_per_base(logprob: np.ndarray, token_bases: np.ndarray) -> np.ndarray:
    """Per-target bits per base: ``-logprob / ln 2 / bases``. logprob: natural-log probability of each target.

    A 6-mer token predicted with probability 1/4096 costs 12 bits over 6 bases = 2 bits/base, the same as six
    single bases each at 1/4, so numbers are comparable across tokenizers.
    """
    logprob = np.asarray(logprob, dtype=np.float64)
    token_bases = np.asarray(token_bases)
    if logprob.shape != token_bases.shape:
        raise ValueError(f"logprob {logprob.shape} and token_bases {token_bases.shape} differ in shape")
    if np.any(token_bases <= 0):
        raise ValueError("every target must cover at least one base")
    return -logprob / LN2 / token_bases


def block_ids(base_offsets: np.ndarray, block_bases: int = BLOCK_BASES) -> np.ndarray:
    """Block of each target from its base offset inside the window (offsets increase along the window)."""
    return np.asarray(base_offsets, dtype=np.int64) // block_bases


@dataclass
class BlockTable:
    """Per-(block, bucket) sums accumulated window by window.

    ``series[name]`` holds the bits summed per block and bucket for each scored variant (model, baseline,
    truncated contexts), all over the same targets, whose bases and counts are in ``bases`` / ``tokens``.
    ``stratum[j]`` is the window of block j; ``block_info`` holds the block's coordinates for reports.
    """

    n_buckets: int
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        self._bits: dict[str, list[np.ndarray]] = {n: [] for n in self.names}
        self._bases: list[np.ndarray] = []
        self._tokens: list[np.ndarray] = []
        self._stratum: list[np.ndarray] = []
        self.block_info: list[dict] = []
        self.n_windows = 0

    def add_window(self, buckets: np.ndarray, blocks: np.ndarray, bases: np.ndarray,
                   bits: dict[str, np.ndarray], info: Sequence[dict] | None = None) -> None:
        """Add one window's kept targets: bucket, block (0-based inside the window), bases and bits per series.

        ``info``, when given, is one dict per block index of the window (0..max(blocks)) and is kept in order.
        """
        window = self.n_windows
        self.n_windows += 1
        if len(buckets) == 0:
            return
        n_blocks = int(blocks.max()) + 1
        cell = blocks.astype(np.int64) * self.n_buckets + buckets.astype(np.int64)
        size = n_blocks * self.n_buckets
        present = np.bincount(blocks, minlength=n_blocks) > 0
        keep = np.flatnonzero(present)

        def fold(weights: np.ndarray | None) -> np.ndarray:
            return np.bincount(cell, weights=weights, minlength=size).reshape(n_blocks, self.n_buckets)[keep]

        self._bases.append(fold(bases.astype(np.float64)))
        self._tokens.append(fold(None))
        for name in self.names:
            self._bits[name].append(fold(np.asarray(bits[name], dtype=np.float64)))
        self._stratum.append(np.full(len(keep), window, dtype=np.int64))
        if info is not None:
            self.block_info.extend(info[j] for j in keep.tolist())

    def arrays(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """(bases [J, K], tokens [J, K], bits {name: [J, K]}, stratum [J]) over all J blocks and K buckets."""
        empty = np.zeros((0, self.n_buckets))
        stack = lambda parts: np.concatenate(parts) if parts else empty  # noqa: E731
        stratum = np.concatenate(self._stratum) if self._stratum else np.zeros(0, dtype=np.int64)
        return stack(self._bases), stack(self._tokens), {n: stack(v) for n, v in self._bits.items()}, stratum


class BlockBootstrap:
    """Replicates of the stratified block bootstrap, as block draw counts, generated in bounded chunks.

    Each stratum (window) redraws as many blocks as it has, with replacement. Strata with one block are pooled
    into one stratum, because a lone block redrawn from itself never varies. The counts depend only on
    ``(stratum, n_replicates, seed)``, so every statistic computed from one instance sees the same replicates.
    """

    def __init__(self, stratum: np.ndarray, n_replicates: int = 1000, seed: int = 0,
                 max_cells: int = 1 << 24) -> None:
        if n_replicates < 1:
            raise ValueError(f"n_replicates must be >= 1, got {n_replicates}")
        self.stratum = np.asarray(stratum, dtype=np.int64)
        self.n_replicates = int(n_replicates)
        self.seed = int(seed)
        n_blocks = len(self.stratum)
        self.chunk = max(1, min(self.n_replicates, max_cells // max(1, n_blocks)))
        labels, sizes = np.unique(self.stratum, return_counts=True)
        single = np.isin(self.stratum, labels[sizes == 1])
        self.groups = [np.flatnonzero(single)] if single.any() else []
        for label in labels[sizes > 1].tolist():
            self.groups.append(np.flatnonzero(self.stratum == label))

    def chunks(self):
        """Yield int32 [r, J] draw counts, r <= chunk, n_replicates rows in all (same rows on every call)."""
        rng = np.random.default_rng(self.seed)
        n_blocks = len(self.stratum)
        done = 0
        while done < self.n_replicates:
            rows = min(self.chunk, self.n_replicates - done)
            drawn = np.zeros((rows, n_blocks), dtype=np.int64)
            for idx in self.groups:
                drawn[:, idx] = idx[rng.integers(0, len(idx), size=(rows, len(idx)))]
            flat = (np.arange(rows, dtype=np.int64)[:, None] * n_blocks + drawn).ravel()
            yield np.bincount(flat, minlength=rows * n_blocks).reshape(rows, n_blocks).astype(np.int32)
            done += rows

    def counts(self) -> np.ndarray:
        """All replicates at once, int32 [R, J] (tests and small evaluations)."""
        parts = list(self.chunks())
        return np.concatenate(parts) if parts else np.zeros((0, len(self.stratum)), dtype=np.int32)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its 95% bootstrap interval; ``None`` everywhere for an empty bucket. ``blocks``: how many
    bootstrap blocks hold the targets (below MIN_BLOCKS_FOR_CI no interval, below FEW_BLOCKS_FOR_CI a flagged one)."""

    value: float | None
    low: float | None
    high: float | None
    blocks: int = 0


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.full(np.broadcast_shapes(num.shape, den.shape), np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _intervals(point: np.ndarray, replicates: np.ndarray, level: float, blocks: np.ndarray) -> list[Interval]:
    """``blocks[b]``: how many blocks hold targets of bucket b (fewer than MIN_BLOCKS_FOR_CI: no interval)."""
    tail = (1.0 - level) / 2.0 * 100.0
    out = []
    for b in range(point.shape[0]):
        n_blocks = int(blocks[b])
        if not np.isfinite(point[b]):
            out.append(Interval(None, None, None, n_blocks))
            continue
        if n_blocks < MIN_BLOCKS_FOR_CI:
            out.append(Interval(float(point[b]), None, None, n_blocks))
            continue
        reps = replicates[:, b]
        reps = reps[np.isfinite(reps)]
        if reps.size == 0:
            out.append(Interval(float(point[b]), None, None, n_blocks))
            continue
        lo, hi = np.percentile(reps, [tail, 100.0 - tail])
        out.append(Interval(float(point[b]), float(lo), float(hi), n_blocks))
    return out


def _replicates(num: np.ndarray, den: np.ndarray, boot: BlockBootstrap) -> np.ndarray:
    if num.shape[0] != len(boot.stratum):
        raise ValueError(f"{num.shape[0]} blocks of sums but the bootstrap has {len(boot.stratum)} blocks")
    if num.shape[0] == 0:
        return np.full((boot.n_replicates, num.shape[1]), np.nan)
    return np.concatenate([_ratio(c @ num, c @ den) for c in boot.chunks()])


def bootstrap_ratio(bits: np.ndarray, bases: np.ndarray, boot: BlockBootstrap,
                    level: float = 0.95) -> list[Interval]:
    """Bits per base per bucket with CIs. bits, bases: [J, K] block sums (J blocks, K buckets)."""
    point = _ratio(bits.sum(0), bases.sum(0))
    return _intervals(point, _replicates(bits, bases, boot), level, (bases > 0).sum(0))


def bootstrap_paired(bits_a: np.ndarray, bits_b: np.ndarray, bases: np.ndarray, boot: BlockBootstrap,
                     level: float = 0.95) -> list[Interval]:
    """Per-bucket difference a − b in bits per base over the same targets, CIs from the same redrawn blocks."""
    diff = bits_a - bits_b
    point = _ratio(diff.sum(0), bases.sum(0))
    return _intervals(point, _replicates(diff, bases, boot), level, (bases > 0).sum(0))


def windows_per_bucket(tokens: np.ndarray, stratum: np.ndarray, n_buckets: int) -> np.ndarray:
    """Number of distinct windows with at least one kept target in each bucket."""
    out = np.zeros(n_buckets, dtype=np.int64)
    for b in range(n_buckets):
        out[b] = len(np.unique(stratum[tokens[:, b] > 0]))
    return out
