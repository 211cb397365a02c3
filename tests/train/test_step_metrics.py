"""A step's speed, MFU and memory (genolc/train/step_metrics.py): the first step kept apart from the totals, MFU
only where there is a peak."""

from __future__ import annotations

import pytest
import torch

from genolc.model import preset
from genolc.train.flops import token_flops
from genolc.train.step_metrics import Throughput, allocator_retries, device_peak_gib, host_peak_gib, peak_flops


def test_a_step_metrics_divide_its_flops_by_its_time_and_the_peak():
    flops = token_flops(preset("small"), 4096, recompute=True)
    meter = Throughput(peak=1e15)
    step = meter.step(8192, 2.0, flops)
    assert step["tokens_per_s"] == 4096 and step["step_seconds"] == 2.0
    assert step["model_flops_per_token"] == flops.model
    assert step["mfu"] == pytest.approx(flops.model * 4096 / 1e15)
    assert step["hfu"] == pytest.approx(flops.hardware * 4096 / 1e15) and step["hfu"] > step["mfu"]


def test_the_totals_keep_the_first_step_apart():
    flops = token_flops(preset("tiny"), 256)
    meter = Throughput(peak=1e12)
    assert meter.summary() == {"tokens_per_s": None, "mfu": None, "first_step_seconds": None,
                               "tokens_per_s_after_first_step": None}
    meter.step(1000, 10.0, flops)       # the first step compiles
    assert meter.summary()["tokens_per_s_after_first_step"] is None
    meter.step(1000, 1.0, flops)
    meter.step(1000, 1.0, flops)
    totals = meter.summary()
    assert totals["first_step_seconds"] == 10.0
    assert totals["tokens_per_s"] == pytest.approx(3000 / 12.0)
    assert totals["tokens_per_s_after_first_step"] == pytest.approx(1000.0)
    assert totals["mfu"] == pytest.approx(flops.model * 3000 / 12.0 / 1e12)


def test_no_peak_no_mfu():
    meter = Throughput(peak=None)
    step = meter.step(100, 1.0, token_flops(preset("tiny"), 64))
    assert "mfu" not in step and "hfu" not in step and meter.summary()["mfu"] is None
    cpu = torch.device("cpu")
    assert peak_flops(cpu, bf16=True) is None and peak_flops(cpu, bf16=False, devices=8) is None


def test_memory_on_the_cpu_is_the_process_peak_resident_memory():
    cpu = torch.device("cpu")
    assert allocator_retries(cpu) is None
    before = host_peak_gib()
    assert before > 0.01 and device_peak_gib(cpu) >= before
