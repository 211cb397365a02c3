"""GPU test helpers: NaN-poison the CUDA caching allocator so outputs a kernel forgets to write show up as NaN."""

from __future__ import annotations

import pytest
import torch


def poison_cuda_cache(gib: float = 4.0) -> None:
    """Fill ``gib`` GiB of fresh device memory with NaN and free it back to torch's cache.

    Later ``torch.empty`` calls (the ops' outputs and gradients) are carved from these cached blocks, so any
    element an op leaves unwritten reads NaN.
    """
    torch.cuda.synchronize()
    block = torch.full((int(gib * (1 << 30)) // 4,), float("nan"), dtype=torch.float32, device="cuda")
    del block
    torch.cuda.synchronize()


@pytest.fixture(name="poison")
def poison_fixture():
    return poison_cuda_cache


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64; NaN anywhere gives inf (never passes)."""
    actual, expected = actual.double(), expected.double()
    if not torch.isfinite(actual).all():
        return float("inf")
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


@pytest.fixture(name="rel_err")
def rel_err_fixture():
    return rel_err
