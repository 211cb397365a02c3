"""What a training step cost: its speed, MFU and memory, per step and summed over one invocation of `finetune`.

The per-step figures go into ``metrics.jsonl`` (:meth:`Throughput.step`), the totals into ``summary.json``
(:meth:`Throughput.summary`). FLOPs are counted once, in genolc/train/flops.py; this module only divides them by
the time a step took and the devices' peak. The first step of an invocation is kept apart in the totals: it loads,
or compiles and autotunes, the kernels of its shape (benchmarks/results/first_step_cold_2026-12-05/), so a run of a
few steps would otherwise report a speed no later step has.
"""

from __future__ import annotations

import resource
from typing import Any

import torch

from genolc.train.flops import TokenFlops, device_peak_flops
from genolc.train.plan import GIB


def peak_flops(device: torch.device, *, bf16: bool, devices: int = 1) -> float | None:
    """Dense bf16 peak of ``devices`` GPUs like ``device`` (genolc.train.flops' table), or None: off a GPU, without
    bf16, or on a GPU the table lacks (MFU is then not reported)."""
    if device.type != "cuda" or not bf16:
        return None
    peak = device_peak_flops(torch.cuda.get_device_name(device))
    return None if peak is None else peak * devices


def device_peak_gib(device: torch.device) -> float:
    """Peak memory this process has allocated on ``device`` since it began; on CPU its peak resident host memory."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return host_peak_gib()


def host_peak_gib() -> float:
    """This process's peak resident host memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def allocator_retries(device: torch.device) -> int | None:
    """How often CUDA's caching allocator found no free block, emptied its cache (a device-wide sync) and asked the
    driver again, since the process began (None off CUDA). A step near the device's capacity that does it runs
    slower; `base` at 512k (113.7 GiB) did it in none of its steps on the H200, and expandable segments did not
    change its step time (benchmarks/results/finetune_sync_slab_2026-12-04/)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


class Throughput:
    """Tokens, seconds and model FLOPs of this invocation's steps. ``peak``: the dense bf16 peak of every device
    the run uses (:func:`peak_flops`), or None where MFU is not reported."""

    def __init__(self, peak: float | None) -> None:
        self.peak = peak
        self.tokens, self.seconds, self.model_flops = 0, 0.0, 0.0
        self.first_step_seconds: float | None = None
        self.later_tokens, self.later_seconds = 0, 0.0

    def step(self, tokens: int, seconds: float, flops: TokenFlops) -> dict[str, Any]:
        """Count one step of ``tokens`` tokens (over every data-parallel replica) that took ``seconds``; its
        metrics: tokens_per_s, model_flops_per_token, mfu and hfu (where there is a peak), step_seconds."""
        self.tokens += tokens
        self.seconds += seconds
        self.model_flops += flops.model * tokens
        if self.first_step_seconds is None:
            self.first_step_seconds = seconds
        else:
            self.later_tokens += tokens
            self.later_seconds += seconds
        rate = tokens / max(seconds, 1e-9)
        metrics: dict[str, Any] = {"tokens_per_s": rate, "model_flops_per_token": flops.model}
        if self.peak is not None:
            metrics["mfu"] = flops.model * rate / self.peak
            metrics["hfu"] = flops.hardware * rate / self.peak
        metrics["step_seconds"] = seconds
        return metrics

    def summary(self) -> dict[str, Any]:
        """The invocation's totals (None where no step ran, or for MFU where there is no peak)."""
        return {
            "tokens_per_s": self.tokens / self.seconds if self.seconds else None,
            "mfu": self.model_flops / self.seconds / self.peak if self.seconds and self.peak else None,
            "first_step_seconds": self.first_step_seconds,
            "tokens_per_s_after_first_step": self.later_tokens / self.later_seconds if self.later_seconds else None,
        }
