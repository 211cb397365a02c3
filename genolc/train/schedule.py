"""Learning-rate schedule and sequence-length warm-up.

Learning rate (``step`` counts optimizer steps from 0)::

    step <  W:   lr * (step + 1) / W                                   linear warm-up, reaches lr at step W - 1
    step >= W:   lr_min + (lr - lr_min) * (1 + cos(pi * p)) / 2,       p = (step - W) / max(1, S - W - 1)
                 lr_min = lr * min_lr_ratio                            so the last step (S - 1) runs at lr_min

Sequence-length warm-up (HyenaDNA style): training starts on short windows and moves to the full ``seq_len`` in
stages, holding the number of tokens per optimizer step fixed. With stages ``(s_1, ..., s_k)`` of ``N`` steps
each, steps ``[i*N, (i+1)*N)`` use length ``s_{i+1}``, and every step from ``k*N`` uses ``seq_len``.

How a step is split into micro-batches: the number of micro-batches (``grad_accum``) never changes; at a stage of
length ``s`` each micro-batch holds ``micro_batch * seq_len / s`` windows of ``s`` tokens instead of
``micro_batch`` windows of ``seq_len`` tokens, so every micro-batch is ``[B_s, s]`` with ``B_s * s`` equal to
the full-length ``micro_batch * seq_len``. Per-token memory (embeddings, MLP/MoE, logits) is then the same in every
stage and attention memory only shrinks, so a run that fits at full length fits through its warm-up. Window ``b``
of micro-batch ``m`` is the sampler's draw ``(step, m * B_s + b)``, so windows stay a pure function of the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from genolc.train.config import TrainConfig


def lr_at(step: int, config: TrainConfig) -> float:
    """Learning rate for optimizer ``step`` (0-based): linear warm-up, then cosine down to ``lr * min_lr_ratio``."""
    if step < 0:
        raise ValueError(f"step must be non-negative, got {step}")
    warm = config.warmup_steps
    if step < warm:
        return config.lr * (step + 1) / warm
    lr_min = config.lr * config.min_lr_ratio
    progress = min(1.0, (step - warm) / max(1, config.steps - warm - 1))
    return lr_min + (config.lr - lr_min) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class StepShape:
    """How optimizer step ``step`` is laid out: ``grad_accum`` micro-batches of ``[windows, seq_len]`` tokens."""

    seq_len: int
    windows: int          # windows per micro-batch (B of the [B, T] input)
    grad_accum: int
    stage: int            # 0 .. len(seq_warmup) (the last one is full length)

    @property
    def tokens(self) -> int:
        return self.seq_len * self.windows * self.grad_accum

    def sampler_micro(self, micro: int, window: int) -> int:
        """The sampler's ``micro`` index for window ``window`` of micro-batch ``micro``."""
        return micro * self.windows + window


def step_shape(step: int, config: TrainConfig) -> StepShape:
    """The stage length and micro-batch layout of optimizer ``step`` (see the module docstring)."""
    if step < 0:
        raise ValueError(f"step must be non-negative, got {step}")
    stages = config.seq_warmup
    if stages and config.seq_warmup_steps > 0:
        index = step // config.seq_warmup_steps
        if index < len(stages):
            length = stages[index]
            return StepShape(seq_len=length, windows=config.micro_batch * (config.seq_len // length),
                             grad_accum=config.grad_accum, stage=index)
    return StepShape(seq_len=config.seq_len, windows=config.micro_batch, grad_accum=config.grad_accum,
                     stage=len(stages))


def stage_lengths(config: TrainConfig) -> tuple[int, ...]:
    """Every window length the run uses, shortest first (the warm-up stages then ``seq_len``)."""
    return (*config.seq_warmup, config.seq_len)


def indexer_mode_at(step: int, config: TrainConfig) -> str | None:
    """The ``indexer_loss`` argument for the model's forward at ``step``: None, 'dense' or 'sparse'.

    'dense-then-sparse' follows DeepSeek-V3.2's recipe: ``indexer_dense_steps`` steps where the indexer learns to
    match dense attention, then sparse attention over the indexer's top-k with the KL kept on the selected keys.
    """
    if config.indexer == "off":
        return None
    if config.indexer == "dense-then-sparse":
        return "dense" if step < config.indexer_dense_steps else "sparse"
    return config.indexer
