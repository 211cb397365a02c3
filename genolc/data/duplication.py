"""Held-out vs training duplication check on 1 kb blocks, vectorised with numpy.

The question is "how much of the held-out sequence also appears verbatim in training?" — e.g. the same
chromosome from two assemblies, where long identical stretches sit at shifted coordinates. Training sequence is
cut into grid-aligned 1 kb blocks (1000 bases, no N) whose 64-bit hashes are kept (8 bytes per kb: 24 MB for a
whole human genome). Held-out sequence is hashed at *every* offset with a rolling hash, so a training block is
found wherever it sits in the held-out record. A held-out grid block counts as "found in train" when it is fully
covered by such matches: inside a duplicated stretch, matches fall every 1000 bases and tile it, so the share is
exact there and only the ≤ 1 kb at each end of a stretch is missed.

Hashes are polynomials over little-endian 64-bit words (8 bases each) modulo 2**64 with an odd multiplier, so a
block hash costs 125 multiply-adds and a rolling hash at all 8 byte phases costs one pass over the words.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

BLOCK_BASES = 1000
_WORDS = BLOCK_BASES // 8
_MULT = np.uint64(0x9E3779B97F4A7C15)
_MULT_INV = np.uint64(pow(int(_MULT), -1, 1 << 64))
# A bitmap on the top hash bits screens lookups cheaply before the exact sorted search.
_FILTER_BITS = 25
# Upper-case A/C/G/T. Training blocks with N, an IUPAC code or a BED-excluded base are never indexed, so a held-out
# block holding one could never be found: it is not eligible either (counting it would understate the share).
_PLAIN_ACGT = np.zeros(256, dtype=bool)
_PLAIN_ACGT[np.frombuffer(b"ACGT", dtype=np.uint8)] = True


def _powers(base: np.uint64, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint64)
    out[0] = 1
    if n > 1:
        out[1:] = base
        np.multiply.accumulate(out[1:], out=out[1:])
    return out


_POW = _powers(_MULT, _WORDS)


def block_hashes(blocks: np.ndarray) -> np.ndarray:
    """Hash of each row of ``blocks`` (uint8 [n, 1000], upper-case bases) -> uint64 [n]."""
    if blocks.ndim != 2 or blocks.shape[1] != BLOCK_BASES:
        raise ValueError(f"blocks must be [n, {BLOCK_BASES}], got {blocks.shape}")
    words = np.ascontiguousarray(blocks).view("<u8").reshape(len(blocks), _WORDS)
    return (words * _POW).sum(axis=1, dtype=np.uint64)


def _bad_blocks(n_blocks: int, bad_intervals: np.ndarray) -> np.ndarray:
    """bool [n_blocks]: block overlaps any [start, stop) interval (coordinates relative to the first block)."""
    marks = np.zeros(n_blocks + 1, dtype=np.int32)
    if len(bad_intervals):
        lo = np.clip(bad_intervals[:, 0] // BLOCK_BASES, 0, n_blocks)
        hi = np.clip((bad_intervals[:, 1] - 1) // BLOCK_BASES + 1, 0, n_blocks)
        keep = hi > lo
        np.add.at(marks, lo[keep], 1)
        np.add.at(marks, hi[keep], -1)
    return np.cumsum(marks[:-1]) > 0


class TrainBlockIndex:
    """Collects hashes of grid-aligned training blocks, record by record, chunk by chunk."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self._carry = np.empty(0, dtype=np.uint8)
        self._carry_bad = False
        self._sorted: np.ndarray | None = None
        self._filter: np.ndarray | None = None

    def start_record(self) -> None:
        self._carry = np.empty(0, dtype=np.uint8)
        self._carry_bad = False

    def add(self, upper: np.ndarray, bad_intervals: np.ndarray) -> None:
        """Add the next chunk of a record (upper-case uint8) with its N/excluded intervals relative to the chunk."""
        n = len(upper)
        head = 0
        if len(self._carry):
            head = min(BLOCK_BASES - len(self._carry), n)
            bad_head = bool(len(bad_intervals)) and bool(np.any(bad_intervals[:, 0] < head))
            self._carry = np.concatenate([self._carry, upper[:head]])
            self._carry_bad |= bad_head
            if len(self._carry) < BLOCK_BASES:
                return
            if not self._carry_bad:
                self._parts.append(block_hashes(self._carry.reshape(1, BLOCK_BASES)))
        n_blocks = (n - head) // BLOCK_BASES
        if n_blocks:
            body = upper[head:head + n_blocks * BLOCK_BASES].reshape(n_blocks, BLOCK_BASES)
            good = ~_bad_blocks(n_blocks, bad_intervals - head)
            if good.any():
                self._parts.append(block_hashes(body[good]))
        tail_start = head + n_blocks * BLOCK_BASES
        self._carry = upper[tail_start:].copy()
        self._carry_bad = bool(len(bad_intervals)) and bool(np.any(bad_intervals[:, 1] > tail_start))
        self._sorted = None

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)

    def _finalise(self) -> None:
        if self._sorted is None:
            hashes = np.concatenate(self._parts) if self._parts else np.empty(0, dtype=np.uint64)
            self._sorted = np.unique(hashes)
            self._parts = [self._sorted]
            self._filter = np.zeros(1 << _FILTER_BITS, dtype=bool)
            self._filter[self._sorted >> np.uint64(64 - _FILTER_BITS)] = True

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """bool per hash: equal to some training block's hash."""
        self._finalise()
        assert self._sorted is not None and self._filter is not None
        found = self._filter[hashes >> np.uint64(64 - _FILTER_BITS)]
        cand = np.flatnonzero(found)
        if len(cand) and len(self._sorted):
            pos = np.searchsorted(self._sorted, hashes[cand])
            pos[pos == len(self._sorted)] = 0
            found[cand] = self._sorted[pos] == hashes[cand]
        return found


def rolling_block_hashes(seq: np.ndarray) -> np.ndarray:
    """Hash of every 1000-base window of ``seq`` (uint8) -> uint64 [len(seq) - 999]; window i starts at seq[i]."""
    n = len(seq) - BLOCK_BASES + 1
    if n <= 0:
        return np.empty(0, dtype=np.uint64)
    out = np.empty(n, dtype=np.uint64)
    buf = np.ascontiguousarray(seq)
    for phase in range(8):
        n_words = (len(buf) - phase) // 8
        if n_words < _WORDS:
            continue
        words = np.frombuffer(buf[phase:phase + n_words * 8].tobytes(), dtype="<u8")
        # Prefix sums of word * M^j; window at word i is (P[i+125] - P[i]) * M^-i.
        weighted = words * _powers(_MULT, n_words)
        prefix = np.empty(n_words + 1, dtype=np.uint64)
        prefix[0] = 0
        np.cumsum(weighted, out=prefix[1:])
        windows = (prefix[_WORDS:] - prefix[:-_WORDS]) * _powers(_MULT_INV, n_words - _WORDS + 1)
        out[phase::8] = windows[: len(out[phase::8])]
    return out


def heldout_coverage(
    read: Callable[[int, int], np.ndarray], length: int, index: TrainBlockIndex, step: int = 4_000_000
) -> tuple[int, int]:
    """(eligible held-out grid blocks, of which found in train) for one held-out record.

    ``read(lo, hi)`` returns the record's upper-case bases [lo, hi) as uint8; it is called on windows of ``step``
    bases (overlapping by 999) so memory stays bounded for any record length. Eligible blocks are whole 1000-base
    grid blocks of A/C/G/T only (no N, IUPAC code or BED-excluded base, which prepare writes as N), the same
    rule that decides which training blocks are indexed.
    """
    if step % BLOCK_BASES:
        raise ValueError(f"step must be a multiple of {BLOCK_BASES}, got {step}")
    n_blocks = length // BLOCK_BASES
    if n_blocks == 0:
        return 0, 0
    eligible = np.zeros(n_blocks, dtype=bool)
    starts: list[np.ndarray] = []
    for lo in range(0, n_blocks * BLOCK_BASES, step):
        hi = min(length, lo + step + BLOCK_BASES - 1)
        seq = np.ascontiguousarray(read(lo, hi), dtype=np.uint8)
        hit = np.flatnonzero(index.contains(rolling_block_hashes(seq)))
        starts.append(hit.astype(np.int64) + lo)
        b_lo, b_hi = lo // BLOCK_BASES, min(n_blocks, (lo + step) // BLOCK_BASES)
        grid = seq[: (b_hi - b_lo) * BLOCK_BASES].reshape(b_hi - b_lo, BLOCK_BASES)
        eligible[b_lo:b_hi] = np.all(_PLAIN_ACGT[grid], axis=1)
    match = np.unique(np.concatenate(starts))
    covered = np.zeros(n_blocks, dtype=bool)
    if len(match):
        # Union of [s, s + 1000): a new covered run starts wherever the gap to the previous match exceeds 1000.
        breaks = np.flatnonzero(np.diff(match) > BLOCK_BASES) + 1
        run_lo = match[np.r_[0, breaks]]
        run_hi = match[np.r_[breaks - 1, len(match) - 1]] + BLOCK_BASES
        first = np.minimum(-(-run_lo // BLOCK_BASES), n_blocks)
        last = np.minimum(run_hi // BLOCK_BASES, n_blocks)
        keep = last > first
        marks = np.zeros(n_blocks + 1, dtype=np.int32)
        np.add.at(marks, first[keep], 1)
        np.add.at(marks, last[keep], -1)
        covered = np.cumsum(marks[:-1]) > 0
    return int(eligible.sum()), int((covered & eligible).sum())
