"""Autocast guard for the pure-torch reference ops.

The references promise fp32 arithmetic (the KDA state recurrence, the indexer's pool scores), and they cast their
inputs with ``.float()``. Under ``torch.autocast`` that is not enough: autocast re-casts the operands of every
matmul/einsum to bf16, so a reference called inside the model's bf16 autocast region silently computes in bf16
(it reorders near-tied indexer pools and loses accuracy in the KDA chunk solve). :func:`autocast_off` switches
autocast off for the call; outputs keep the dtypes each reference documents.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable)


def autocast_off(fn: F) -> F:
    """Decorator: run ``fn`` with CUDA and CPU autocast disabled."""

    @functools.wraps(fn)
    def without_autocast(*args, **kwargs):
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            return fn(*args, **kwargs)

    return without_autocast  # type: ignore[return-value]
