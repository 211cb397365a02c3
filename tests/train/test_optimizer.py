"""The trainer's AdamW (genolc/train/optimizer.py): its groups, its implementation per device, and that a resumed
run steps with this process's implementation whatever the checkpoint was saved with (tests/gpu/test_optimizer_gpu.py
resumes a ``foreach`` state into the fused optimizer on CUDA)."""

from __future__ import annotations

import types

import pytest
import torch

from genolc.model import build_model, preset
from genolc.train import optimizer as optimizer_module
from genolc.train.optimizer import adamw_implementation, build_adamw, parameter_groups


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(preset("tiny"))


def test_matrices_decay_and_vectors_and_embeddings_do_not():
    model = _model()
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(param): name for name, param in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(param.ndim >= 2 and "embed" not in names[id(param)] for param in decay["params"])
    assert any("embed" in names[id(param)] for param in no_decay["params"])
    assert any(param.ndim == 1 for param in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == sum(1 for _ in model.parameters())


def test_frozen_parameters_are_left_out():
    model = _model()
    next(param for name, param in model.named_parameters() if "embed" in name).requires_grad_(False)
    grouped = [param for group in parameter_groups(model, 0.1) for param in group["params"]]
    assert all(param.requires_grad for param in grouped)
    assert len(grouped) == sum(1 for param in model.parameters() if param.requires_grad)


def test_cpu_steps_foreach_and_cuda_steps_fused():
    model = _model()
    assert adamw_implementation(model) == {"fused": False, "foreach": True}
    optimizer = build_adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    assert all(group["foreach"] and not group["fused"] for group in optimizer.param_groups)
    on_cuda = types.SimpleNamespace(parameters=lambda: iter([types.SimpleNamespace(is_cuda=True)]))
    assert adamw_implementation(on_cuda) == {"fused": True, "foreach": False}


def _saved_state(model: torch.nn.Module, **flags: bool) -> dict:
    """An optimizer state after one step, its groups saying they were stepped with ``flags``."""
    optimizer = build_adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    sum(param.square().sum() for param in model.parameters()).backward()
    optimizer.step()
    state = optimizer.state_dict()
    return {**state, "param_groups": [{**group, **flags} for group in state["param_groups"]]}


@pytest.mark.parametrize("saved, here", [("fused", "foreach"), ("foreach", "fused")])
def test_a_resumed_optimizer_steps_with_this_process_s_implementation(saved, here, monkeypatch):
    """torch's load_state_dict takes the saved groups' flags and places each ``step`` count by them: a ``foreach``
    checkpoint resumed into a fused optimizer on CUDA kept its counts on the CPU and failed the fused step. The
    loaded flags are this process's, so torch places the counts as the implementation that steps them needs (fused:
    float32 beside the parameter). Fused AdamW runs on the CPU too, which stands in for CUDA here."""
    model = _model()
    state = _saved_state(model, fused=saved == "fused", foreach=saved == "foreach")
    monkeypatch.setattr(optimizer_module, "adamw_implementation",
                        lambda model: {"fused": here == "fused", "foreach": here == "foreach"})
    optimizer = build_adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    optimizer.load_state_dict(state)
    assert all(group["fused"] == (here == "fused") and group["foreach"] == (here == "foreach")
               for group in optimizer.param_groups)
    steps = [value["step"] for value in optimizer.state.values()]
    assert steps and all(step.dtype == torch.float32 and float(step) == 1.0 for step in steps)
    sum(param.square().sum() for param in model.parameters()).backward()
    optimizer.step()
    assert all(float(value["step"]) == 2.0 for value in optimizer.state.values())
