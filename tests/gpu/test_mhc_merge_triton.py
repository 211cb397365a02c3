"""mHC's merge kernels (genolc/model/ops/mhc/merge_triton.py) and their custom op on CUDA against the reference
formulas in fp64, with NaN-poisoned memory under the outputs. Needs CUDA."""

from __future__ import annotations

import functools

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.ops import dispatch  # noqa: E402
from genolc.model.ops.mhc import merge_triton, op, reference  # noqa: E402

pytestmark = pytest.mark.gpu


def _inputs(tokens: int, n: int, dim: int, dtype: torch.dtype):
    gen = torch.Generator(device="cuda").manual_seed(tokens + dim + n)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    return (randn(1, tokens, dim).to(dtype), 2 * torch.rand(1, tokens, n, generator=gen, device="cuda"),
            torch.softmax(randn(1, tokens, n, n), -1), randn(1, tokens, n, dim).to(dtype))


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm())


def _poison_the_allocator(nbytes: int) -> None:
    # The caching allocator hands the freed NaN blocks to the kernels' outputs (torch.empty_like).
    torch.full((nbytes // 4,), float("nan"), device="cuda")
    torch.cuda.synchronize()


@pytest.mark.parametrize("tokens, n, dim, dtype, config", [
    (1, 4, 1536, torch.bfloat16, {}),
    (32771, 4, 1536, torch.bfloat16, {}),
    (5003, 4, 1024, torch.float32, {}),
    (777, 4, 1000, torch.bfloat16, {"rows_per_program": 2, "block_d": 512}),
    (129, 8, 96, torch.bfloat16, {"rows_per_program": 1, "block_d": 128, "num_warps": 8}),
    (64, 2, 130, torch.float32, {}),
])
def test_kernels_match_fp64_formulas(tokens, n, dim, dtype, config):
    inputs = _inputs(tokens, n, dim, dtype)
    grad = torch.randn(1, tokens, n, dim, device="cuda").to(dtype)
    exact = [t.double() for t in inputs]
    _poison_the_allocator(8 * tokens * n * dim * 4)
    out = merge_triton.merge(*inputs, **config)
    grads = merge_triton.merge_backward(grad, *inputs, **config)
    # One rounding to the output's dtype at most: half a bf16 ulp, ~2e-3 relative.
    tolerance = 1e-6 if dtype == torch.float32 else 4e-3
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    assert _relative(out, reference.merge(*exact)) < tolerance
    expected = reference.merge_backward(grad.double(), *exact)
    for name, got, want, source in zip(("block_out", "post", "comb", "streams"), grads, expected, inputs):
        assert got.dtype == source.dtype and got.shape == source.shape, name
        assert bool(torch.isfinite(got).all()), name
        assert _relative(got, want) < tolerance, name


def test_the_kernel_rounds_as_the_compiled_fp32_merge_did():
    """The merge the trainer ran before (reference.merge in fp32, compiled by inductor) and the kernel: the same
    sums in the same order, so the bf16 results differ in a few elements by one ulp at most (FMA contraction)."""
    inputs = _inputs(8192, 4, 1536, torch.bfloat16)
    compiled = torch.compile(reference.merge, dynamic=False)
    before = compiled(*inputs, compute_dtype=torch.float32)
    after = merge_triton.merge(*inputs)
    differ = before != after
    assert float(differ.float().mean()) < 1e-3
    ulp = before.float().abs() * 2 ** -7
    assert bool(((before.float() - after.float()).abs() <= ulp + 1e-30)[differ].all())


@pytest.mark.parametrize("compiled", [False, True])
def test_op_gradients_under_autocast_match_the_reference(compiled):
    inputs = [t.requires_grad_() for t in _inputs(4099, 4, 1024, torch.bfloat16)]
    grad = torch.randn(1, 4099, 4, 1024, device="cuda").bfloat16()
    fp32_merge = functools.partial(dispatch.mhc_merge, compute_dtype=torch.float32)
    merge = torch.compile(fp32_merge, dynamic=False) if compiled else fp32_merge
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = merge(*inputs)
    got = torch.autograd.grad(out, inputs, grad)
    exact = [t.detach().double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(reference.merge(*exact), exact, grad.double())
    assert out.dtype == torch.bfloat16
    for name, g, w in zip(("block_out", "post", "comb", "streams"), got, want):
        assert _relative(g, w) < 4e-3, name


def test_dispatch_sends_what_the_kernels_do_not_take_to_the_reference(monkeypatch):
    monkeypatch.setattr(op, "merge_op", lambda *args: pytest.fail("the custom op took three streams"))
    inputs = _inputs(33, 3, 64, torch.bfloat16)
    assert torch.equal(dispatch.mhc_merge(*inputs, compute_dtype=torch.float32),
                       reference.merge(*inputs, compute_dtype=torch.float32))
