"""The trainer's fused AdamW on CUDA (genolc/train/optimizer.py) resumes a ``foreach`` checkpoint: torch places the
saved ``step`` counts by the saved groups' flags, on the CPU for ``foreach``, and the fused step refused them
(``state_steps is on cpu``) until the loaded flags became this process's."""

from __future__ import annotations

import io

import pytest
import torch

from genolc.model import build_model, preset
from genolc.train.optimizer import build_adamw, parameter_groups

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _loss(model: torch.nn.Module) -> torch.Tensor:
    return sum(param.square().sum() for param in model.parameters())


def test_a_foreach_checkpoint_resumes_fused_on_cuda():
    torch.manual_seed(0)
    model = build_model(preset("tiny"), device="cuda")
    before = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-3, foreach=True)
    _loss(model).backward()
    before.step()
    saved = io.BytesIO()
    torch.save(before.state_dict(), saved)
    saved.seek(0)
    optimizer = build_adamw(model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    # As genolc/train/state.py loads a checkpoint's optimizer state.
    optimizer.load_state_dict(torch.load(saved, map_location="cpu", weights_only=True))
    assert all(group["fused"] and not group["foreach"] for group in optimizer.param_groups)
    model.zero_grad()
    _loss(model).backward()
    optimizer.step()
    assert all(value["step"].is_cuda and float(value["step"]) == 2.0 for value in optimizer.state.values())
