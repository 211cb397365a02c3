"""Grouped-GEMM experts (genolc.model.ops.moe.grouped_mm) on CPU: ``torch._grouped_mm`` runs there too, so the sorting,
chunking, checkpointing and scatter logic is checked against the per-expert reference without a GPU."""

from __future__ import annotations

import pytest
import torch

from genolc.model.ops.moe.grouped_mm import grouped_experts
from genolc.model.ops.moe.counts import count_per_expert
from genolc.model.ops.moe.reference import routed_experts


def _rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


def test_count_per_expert_matches_bincount():
    gen = torch.Generator().manual_seed(3)
    ids = torch.multinomial(torch.tensor([5.0, 0.0, 1.0, 3.0, 0.0, 0.5]).expand(997, -1), 2, generator=gen)
    counts = count_per_expert(ids.reshape(-1), 6)
    assert counts.dtype == torch.int64
    assert torch.equal(counts, torch.bincount(ids.reshape(-1), minlength=6))
    assert counts[1] == 0 and counts[4] == 0 and int(counts.sum()) == 2 * 997
    assert torch.equal(count_per_expert(torch.empty(0, dtype=torch.int64), 3), torch.zeros(3, dtype=torch.int64))


@pytest.mark.parametrize("dtype, chunk_tokens, tolerance", [(torch.float32, 100, 1e-5), (torch.float32, 4096, 1e-5),
                                                            (torch.bfloat16, 64, 2e-2)])
def test_matches_reference_with_skewed_routing(dtype, chunk_tokens, tolerance):
    n_tokens, hidden, inter, experts, top_k = 301, 32, 24, 6, 2
    gen = torch.Generator().manual_seed(chunk_tokens)
    x = torch.randn(n_tokens, hidden, generator=gen).to(dtype).requires_grad_(True)
    gate_up = (0.2 * torch.randn(experts, 2 * inter, hidden, generator=gen)).to(dtype).requires_grad_(True)
    down = (0.2 * torch.randn(experts, hidden, inter, generator=gen)).to(dtype).requires_grad_(True)
    # Uneven routing as on real DNA; expert 4 gets no token (an empty group in the grouped GEMM).
    skew = torch.linspace(3.0, 0.1, experts)
    skew[4] = 0.0
    expert_ids = torch.multinomial(skew.expand(n_tokens, -1), top_k, generator=gen)
    weights = torch.rand(n_tokens, top_k, generator=gen).requires_grad_(True)
    d_out = torch.randn(n_tokens, hidden, generator=gen)
    params = (x, gate_up, down, weights)
    results = []
    for op, kwargs in ((routed_experts, {}), (grouped_experts, {"chunk_tokens": chunk_tokens})):
        out, counts = op(x, expert_ids, weights, gate_up, down, 7.0, **kwargs)
        results.append((out, counts, torch.autograd.grad((out.float() * d_out).sum(), params)))
    (ref_out, ref_counts, ref_grads), (out, counts, grads) = results
    assert torch.equal(counts, ref_counts) and int(counts[4]) == 0
    assert out.dtype == dtype and _rel(out, ref_out) < tolerance
    for name, mine, theirs in zip(("x", "gate_up_proj", "down_proj", "weights"), grads, ref_grads):
        assert _rel(mine, theirs) < tolerance, name


def test_rejects_mixed_dtypes():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="share"):
        grouped_experts(x, torch.zeros(4, 1, dtype=torch.long), torch.ones(4, 1), torch.randn(2, 6, 8).bfloat16(),
                        torch.randn(2, 8, 3).bfloat16(), 7.0)


def test_autocast_with_fp32_master_weights_matches_reference():
    # The trainer's GPU setting: fp32 parameters, bf16 autocast; the grouped GEMM needs one dtype for all operands.
    n_tokens, hidden, inter, experts, top_k = 97, 32, 24, 4, 2
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n_tokens, hidden, generator=gen, requires_grad=True)
    gate_up = (0.2 * torch.randn(experts, 2 * inter, hidden, generator=gen)).requires_grad_(True)
    down = (0.2 * torch.randn(experts, hidden, inter, generator=gen)).requires_grad_(True)
    expert_ids = torch.randint(0, experts, (n_tokens, top_k), generator=gen)
    weights = torch.rand(n_tokens, top_k, generator=gen)
    ref_out, _ = routed_experts(x, expert_ids, weights, gate_up, down, 7.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = grouped_experts(x, expert_ids, weights, gate_up, down, 7.0)
    assert out.dtype == torch.float32
    assert _rel(out, ref_out) < 2e-2
    grad_gate_up, = torch.autograd.grad(out.sum(), (gate_up,))
    assert grad_gate_up.dtype == torch.float32 and torch.isfinite(grad_gate_up).all()
