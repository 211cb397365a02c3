"""Scorers and windows for the evaluation tests: oracles whose answers are known, no model involved."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np

from genolc.eval.positions import WindowData

CHR22 = "human/GRCh37_chr22_20000001-21000000.fa.gz"
CHR22_START = 20000001


def read_fasta_bases(path: Path) -> np.ndarray:
    """uint8 ASCII bases of a single-record gzip FASTA (test helper only)."""
    with gzip.open(path, "rb") as fh:
        body = b"".join(line.strip() for line in fh if not line.startswith(b">"))
    return np.frombuffer(body, dtype=np.uint8)


def plain_window(ids: np.ndarray, tokenizer, key: str = "chr22", start: int = 0, chrom_start: int = 1,
                 softmask: np.ndarray | None = None) -> WindowData:
    ids = np.asarray(ids, dtype=np.int64)
    bases = np.asarray(tokenizer.token_lengths(ids), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(bases)[:-1]])
    return WindowData(key=key, chrom=key, start=start, stop=start + len(ids), chrom_start=chrom_start, ids=ids,
                      ambiguous=np.asarray(tokenizer.ambiguous_mask(ids), dtype=bool),
                      softmask=np.zeros(len(ids), bool) if softmask is None else softmask,
                      token_bases=bases, base_offsets=offsets)


class CopyOracle:
    """Predicts the next token by copying: if the last ``k`` tokens occurred earlier in the visible row, the token
    that followed them gets probability ``hit``; otherwise every one of ``alphabet`` tokens gets 1/len(alphabet).

    With ``copy=False`` it never copies (a context-free baseline).
    """

    def __init__(self, alphabet: np.ndarray, k: int = 32, hit: float = 0.97, copy: bool = True,
                 batch_tokens: int = 1 << 16) -> None:
        self.alphabet = np.asarray(alphabet)
        self.k, self.hit, self.copy = k, hit, copy
        self.batch_tokens = batch_tokens
        self.calls = 0

    def _row(self, row: np.ndarray) -> np.ndarray:
        n = len(row)
        uniform = math.log(1.0 / len(self.alphabet))
        out = np.full(n - 1, uniform)
        if not self.copy or n <= self.k:
            return out
        # hash of the k tokens before position t (t = k..n-1): rolling polynomial over uint64
        windows = np.lib.stride_tricks.sliding_window_view(row.astype(np.uint64), self.k)[: n - self.k]
        weights = np.uint64(1000003) ** np.arange(self.k, dtype=np.uint64)
        hashes = (windows * weights).sum(axis=1)
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        earliest = first[inverse] + self.k     # position whose preceding k-mer first matched
        t = np.arange(self.k, n)
        seen = earliest < t
        predicted = row[earliest]
        miss = (1.0 - self.hit) / (len(self.alphabet) - 1)
        copied = np.where(predicted == row[t], math.log(self.hit), math.log(miss))
        out[t - 1] = np.where(seen, copied, uniform)
        return out

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.stack([self._row(np.asarray(r)) for r in ids])


class VisibleContextScorer:
    """log p(target) = -(1 + number of visible tokens) / 1e6: reveals how much context each target saw."""

    batch_tokens = 1 << 12

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        b, t = ids.shape
        return np.broadcast_to(-(1.0 + np.arange(1, t)) / 1e6, (b, t - 1)).copy()


class TokenScorer:
    """Context-free: log p(target) = -(1 + target id) / 100."""

    batch_tokens = 1 << 12

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        return -(1.0 + ids[:, 1:].astype(np.float64)) / 100.0
