"""The routed experts' glue ops (genolc.model.ops.moe.op) on CPU: their torch formulas, forward and the backward
written out, against autograd of the eager reference in fp64; the CUDA kernels are checked against the same
formulas on the GPU (tests/gpu/test_moe_grouped_mm.py) and under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from genolc.model.ops.moe.op import combine_op, gather_slots_op, slot_positions, swiglu_op
from genolc.model.ops.moe.swiglu import clamped_swiglu

LIMIT = 7.0


def _hidden(rows: int, inter: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    hidden = 5.0 * torch.randn(rows, 2 * inter, generator=generator, dtype=torch.float64)
    # Values on and beyond both clamp bounds: the gradient passes at the bound itself, as torch's clamp.
    hidden[0, :4] = torch.tensor([LIMIT, LIMIT + 1.0, -LIMIT, 30.0], dtype=torch.float64)
    hidden[0, inter: inter + 4] = torch.tensor([LIMIT, -LIMIT, -LIMIT - 0.5, LIMIT + 2.0], dtype=torch.float64)
    return hidden.to(dtype).requires_grad_(True)


@pytest.mark.parametrize("rows, inter", [(1, 4), (37, 24), (130, 100)])
def test_swiglu_op_and_backward_match_autograd_of_the_reference(rows, inter):
    hidden = _hidden(rows, inter, torch.float64, rows)
    d_out = torch.randn(rows, inter, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = clamped_swiglu(*hidden.chunk(2, dim=-1), LIMIT)
    (expected_grad,) = torch.autograd.grad(expected, hidden, d_out)
    got = swiglu_op(hidden, LIMIT)
    (grad,) = torch.autograd.grad(got, hidden, d_out)
    assert got.dtype == torch.float64 and grad.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)
    assert float(grad[0, 1]) == 0.0 and float(grad[0, inter + 2]) == 0.0 and float(grad[0, inter + 3]) == 0.0


def test_swiglu_op_in_bf16_rounds_once():
    hidden = _hidden(64, 48, torch.bfloat16, 5)
    exact = clamped_swiglu(*hidden.detach().double().chunk(2, dim=-1), LIMIT)
    got = swiglu_op(hidden.detach(), LIMIT)
    assert got.dtype == torch.bfloat16
    # One rounding: within half a bf16 ulp (2^-8 relative) of the exact value.
    assert float(((got.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max()) <= 2.0 ** -8


def _slots(tokens: int, top_k: int, experts: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    expert_ids = torch.multinomial(torch.linspace(3.0, 0.1, experts).expand(tokens, -1), top_k,
                                   generator=generator)
    order = expert_ids.reshape(-1).argsort(stable=True)
    return expert_ids, order, slot_positions(order)


def test_slot_positions_invert_the_order():
    _, order, position = _slots(41, 3, 7, 0)
    assert torch.equal(order[position], torch.arange(order.numel()))
    assert torch.equal(position[order], torch.arange(order.numel()))


@pytest.mark.parametrize("tokens, top_k", [(1, 1), (29, 2), (53, 4)])
def test_gather_slots_and_its_backward(tokens, top_k):
    _, order, position = _slots(tokens, top_k, 6, tokens)
    x = torch.randn(tokens, 10, dtype=torch.float64, requires_grad=True)
    d_rows = torch.randn(tokens * top_k, 10, dtype=torch.float64)
    expected = x[order // top_k]
    (expected_grad,) = torch.autograd.grad(expected, x, d_rows)
    got = gather_slots_op(x, order, position, top_k)
    (grad,) = torch.autograd.grad(got, x, d_rows)
    assert torch.equal(got, expected)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tokens, top_k", [(1, 1), (29, 2), (53, 4)])
def test_combine_and_its_backward_match_the_eager_weighted_sum(tokens, top_k):
    _, order, position = _slots(tokens, top_k, 6, tokens + 1)
    generator = torch.Generator().manual_seed(tokens)
    rows = torch.randn(tokens * top_k, 12, generator=generator, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(tokens, top_k, generator=generator, dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(tokens, 12, generator=generator, dtype=torch.float64)
    weighted = rows * weights.reshape(-1)[order].unsqueeze(-1)
    expected = torch.zeros(tokens, 12, dtype=torch.float64).index_add(0, order // top_k, weighted)
    expected_grads = torch.autograd.grad(expected, (rows, weights), d_out)
    got = combine_op(rows, position, weights)
    grads = torch.autograd.grad(got, (rows, weights), d_out)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(grads, expected_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)


def test_the_ops_pass_torch_library_opcheck():
    _, order, position = _slots(19, 2, 5, 3)
    hidden = _hidden(38, 8, torch.float32, 2)
    rows = torch.randn(38, 6, requires_grad=True)
    weights = torch.rand(19, 2, requires_grad=True)
    x = torch.randn(19, 6, requires_grad=True)
    torch.library.opcheck(swiglu_op, (hidden, LIMIT))
    torch.library.opcheck(combine_op, (rows, position, weights))
    torch.library.opcheck(gather_slots_op, (x, order, position, 2))
