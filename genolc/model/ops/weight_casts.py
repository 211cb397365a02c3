"""Compute-dtype copies of fp32 weights made once per micro-batch, their gradients added straight into ``.grad``.

Under bf16 autocast every forward casts the fp32 master weights it multiplies by, and every backward casts their
bf16 gradient back to fp32 and adds it to ``.grad`` (two kernels). The chunk-recurrent step runs two forwards and
one backward per chunk, so at 512k in 16k chunks `base`'s routed experts (1.7 B of its 1.9 B parameters) were cast
64 times and their gradients cast and added 32 times a step: about 2 s of its 21 s of kernels went to those casts
and adds (benchmarks/results/profile_chunked_base_512k_compiled.json, 2026-12-02).

Inside :func:`weight_casts_per_step` (opened by genolc/train/chunked.py around one micro-batch's forwards and
backwards: the whole step unless gradients accumulate over several), :func:`compute_copy` casts each weight once
and hands out that copy to every later forward inside; where gradients are on, the copy goes
through :class:`_CopyOfWeight`, whose backward adds the copy's gradient into the weight's fp32 ``.grad`` in one
kernel (``add_`` of a bf16 into an fp32 tensor: the same fp32 sum as the cast and add it replaces) and hands no
gradient on. It bypasses ``AccumulateGrad``, so a gradient hook on such a weight (DDP's, FSDP's) would not see
it; genolc sums gradients across ranks from ``.grad`` after the step (genolc/parallel/step.py). Outside the
context (evaluation, the whole-window step, the tests' ``autograd.grad``) it is ``weight.to(dtype)``.

Consequences: the weight must not change inside the context (the optimizer steps after it); ``torch.autograd.grad``
with respect to such a weight sees no gradient inside the context (its ``.grad`` gets it instead); the copies live
until the context closes (the memory plan's 2 bytes a parameter for bf16 weight copies, genolc/train/plan.py).
The cache is a module global, not a context variable, so that a checkpointed forward replayed in autograd's
backward thread finds the same copies.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

_copies: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None


@contextmanager
def weight_casts_per_step() -> Iterator[None]:
    """Cast each weight :func:`compute_copy` sees once while open; nested use keeps the outer cache."""
    global _copies
    if _copies is not None:
        yield
        return
    _copies = {}
    try:
        yield
    finally:
        _copies = None


class _CopyOfWeight(torch.autograd.Function):
    """``copy`` (the step's cast of ``weight``) with its gradient added into ``weight.grad`` by the backward."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        # A leaf parameter held on ctx (not saved for backward): the backward writes its .grad, as AccumulateGrad.
        ctx.weight = weight
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weight = ctx.weight
        if weight.grad is None:
            weight.grad = grad.to(weight.dtype, memory_format=torch.contiguous_format)
        else:
            weight.grad.add_(grad)
        return None, None


def compute_copy(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``weight`` in ``dtype``: inside :func:`weight_casts_per_step`, for a leaf fp32 weight, the step's one copy
    (its gradient added to ``weight.grad`` directly); otherwise ``weight.to(dtype)``."""
    if _copies is None or weight.dtype == dtype or not weight.is_leaf:
        return weight.to(dtype)
    entry = _copies.get(id(weight))
    if entry is None or entry[0] is not weight or entry[1].dtype != dtype:
        entry = (weight, weight.detach().to(dtype))
        _copies[id(weight)] = entry
    copy = entry[1]
    if torch.is_grad_enabled() and weight.requires_grad:
        return _CopyOfWeight.apply(weight, copy)
    return copy
