"""BPE encoding of ACGT pieces compiled with numba: the same ids as the ``tokenizers`` library's BPE model, faster.

``tokenizers`` encodes each piece by repeatedly merging the adjacent pair of lowest merge rank (leftmost first among
equal ranks) with a heap (about 1.6-3 Mbp/s per core on DNA, issue 20). A merge only creates pairs of higher rank than
its own (a pair holding the new token was learned after it), so the ranks can be swept in increasing order with one
bucket list per rank instead of a heap: each piece costs its length plus the number of ranks. Within a rank only a
pair ``(a, a)`` can overlap another of its bucket, and those are merged left to right as the library does; a pair
whose tokens have changed since it was queued is skipped. ``genolc/tokenize/bpe.py`` uses this when numba is
installed (``GENOLC_BPE_ENCODER=tokenizers`` forces the library's encoder, which stays the reference the tests
compare with on real DNA); pieces are split over ``RAYON_NUM_THREADS`` threads (the library's own knob; default:
the cores this process may use), each running the compiled loop without the GIL.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

ENCODER_ENV = "GENOLC_BPE_ENCODER"
ENCODERS = ("auto", "numba", "tokenizers")


def encoder_choice(merges_sweepable: Callable[[], bool] = lambda: True) -> str:
    """"numba" or "tokenizers" (``$GENOLC_BPE_ENCODER``, default auto: numba when it imports and the tokenizer's
    merges are in an order its rank sweep handles, ``merges_sweepable()``, asked only when numba would run)."""
    from genolc.errors import ConfigError

    asked = os.environ.get(ENCODER_ENV, "auto")
    if asked not in ENCODERS:
        raise ConfigError(f"unknown {ENCODER_ENV}={asked!r}", where="environment",
                          fix=f"use one of {', '.join(ENCODERS)}, or unset it")
    if asked == "tokenizers":
        return "tokenizers"
    problem = _numba_problem()
    if asked == "numba" and problem:
        raise ConfigError(f"{ENCODER_ENV}=numba but numba cannot be used ({problem})", where="environment",
                          fix="pip install numba (a version that supports the installed NumPy), or unset the variable")
    if problem:
        return "tokenizers"
    if not merges_sweepable():
        if asked == "numba":
            raise ConfigError(f"{ENCODER_ENV}=numba cannot encode with this tokenizer: a merge comes before a merge "
                              "that makes one of its tokens, or a pair is listed twice", where="environment",
                              fix=f"unset {ENCODER_ENV} (the tokenizers library's encoder takes any merge order)")
        return "tokenizers"
    return "numba"


@functools.cache
def _numba_problem() -> str | None:
    """Why numba cannot run here, or None. Imported, not only found: an installed numba that does not support the
    installed NumPy fails on import, and auto then takes the library's encoder."""
    try:
        import numba  # noqa: F401
    except Exception as error:      # ImportError, or numba's own check of the NumPy version
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")
    return None


def sweepable(merges: list[tuple[str, str]]) -> bool:
    """Whether the rank sweep gives the library's ids for these merges: no pair is listed twice (the library keeps
    the last rank of a repeated pair), and every merge comes after each merge that makes one of its two tokens, so
    that a pair is never queued at a rank already swept. Merges learnt by ``BPETokenizer.train`` always are; a
    hand-written file need not be."""
    last_made: dict[str, int] = {}
    for rank, (a, b) in enumerate(merges):
        last_made[a + b] = rank
    seen: set[tuple[str, str]] = set()
    for rank, pair in enumerate(merges):
        pair = tuple(pair)
        if pair in seen or last_made.get(pair[0], -1) >= rank or last_made.get(pair[1], -1) >= rank:
            return False
        seen.add(pair)
    return True


def encoder_threads() -> int:
    """``$RAYON_NUM_THREADS`` (the library's own knob), else the cores this process may use (affinity and cgroup)."""
    from genolc.threads import usable_cores

    value = os.environ.get("RAYON_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return usable_cores()


@dataclass(frozen=True)
class MergeTables:
    """A BPE vocabulary's merges as arrays: rank ``r`` joins ``left[r]`` and ``right[r]`` into ``new[r]``; the
    open-addressing table maps the pair key ``left * vocab_size + right`` to its rank."""

    vocab_size: int
    left: np.ndarray
    right: np.ndarray
    new: np.ndarray
    keys: np.ndarray
    ranks: np.ndarray

    @classmethod
    def build(cls, tokens: list[str], merges: list[tuple[str, str]]) -> "MergeTables":
        from genolc.tokenize import _bpe_kernels as kernels

        vocab = {t: i for i, t in enumerate(tokens)}
        left = np.array([vocab[a] for a, _ in merges], dtype=np.int64)
        right = np.array([vocab[b] for _, b in merges], dtype=np.int64)
        new = np.array([vocab[a + b] for a, b in merges], dtype=np.int64)
        size = 1 << max(4, (2 * len(merges)).bit_length())
        keys = np.full(size, -1, dtype=np.int64)
        ranks = np.full(size, -1, dtype=np.int64)
        kernels.fill_table(keys, ranks, left * len(tokens) + right)
        return cls(len(tokens), left, right, new, keys, ranks)


def encode_pieces(tables: MergeTables, ids: np.ndarray, starts: np.ndarray, stops: np.ndarray,
                  threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """BPE ids of each piece ``ids[starts[i]:stops[i]]`` (single-base ids in): the pieces' ids concatenated (int32)
    and each piece's count (int64)."""
    from genolc.tokenize import _bpe_kernels as kernels

    ids = np.ascontiguousarray(ids, dtype=np.int64)
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    stops = np.ascontiguousarray(stops, dtype=np.int64)
    lengths = stops - starts
    threads = max(1, min(threads or encoder_threads(), starts.shape[0] // 16 or 1))
    # Contiguous runs of pieces with about equal bases, one per thread.
    bounds = np.searchsorted(np.cumsum(lengths), np.arange(1, threads) * (lengths.sum() / threads))
    groups = np.split(np.arange(starts.shape[0]), bounds)

    def run(group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = np.empty(int(lengths[group].sum()), dtype=np.int32)
        counts = np.empty(group.shape[0], dtype=np.int64)
        used = kernels.encode_pieces(ids, starts[group], stops[group], tables.vocab_size, tables.keys,
                                     tables.ranks, tables.left, tables.right, tables.new, out, counts)
        return out[:used], counts

    if len(groups) == 1:
        parts = [run(groups[0])]
    else:
        from concurrent.futures import ThreadPoolExecutor     # here: 10 ms of every genolc command's start

        with ThreadPoolExecutor(len(groups)) as pool:
            parts = list(pool.map(run, groups))
    return (np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int32),
            np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64))
