"""One micro-batch of training windows: token ids and per-target loss weights.

For micro-batch ``micro`` of optimizer step ``step`` the sampler names ``shape.windows`` windows; each is read as
``seq_len + 1`` token ids (input = ``ids[:, :-1]``, targets = ``ids[:, 1:]``), reverse-complemented when the sampler
says so. Each target gets a weight: 0 where the target token is ambiguous (N / IUPAC / unknown, by the tokenizer's
``ambiguous_mask``), ``softmask_weight`` where its bases are soft-masked (lower case: repeats) and 1 otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from genolc.train.schedule import StepShape


def read_micro_batch(dataset: Any, sampler: Any, step: int, shape: StepShape, micro: int,
                     softmask_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, T+1] int64, target weights [B, T] float32)`` for micro-batch ``micro`` of ``step``."""
    tokenizer = dataset.tokenizer
    ids = np.empty((shape.windows, shape.seq_len + 1), dtype=np.int64)
    weights = np.empty((shape.windows, shape.seq_len), dtype=np.float32)
    for b in range(shape.windows):
        window = sampler.window(step, shape.sampler_micro(micro, b))
        row = np.asarray(dataset.tokens(window.key)[window.start:window.stop])
        soft = None
        if softmask_weight != 1.0:
            soft = np.asarray(dataset.token_softmask(window.key, window.start, window.stop), dtype=bool)
        if window.reverse_complement:
            row = tokenizer.reverse_complement(row)
            soft = soft[::-1] if soft is not None else None
        ids[b] = row
        w = np.where(np.asarray(tokenizer.ambiguous_mask(row[1:]), dtype=bool), 0.0, 1.0)
        if soft is not None:
            w = np.where(soft[1:], w * softmask_weight, w)
        weights[b] = w
    return torch.from_numpy(ids), torch.from_numpy(weights)
