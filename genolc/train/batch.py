"""One micro-batch of training windows: token ids and per-target loss weights.

For micro-batch ``micro`` of optimizer step ``step`` the sampler names ``shape.windows`` windows; each is read as
``seq_len + 1`` token ids (input = ``ids[:, :-1]``, targets = ``ids[:, 1:]``) with its target weights by
:func:`genolc.data.targets.window_targets` (N masked, soft-masked repeats weighted ``softmask_weight``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from genolc.data.targets import window_targets
from genolc.train.schedule import StepShape


def read_micro_batch(dataset: Any, sampler: Any, step: int, shape: StepShape, micro: int,
                     softmask_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, T+1] int64, target weights [B, T] float32)`` for micro-batch ``micro`` of ``step``."""
    ids = np.empty((shape.windows, shape.seq_len + 1), dtype=np.int64)
    weights = np.empty((shape.windows, shape.seq_len), dtype=np.float32)
    for b in range(shape.windows):
        ids[b], weights[b] = window_targets(dataset, sampler.window(step, shape.sampler_micro(micro, b)),
                                            softmask_weight)
    return torch.from_numpy(ids), torch.from_numpy(weights)
