"""A DSA sparse-attention forward kept from one pass for the next: the reference forward's log-sum-exp, and the
kept op's output and gradients against the op that computes its forward (pure torch, CPU).

The kernels store lse in fp32 whatever the inputs' dtype, so in float64 the kept op's gradients lie within fp32
rounding of autograd's (relative 1e-6), not float64's."""

from __future__ import annotations

import pytest
import torch

from genolc.model.ops import dispatch
from genolc.model.ops.dsa.reference import sparse_latent_attention, sparse_latent_attention_forward


def causal_rows(batch: int, seq_len: int, width: int, seed: int) -> torch.Tensor:
    """``[B, T, W]`` int64 rows of distinct causal keys, -1 where a query has fewer than W."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.full((batch, seq_len, width), -1, dtype=torch.int64)
    for b in range(batch):
        for t in range(seq_len):
            keys = torch.randperm(t + 1, generator=generator)[:width]
            rows[b, t, : keys.numel()] = keys
    return rows


def inputs(dtype=torch.float64, seed: int = 0):
    batch, seq_len, heads, rank = 2, 23, 3, 7
    generator = torch.Generator().manual_seed(seed)
    q_lat = torch.randn(batch, seq_len, heads, rank, generator=generator, dtype=dtype, requires_grad=True)
    latent = torch.randn(batch, seq_len, rank, generator=generator, dtype=dtype, requires_grad=True)
    rows = causal_rows(batch, seq_len, width=5, seed=seed)
    rows[1, 6] = -1                          # a query with no key at all
    return q_lat, latent, rows


def test_the_forward_gives_the_ops_output_and_its_log_sum_exp():
    q_lat, latent, rows = inputs()
    out, lse = sparse_latent_attention_forward(q_lat, latent, rows, 0.4, query_chunk=4)
    assert not out.requires_grad and lse.dtype == torch.float32 and lse.shape == q_lat.shape[:3]
    torch.testing.assert_close(out, sparse_latent_attention(q_lat, latent, rows, 0.4), atol=1e-12, rtol=1e-12)
    valid = rows >= 0
    keys = latent[torch.arange(2)[:, None, None], rows.clamp_min(0)]
    scores = torch.einsum("bthr,btwr->bthw", q_lat, keys) * 0.4
    expected = scores.masked_fill(~valid[:, :, None], float("-inf")).logsumexp(-1)
    assert torch.isinf(lse[1, 6]).all() and (lse[1, 6] > 0).all(), "an empty row's lse is +inf"
    expected[1, 6] = float("inf")
    torch.testing.assert_close(lse, expected.float(), atol=0, rtol=1e-6)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-6), (torch.float32, 1e-5)])
def test_the_kept_forward_has_the_computed_ones_gradients(dtype, tolerance):
    q_lat, latent, rows = inputs(dtype)
    grad_out = torch.randn(q_lat.shape, generator=torch.Generator().manual_seed(5), dtype=dtype)
    computed = sparse_latent_attention(q_lat, latent, rows.int(), 0.4, query_chunk=3)
    expected = torch.autograd.grad(computed, (q_lat, latent), grad_out)
    kept = sparse_latent_attention_forward(q_lat.detach(), latent.detach(), rows, 0.4)
    out = sparse_latent_attention(q_lat, latent, rows.int(), 0.4, kept=kept)
    assert out.data_ptr() == kept[0].data_ptr() and out.grad_fn is not None, "returned as kept, nothing recomputed"
    assert kept[0].grad_fn is None, "autograd attaches to a new tensor, not to the kept one"
    got = torch.autograd.grad(out, (q_lat, latent), grad_out)
    assert torch.equal(got[0][1, 6], torch.zeros_like(got[0][1, 6]))
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e, atol=tolerance * float(e.abs().max()), rtol=tolerance)


def test_the_dispatch_keeps_and_reuses_on_cpu():
    """genolc.model.ops.dispatch, which the DSA layer calls, routes CPU tensors to the reference, kept or not."""
    q_lat, latent, rows = inputs(torch.float32)
    kept = dispatch.sparse_latent_attention_forward(q_lat, latent, rows, 0.4)
    out = dispatch.sparse_latent_attention(q_lat, latent, rows, 0.4, kept=kept)
    torch.testing.assert_close(out, dispatch.sparse_latent_attention(q_lat, latent, rows, 0.4))
    out.sum().backward()
    assert q_lat.grad is not None and latent.grad is not None


def test_a_kept_forward_of_other_queries_is_refused():
    q_lat, latent, rows = inputs(torch.float32)
    out, lse = sparse_latent_attention_forward(q_lat, latent, rows, 0.4)
    with pytest.raises(ValueError, match="kept forward must be"):
        sparse_latent_attention(q_lat, latent, rows, 0.4, kept=(out[:, 1:], lse[:, 1:]))
    with pytest.raises(ValueError, match="fp32 lse"):
        sparse_latent_attention(q_lat, latent, rows, 0.4, kept=(out, lse.double()))
