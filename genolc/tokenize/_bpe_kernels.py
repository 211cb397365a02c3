"""numba kernels of genolc/tokenize/bpe_encode.py (imported only when that encoder runs: importing numba costs
about half a second). Compiled once per machine into numba's cache (beside this file, or the user's cache
directory when the package folder is read-only)."""

from __future__ import annotations

import numba
import numpy as np

_HASH = np.int64(-7046029254386353131)      # 0x9E3779B97F4A7C15 (Fibonacci hashing) as a signed 64-bit integer


@numba.njit(cache=True, nogil=True)
def _slot(keys, key):
    mask = keys.shape[0] - 1
    i = ((key * _HASH) >> np.int64(17)) & mask
    while keys[i] != key and keys[i] != -1:
        i = (i + 1) & mask
    return i


@numba.njit(cache=True, nogil=True)
def _rank(keys, ranks, key):
    return ranks[_slot(keys, key)]          # -1 for an empty slot


@numba.njit(cache=True, nogil=True)
def fill_table(keys, ranks, pair_keys):
    """Each pair's first (lowest) rank into the table."""
    for r in range(pair_keys.shape[0]):
        i = _slot(keys, pair_keys[r])
        if keys[i] == -1:
            keys[i] = pair_keys[r]
            ranks[i] = r


@numba.njit(cache=True, nogil=True)
def _queue(rank, position, head, link, node_position, used):
    node_position[used] = position
    link[used] = head[rank]
    head[rank] = used
    return used + 1


@numba.njit(cache=True, nogil=True)
def _encode_piece(ids, start, stop, vocab, keys, ranks, left, right, new, head, link, node_position, symbols,
                  nxt, prv, scratch, out, written):
    n = stop - start
    n_ranks = left.shape[0]
    for i in range(n):
        symbols[i] = ids[start + i]
        nxt[i] = i + 1
        prv[i] = i - 1
    nxt[n - 1] = -1
    used = 0
    lowest = n_ranks
    # Right to left, so that each rank's list holds its first pairs left to right.
    for i in range(n - 2, -1, -1):
        r = _rank(keys, ranks, symbols[i] * vocab + symbols[i + 1])
        if r >= 0:
            used = _queue(r, i, head, link, node_position, used)
            lowest = min(lowest, r)
    for r in range(lowest, n_ranks):
        node = head[r]
        if node == -1:
            continue
        head[r] = -1
        count = 0
        while node != -1:
            scratch[count] = node_position[node]
            count += 1
            node = link[node]
        a, b, joined = left[r], right[r], new[r]
        if a == b:
            scratch[:count].sort()       # runs of a: merged from the left, as the library does
        for k in range(count):
            i = scratch[k]
            j = nxt[i]
            if symbols[i] != a or j == -1 or symbols[j] != b:
                continue                 # merged away or changed since it was queued
            symbols[i] = joined
            symbols[j] = -1
            after = nxt[j]
            nxt[i] = after
            if after != -1:
                prv[after] = i
            before = prv[i]
            if before != -1:
                rank = _rank(keys, ranks, symbols[before] * vocab + joined)
                if rank >= 0:
                    used = _queue(rank, before, head, link, node_position, used)
            if after != -1:
                rank = _rank(keys, ranks, joined * vocab + symbols[after])
                if rank >= 0:
                    used = _queue(rank, i, head, link, node_position, used)
    i = 0
    while i != -1:
        out[written] = symbols[i]
        written += 1
        i = nxt[i]
    return written


@numba.njit(cache=True, nogil=True)
def encode_pieces(ids, starts, stops, vocab, keys, ranks, left, right, new, out, counts):
    """Every piece's BPE ids into ``out`` (concatenated), their counts into ``counts``; returns the total."""
    longest = 1
    for p in range(starts.shape[0]):
        longest = max(longest, stops[p] - starts[p])
    head = np.full(left.shape[0], -1, dtype=np.int64)
    # Each merge queues at most two pairs: at most 3 n queue entries per piece of n bases.
    link = np.empty(3 * longest, dtype=np.int64)
    node_position = np.empty(3 * longest, dtype=np.int64)
    scratch = np.empty(3 * longest, dtype=np.int64)
    symbols = np.empty(longest, dtype=np.int64)
    nxt = np.empty(longest, dtype=np.int64)
    prv = np.empty(longest, dtype=np.int64)
    written = 0
    for p in range(starts.shape[0]):
        before = written
        if stops[p] > starts[p]:
            written = _encode_piece(ids, starts[p], stops[p], vocab, keys, ranks, left, right, new, head, link,
                                    node_position, symbols, nxt, prv, scratch, out, written)
        counts[p] = written - before
    return written
