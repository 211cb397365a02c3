"""The step strategy of each window length a run trains on, and the out-of-memory message of a step that failed.

The trainer plans every length its remaining steps use before the first step, longest first
(genolc/train/loop.py), so a setting that does not fit the device is refused with the estimate and an option that
fits, not found by an out-of-memory kill. Where a length's plan needs per-layer recompute (``--chunk auto`` on a
GPU), it is added to the model here, once: checkpointing wraps each layer's forward in place, so the lengths planned
after it are planned with it, and ``applied`` (the run's list of transforms, in ``summary.json``) says so.
"""

from __future__ import annotations

from typing import Callable

import torch

from genolc.train.apply import apply_recompute
from genolc.train.config import TrainConfig
from genolc.train.plan import (GIB, context_parallel_oom_error, oom_error, plans_fp32_streams,
                               required_seq_multiple)
from genolc.train.schedule import StepShape, step_shape
from genolc.train.strategy import (StepStrategy, choose_strategy, device_budget_bytes,
                                   host_free_bytes_per_process)
from genolc.units import format_length


class StepPlans:
    """One strategy per (window length, windows a micro-batch), chosen by genolc.train.strategy and said once.

    ``model``: the transformed model (recompute may still be added to it); ``cp_size``: the context-parallel
    ranks; ``stream_dtype``: the residual streams' dtype under autocast; ``applied``: the run's transforms, which
    this appends to."""

    def __init__(self, model: torch.nn.Module, config: TrainConfig, *, device: torch.device, bf16: bool,
                 stream_dtype: str, cp_size: int, applied: list[str], say: Callable[[str], None]) -> None:
        self.model = model
        self.config = config
        self.device = device
        self.bf16 = bf16
        self.stream_dtype = stream_dtype
        self.cp_size = cp_size
        self.applied = applied
        self.say = say
        self.recompute = config.recompute
        self.strategies: dict[tuple[int, int], StepStrategy] = {}
        self.malloc_mmap_threshold: int | None = None

    def device_bytes(self) -> int:
        return device_budget_bytes(self.device)

    def fp32_streams(self) -> bool:
        """Whether the plan counts fp32 residual streams under bf16 autocast (``--stream-dtype float32``)."""
        return plans_fp32_streams(self.bf16, self.stream_dtype)

    def for_shape(self, shape: StepShape) -> StepStrategy:
        """The step strategy for this window length (genolc.train.strategy), chosen and said once per length."""
        key = (shape.seq_len, shape.windows)
        if key not in self.strategies:
            cfg = self.config
            multiple = required_seq_multiple(self.device.type)
            if self.cp_size == 1:
                strategy = choose_strategy(
                    self.model.config, seq_len=shape.seq_len, windows=shape.windows, grad_accum=shape.grad_accum,
                    chunk=cfg.chunk, recompute=self.recompute, bf16=self.bf16,
                    fast_kernels=self.device.type == "cuda", budget_bytes=self.device_bytes(), multiple=multiple,
                    where=f"--seq {format_length(shape.seq_len)} on {self.device}",
                    auto_recompute=self.device.type == "cuda", fp32_streams=self.fp32_streams(),
                    host_free_bytes=host_free_bytes_per_process())
            else:
                strategy = self._context_parallel(shape, multiple)
            if strategy.recompute and not self.recompute:
                # Chosen per window length, after the model's transforms: checkpointing wraps each layer's forward
                # in place (the context-parallel mixers inside it are unchanged), so it is added here, once; the
                # lengths planned after this one are planned with it.
                self.recompute = True
                self.applied.append(f"recompute({apply_recompute(self.model)} layers, for "
                                    f"--seq {format_length(shape.seq_len)})")
            self.strategies[key] = strategy
            if strategy.chunk is not None or cfg.chunk is not None:
                self.say(strategy.describe())
            self._bound_heap_fragments(strategy)
        return self.strategies[key]

    def _bound_heap_fragments(self, strategy: StepStrategy) -> None:
        """On CPU, when the plan leaves too little room for glibc's heap fragments, have freed tensors returned to
        the system (slower steps, no out-of-memory kill: genolc/hostmem.py)."""
        from genolc import hostmem

        if self.device.type != "cpu" or self.malloc_mmap_threshold is not None:
            return
        budget = self.device_bytes()
        if hostmem.heap_overhead_may_not_fit(strategy.estimate_bytes, budget) and \
                hostmem.return_large_frees_to_the_system():
            self.malloc_mmap_threshold = hostmem.MMAP_THRESHOLD_BYTES
            self.say(f"estimated {strategy.estimate_bytes / GIB:.1f} GiB of the {budget / GIB:.1f} GiB free: freed "
                     f"tensors of 1 MiB or more go back to the system (fewer heap fragments, slower steps)")

    def _context_parallel(self, shape: StepShape, multiple: int) -> StepStrategy:
        """A rank holds 1/cp of each window, or of each chunk of it, and what the whole span adds (the DSA rows
        gathered over it, KDA's wider values): planned by genolc.train.strategy.choose_context_parallel_strategy; the
        window's caches are whole on every rank, as in one process."""
        from genolc.parallel.layout import Layout
        from genolc.train.strategy import choose_context_parallel_strategy

        cfg = self.config
        cp = self.cp_size
        pieces = Layout(shape.seq_len, cp, cfg.cp_layout).piece_count
        return choose_context_parallel_strategy(
            self.model.config, seq_len=shape.seq_len, cp=cp, pieces=pieces,
            windows=shape.windows, chunk=cfg.chunk, recompute=self.recompute, bf16=self.bf16,
            fast_kernels=self.device.type == "cuda", budget_bytes=self.device_bytes(), multiple=multiple,
            where=f"--seq {format_length(shape.seq_len)} over --cp {cp} on {self.device}",
            auto_recompute=self.device.type == "cuda", fp32_streams=self.fp32_streams())

    def oom_error(self, step: int) -> Exception:
        """The message for step ``step`` (0-based) having run out of device memory: its plan's estimate and the
        settings that fit (genolc.train.plan)."""
        cfg = self.config
        shape = step_shape(step, cfg)
        strategy = self.strategies.get((shape.seq_len, shape.windows))
        chunk = strategy.chunk if strategy else None
        where = f"step {step + 1}, {self.device}"
        fast = self.device.type == "cuda"
        multiple = required_seq_multiple(self.device.type)
        if self.cp_size > 1:
            from genolc.parallel.layout import Layout

            pieces = Layout(shape.seq_len, self.cp_size, cfg.cp_layout).piece_count
            return context_parallel_oom_error(self.model.config, seq_len=shape.seq_len, cp=self.cp_size,
                                              chunk=chunk, windows=shape.windows, recompute=self.recompute,
                                              bf16=self.bf16, fast_kernels=fast, budget_bytes=self.device_bytes(),
                                              where=where, chunk_multiple=multiple * pieces if multiple > 1 else 1,
                                              fp32_streams=self.fp32_streams())
        return oom_error(self.model.config, seq_len=shape.seq_len, micro_batch=cfg.micro_batch,
                         grad_accum=cfg.grad_accum, recompute=self.recompute, bf16=self.bf16,
                         budget_bytes=self.device_bytes(), where=where, fast_kernels=fast, chunk=chunk,
                         chunk_multiple=multiple, keep_selections=bool(strategy and strategy.keep_selections),
                         whole_only=cfg.chunk == 0, fp32_streams=self.fp32_streams())
