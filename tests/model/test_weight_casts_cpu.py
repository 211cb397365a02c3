"""Per-step weight copies (genolc.model.ops.weight_casts) on CPU under bf16 autocast: the grouped-GEMM experts'
gradients over several forwards and backwards (a chunked step's) equal those of a cast per forward, bit for bit,
and each weight is cast once while the context is open."""

from __future__ import annotations

import torch

from genolc.model.ops.moe.grouped_mm import grouped_experts
from genolc.model.ops.weight_casts import compute_copy, weight_casts_per_step


def _experts(seed: int):
    generator = torch.Generator().manual_seed(seed)
    tokens, hidden, inter, experts, top_k = 64, 32, 16, 4, 2
    gate_up = (0.2 * torch.randn(experts, 2 * inter, hidden, generator=generator)).requires_grad_(True)
    down = (0.2 * torch.randn(experts, hidden, inter, generator=generator)).requires_grad_(True)
    chunks = []
    for _ in range(3):
        x = torch.randn(tokens, hidden, generator=generator)
        ids = torch.multinomial(torch.ones(experts).expand(tokens, -1), top_k, generator=generator)
        weights = torch.rand(tokens, top_k, generator=generator)
        chunks.append((x, ids, weights, torch.randn(tokens, hidden, generator=generator)))
    return gate_up, down, chunks


def _chunked_grads(per_step: bool):
    gate_up, down, chunks = _experts(0)

    def run():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for x, ids, weights, _ in chunks:
                grouped_experts(x, ids, weights, gate_up, down, 7.0)
        for x, ids, weights, d_out in reversed(chunks):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out, _ = grouped_experts(x, ids, weights, gate_up, down, 7.0)
            (out.float() * d_out).sum().backward()

    if per_step:
        with weight_casts_per_step():
            run()
    else:
        run()
    return gate_up.grad, down.grad


def test_gradients_over_chunks_equal_a_cast_per_forward():
    plain = _chunked_grads(per_step=False)
    cached = _chunked_grads(per_step=True)
    for mine, theirs in zip(cached, plain):
        assert mine.dtype == torch.float32 and torch.equal(mine, theirs)


def test_one_copy_per_weight_while_open():
    weight = torch.randn(4, 8, requires_grad=True)
    with weight_casts_per_step():
        with torch.no_grad():
            first = compute_copy(weight, torch.bfloat16)
        second = compute_copy(weight, torch.bfloat16)
        assert second.requires_grad and second.data_ptr() == first.data_ptr()
        (second.float() * 3).sum().backward()
        (compute_copy(weight, torch.bfloat16).float() * 2).sum().backward()
    torch.testing.assert_close(weight.grad, torch.full_like(weight, 5.0))
    outside = compute_copy(weight, torch.bfloat16)
    assert outside.data_ptr() != first.data_ptr()
    (grad,) = torch.autograd.grad(outside.float().sum(), weight)
    torch.testing.assert_close(grad, torch.ones_like(weight))


def test_nested_contexts_share_the_outer_copies():
    weight = torch.randn(3, 5, requires_grad=True)
    with weight_casts_per_step():
        outer = compute_copy(weight, torch.bfloat16)
        with weight_casts_per_step():
            inner = compute_copy(weight, torch.bfloat16)
        assert inner.data_ptr() == outer.data_ptr()
        assert compute_copy(weight, torch.bfloat16).data_ptr() == outer.data_ptr()
    assert compute_copy(weight, torch.bfloat16).data_ptr() != outer.data_ptr()
