"""Grouped-GEMM experts (genolc.model.ops.moe.grouped_mm) against the per-expert reference op. Needs CUDA."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.layers.moe import Experts  # noqa: E402
from genolc.model.ops.moe.grouped_mm import grouped_experts  # noqa: E402
from genolc.model.ops.moe.reference import routed_experts  # noqa: E402
from genolc.model.presets import small  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n_tokens, chunk_tokens", [(5003, 65536), (20011, 4096), (131071, 65536)])
def test_matches_reference_experts(n_tokens, chunk_tokens, poison, rel_err):
    config = small()
    torch.manual_seed(n_tokens)
    experts = Experts(config).cuda().bfloat16()
    x = torch.randn(n_tokens, config.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    # Skewed routing: real DNA sends most tokens to a few experts; expert 5 gets none.
    skew = torch.linspace(3.0, 0.1, config.n_routed_experts, device="cuda")
    skew[5] = 0.0
    expert_ids = torch.multinomial(skew.expand(n_tokens, -1), config.num_experts_per_tok)
    weights = torch.rand(n_tokens, config.num_experts_per_tok, device="cuda")
    d_out = torch.randn(n_tokens, config.hidden_size, device="cuda")
    params = (x, experts.gate_up_proj, experts.down_proj)

    ref_out, ref_counts = routed_experts(x, expert_ids, weights, experts.gate_up_proj, experts.down_proj,
                                         experts.swiglu_limit)
    ref_grads = torch.autograd.grad((ref_out.float() * d_out).sum(), params)
    poison()
    out, counts = grouped_experts(x, expert_ids, weights, experts.gate_up_proj, experts.down_proj,
                                  experts.swiglu_limit, chunk_tokens=chunk_tokens)
    grads = torch.autograd.grad((out.float() * d_out).sum(), params)
    assert torch.equal(counts, ref_counts) and int(counts[5]) == 0
    assert rel_err(out, ref_out) < 1e-2
    for name, mine, theirs in zip(("x", "gate_up_proj", "down_proj"), grads, ref_grads):
        assert rel_err(mine, theirs) < 1e-2, name


def _on_cpu(op, *args):
    moved = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
    return op(*moved)


@pytest.mark.parametrize("slots, inter", [(5003, 768), (131071, 512), (17, 200)])
def test_swiglu_kernels_match_the_torch_formulas(slots, inter, poison, rel_err):
    from genolc.model.ops.moe.op import swiglu_backward_op, swiglu_op

    torch.manual_seed(slots)
    hidden = (4.0 * torch.randn(slots, 2 * inter, device="cuda")).bfloat16()
    hidden[0, :3] = torch.tensor([7.0, 9.0, -7.0])
    hidden[0, inter: inter + 3] = torch.tensor([7.0, -7.5, 8.0])
    # A NaN gate and a NaN up (a diverged expert) stay NaN, as through torch's clamp.
    hidden[-1, 1] = float("nan")
    hidden[-1, inter + 2] = float("nan")
    grad = torch.randn(slots, inter, device="cuda", dtype=torch.bfloat16)
    poison()
    out = swiglu_op(hidden, 7.0)
    d_hidden = swiglu_backward_op(grad, hidden, 7.0)
    expected_out = _on_cpu(swiglu_op, hidden, 7.0)
    expected = _on_cpu(swiglu_backward_op, grad, hidden, 7.0)
    assert torch.equal(out.cpu().isnan(), expected_out.isnan()) and bool(out[-1, 1].isnan() & out[-1, 2].isnan())
    assert torch.equal(d_hidden.cpu().isnan(), expected.isnan())
    assert rel_err(out[:-1].cpu(), expected_out[:-1]) < 4e-3
    assert rel_err(d_hidden[:-1].cpu(), expected[:-1]) < 4e-3
    assert torch.equal(d_hidden.cpu() == 0, expected == 0)


@pytest.mark.parametrize("tokens, top_k, dim", [(5003, 4, 1536), (32768, 2, 1024), (7, 3, 40)])
def test_gather_and_combine_kernels_match_the_torch_formulas(tokens, top_k, dim, poison, rel_err):
    from genolc.model.ops.moe.op import (combine_backward_op, combine_op, gather_slots_backward_op,
                                         slot_positions)

    torch.manual_seed(tokens)
    skew = torch.linspace(3.0, 0.1, 16, device="cuda")
    order = torch.multinomial(skew.expand(tokens, -1), top_k).reshape(-1).argsort(stable=True)
    position = slot_positions(order)
    rows = torch.randn(tokens * top_k, dim, device="cuda", dtype=torch.bfloat16)
    weights = torch.rand(tokens, top_k, device="cuda")
    grad = torch.randn(tokens, dim, device="cuda", dtype=torch.bfloat16)
    poison()
    out = combine_op(rows, position, weights)
    d_rows, d_weights = combine_backward_op(grad, rows, position, weights)
    d_x = gather_slots_backward_op(rows, position, top_k)
    assert rel_err(out.cpu(), _on_cpu(combine_op, rows, position, weights)) < 4e-3
    expected_rows, expected_weights = _on_cpu(combine_backward_op, grad, rows, position, weights)
    assert rel_err(d_rows.cpu(), expected_rows) < 4e-3
    assert d_weights.dtype == torch.float32 and rel_err(d_weights.cpu(), expected_weights) < 1e-5
    assert rel_err(d_x.cpu(), _on_cpu(gather_slots_backward_op, rows, position, top_k)) < 4e-3
