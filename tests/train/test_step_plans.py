"""The step strategy of each window length on its own (genolc/train/step_plans.py): chosen and said once per length,
recompute a plan adds wrapped into the model once, and an out-of-memory step's message from its plan."""

from __future__ import annotations

import dataclasses

import torch

from genolc.model import build_model, preset
from genolc.train import step_plans
from genolc.train.config import TrainConfig
from genolc.train.schedule import StepShape
from genolc.train.step_plans import StepPlans


def _plans(tmp_path, said, **changes) -> StepPlans:
    config = TrainConfig(data=tmp_path / "data", out=tmp_path / "run", seq_len=256, **changes)
    model = build_model(preset("tiny"))
    return StepPlans(model, config, device=torch.device("cpu"), bf16=False, stream_dtype="float32", cp_size=1,
                     applied=["compile(glue)"], say=said.append)


def _shape(seq_len: int) -> StepShape:
    return StepShape(seq_len=seq_len, windows=1, grad_accum=1, stage=0)


def test_each_length_is_planned_and_said_once(tmp_path):
    said = []
    plans = _plans(tmp_path, said, chunk=64)
    first = plans.for_shape(_shape(256))
    assert plans.for_shape(_shape(256)) is first and first.chunk == 64
    assert len(said) == 1 and "--chunk 64" in said[0]
    plans.for_shape(_shape(128))
    assert len(plans.strategies) == 2 and len(said) == 2
    assert plans.applied == ["compile(glue)"] and not plans.recompute


def test_recompute_a_plan_adds_is_applied_once_and_recorded(tmp_path, monkeypatch):
    chosen = []
    original = step_plans.choose_strategy

    def with_recompute(*args, **kwargs):
        chosen.append(kwargs["recompute"])
        return dataclasses.replace(original(*args, **kwargs), chunk=64, recompute=True, reason="test")

    monkeypatch.setattr(step_plans, "choose_strategy", with_recompute)
    plans = _plans(tmp_path, [])
    plans.for_shape(_shape(256))
    plans.for_shape(_shape(128))
    assert chosen == [False, True]          # the shorter length is planned with the recompute the longer one added
    assert plans.recompute and plans.applied[1:] == ["recompute(4 layers, for --seq 256)"]


def test_an_out_of_memory_step_is_told_its_plan_and_what_fits(tmp_path, monkeypatch):
    monkeypatch.setattr(step_plans, "device_budget_bytes", lambda device: 64 * 2**20)
    plans = _plans(tmp_path, [], chunk=0)
    error = plans.oom_error(0)
    assert "out of device memory at --seq 256" in str(error) and "step 1" in str(error)
    assert plans.device_bytes() == 64 * 2**20
