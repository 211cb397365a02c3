"""The trainer's AdamW: which parameters decay, and which of torch's implementations steps them.

On CUDA the step is torch's fused AdamW: one multi-tensor kernel (launched in batches of tensors) that reads and
writes each parameter, gradient and moment once. torch's ``foreach`` form, used before, runs several multi-tensor
kernels a step, each a pass over some of them: `base`'s 1.9B parameters took 43.7 ms a step on the H200 with it and
16.8 ms fused, `small`'s 8.8 and 3.6 ms; after three steps from the same state the two differ by at most 3.6e-7 in a
weight (benchmarks/results/first_step_adamw_2026-12-04/call1_caeb31e/fused_adamw_2026-12-04.json). Elsewhere (the
CPU tests and CPU runs) the step stays ``foreach``, so their numbers do not change.

A checkpoint's optimizer state names the implementation it was saved with, and torch's ``load_state_dict`` takes the
saved groups' flags and places each parameter's ``step`` count by them (on the CPU for ``foreach``, beside the
parameter for fused): a ``foreach`` checkpoint resumed on CUDA would then fail in the fused step (``state_steps is on
cpu``). :func:`build_adamw` therefore rewrites the flags of any state loaded into it to this process's before torch
reads them, so a checkpoint from before this change, or from a CPU run, resumes fused on a GPU and the other way
round.
"""

from __future__ import annotations

import torch


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices decayed by ``weight_decay``; vectors (norm scales, biases, gates) and embedding rows
    not."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 and "embed" not in name else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw_implementation(model: torch.nn.Module) -> dict[str, bool]:
    """torch's AdamW flags for the model's parameters: ``fused`` where they are on CUDA, else ``foreach``."""
    on_cuda = any(param.is_cuda for param in model.parameters())
    return {"fused": on_cuda, "foreach": not on_cuda}


def build_adamw(model: torch.nn.Module, *, lr: float, betas: tuple[float, float], eps: float,
                weight_decay: float) -> torch.optim.AdamW:
    """The trainer's optimizer for ``model`` (see the module docstring)."""
    implementation = adamw_implementation(model)
    optimizer = torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas, eps=eps,
                                  **implementation)

    def with_this_implementation(_optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
        groups = [{**group, **implementation} for group in state_dict["param_groups"]]
        return {**state_dict, "param_groups": groups}

    optimizer.register_load_state_dict_pre_hook(with_this_implementation)
    return optimizer
