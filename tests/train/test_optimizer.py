"""The trainer's AdamW (genolc/train/optimizer.py): its groups, its implementation per device, and that a resumed
run keeps this process's implementation whatever the checkpoint was saved with."""

from __future__ import annotations

import types

import torch

from genolc.model import build_model, preset
from genolc.train.optimizer import build_adamw, keep_step_kernel, parameter_groups, step_kernel


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
    assert step_kernel(model) == {"fused": False, "foreach": True}
    optimizer = build_adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    assert all(group["foreach"] and not group["fused"] for group in optimizer.param_groups)

    on_cuda = types.SimpleNamespace(parameters=lambda: iter([types.SimpleNamespace(is_cuda=True)]))
    assert step_kernel(on_cuda) == {"fused": True, "foreach": False}


def test_a_resumed_optimizer_steps_with_this_process_s_kernel():
    model = _model()
    saved_on_gpu = build_adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1).state_dict()
    for group in saved_on_gpu["param_groups"]:
        group.update(fused=True, foreach=False)
    optimizer = build_adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    optimizer.load_state_dict(saved_on_gpu)
    # torch takes the saved groups' options: fused CPU steps would differ in rounding from the run's own.
    assert all(group["fused"] for group in optimizer.param_groups)
    keep_step_kernel(optimizer, model)
    assert all(group["foreach"] and not group["fused"] for group in optimizer.param_groups)
    loss = sum(param.square().sum() for param in model.parameters())
    loss.backward()
    optimizer.step()
