"""A training window's token ids and per-target loss weights: the one place that turns a sampler window into them.

The window ``[start, stop)`` of record ``key`` is read as ``stop - start`` token ids (input = ``ids[:-1]``,
targets = ``ids[1:]``), reverse-complemented when the window says so. Each target gets a weight: 0 where the
target token is ambiguous (N / IUPAC / unknown, by the tokenizer's ``ambiguous_mask``), ``softmask_weight`` where
its bases are soft-masked (lower case: repeats) and 1 otherwise. genolc's trainer (genolc/train/batch.py) and both
exports (genolc/export/rows.py, genolc/export/megatron.py, which train with ``softmask_weight`` 1) read windows here.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def window_targets(dataset: Any, window: Any, softmask_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int64[n], target weights float32[n - 1])`` for a :class:`~genolc.data.sampler.Window` of ``n`` tokens."""
    tokenizer = dataset.tokenizer
    ids = np.asarray(dataset.tokens(window.key)[window.start:window.stop])
    soft = None
    if softmask_weight != 1.0:
        soft = np.asarray(dataset.token_softmask(window.key, window.start, window.stop), dtype=bool)
    if window.reverse_complement:
        ids = tokenizer.reverse_complement(ids)
        soft = soft[::-1] if soft is not None else None
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    weights = np.where(np.asarray(tokenizer.ambiguous_mask(ids[1:]), dtype=bool), 0.0, 1.0)
    if soft is not None:
        weights = np.where(soft[1:], weights * softmask_weight, weights)
    return ids, weights.astype(np.float32)
