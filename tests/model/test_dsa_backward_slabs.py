"""The slab-ordered DSA backward's torch side (genolc.model.ops.dsa.tilelang.backward_slabs) on CPU: the sort and cut
of the index rows (genolc.model.ops.dsa.slab_order), the row dot (row_dot.py), the slab split of the math in fp64 (per
(query, slab) groups, dQ summed over the slabs) against autograd through the reference, and which backward the
TileLang op runs. The TileLang kernel itself needs CUDA (tests/gpu/test_dsa_tilelang.py;
benchmarks/bench_dsa_backward_configs.py times it)."""

from __future__ import annotations

import pytest
import torch

from genolc.model.ops.dsa import reference, row_dot
from genolc.model.ops.dsa import slab_order as slab_order_module
from genolc.model.ops.dsa.tilelang import backward_slabs


def slabbed_backward_reference(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                               lse: torch.Tensor, d_out: torch.Tensor, softmax_scale: float,
                               slab_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The slab split and the math in torch, fp64, one (query, slab) group at a time: sorted rows cut by
    ``slab_order``, per-group ``dQ`` partials summed over the slabs, ``dC`` scattered per group. It tests the
    host side and the decomposition, not the kernel's own details (blocks of ``block_slots``, clamped slot indices,
    the count mask, bf16 P and dS): those are the GPU test's. Slow; for small sizes."""
    rows, offsets = slab_order_module.slab_order(indices, slab_rows, latent.shape[1])
    q, c, o, do = (x.double() for x in (q_lat, latent, out, d_out))
    delta = (o * do).sum(-1)
    d_q = torch.zeros_like(q)
    d_c = torch.zeros_like(c)
    batch, seq_len, _, _ = q.shape
    for b in range(batch):
        for t in range(seq_len):
            for s in range(offsets.shape[-1] - 1):
                lo, hi = int(offsets[b, t, s]), int(offsets[b, t, s + 1])
                if hi == lo:
                    continue
                slots = rows[b, t, lo:hi].long()
                kv = c[b, slots]                                             # [n, R]
                scores = softmax_scale * q[b, t] @ kv.T                      # [H, n]
                probs = torch.exp(scores - lse[b, t].double()[:, None])
                d_probs = do[b, t] @ kv.T
                d_scores = probs * (d_probs - delta[b, t][:, None]) * softmax_scale
                d_q[b, t] += d_scores @ kv
                d_c[b].index_add_(0, slots, d_scores.T @ q[b, t] + probs.T @ do[b, t])
    return d_q.to(q_lat.dtype), d_c.to(latent.dtype)


def naive_slab_order(indices: torch.Tensor, slab_rows: int, kv_len: int):
    n_slabs = max(1, -(-kv_len // slab_rows))
    rows = torch.full(indices.shape, -1, dtype=torch.int32)
    offsets = torch.zeros(*indices.shape[:-1], n_slabs + 1, dtype=torch.int32)
    for b in range(indices.shape[0]):
        for t in range(indices.shape[1]):
            valid = sorted((int(i) for i in indices[b, t] if i >= 0), key=lambda i: i // slab_rows)
            rows[b, t, :len(valid)] = torch.tensor(valid, dtype=torch.int32)
            for s in range(n_slabs + 1):
                offsets[b, t, s] = sum(1 for i in valid if i < s * slab_rows)
    return rows, offsets


@pytest.mark.parametrize("slab_rows, kv_len", [(32, 101), (101, 101), (7, 64), (1000, 101), (1, 255), (1, 256), (1, 300)])
def test_slab_order_matches_a_per_row_loop(slab_rows, kv_len):
    gen = torch.Generator().manual_seed(slab_rows)
    indices = torch.randint(-1, kv_len, (2, 9, 13), generator=gen, dtype=torch.int32)
    indices[1, 4] = -1                                        # a row with no valid slot
    rows, offsets = slab_order_module.slab_order(indices, slab_rows, kv_len)
    expected_rows, expected_offsets = naive_slab_order(indices, slab_rows, kv_len)
    assert rows.dtype == offsets.dtype == torch.int32
    assert torch.equal(rows, expected_rows)
    assert torch.equal(offsets, expected_offsets)
    assert offsets.shape[-1] == max(1, -(-kv_len // slab_rows)) + 1
    assert torch.equal(offsets[1, 4], torch.zeros_like(offsets[1, 4]))


def test_slab_order_takes_int64_rows_and_rejects_bad_sizes():
    indices = torch.tensor([[[5, -1, 0, 3]]], dtype=torch.int64)
    rows, offsets = slab_order_module.slab_order(indices, 4, 6)
    assert rows.tolist() == [[[0, 3, 5, -1]]]
    assert offsets.tolist() == [[[0, 2, 3]]]
    # Grouped by slab, each slab's slots in their row's order (ascending rows stay ascending).
    rows, offsets = slab_order_module.slab_order(torch.tensor([[[5, 3, -1, 0, 4]]]), 4, 6)
    assert rows.tolist() == [[[3, 0, 5, 4, -1]]]
    assert offsets.tolist() == [[[0, 2, 4]]]
    with pytest.raises(ValueError, match="slab_rows"):
        slab_order_module.slab_order(indices, 0, 6)
    with pytest.raises(ValueError, match="kv_len"):
        slab_order_module.slab_order(indices, 4, 2 ** 31)
    with pytest.raises(ValueError, match="use slab_rows >= 2"):
        slab_order_module.slab_order(indices, 1, slab_order_module.MAX_SLABS + 1)


def test_slab_order_kernel_takes_what_it_can_and_the_torch_form_runs_on_cpu():
    indices = torch.tensor([[[5, -1, 0, 3]]], dtype=torch.int32)
    assert slab_order_module.kernel_unsupported(indices, 16) is None
    assert slab_order_module.kernel_unsupported(indices, 255) is None
    assert "256 slabs" in slab_order_module.kernel_unsupported(indices, 256)
    assert "int32/int64" in slab_order_module.kernel_unsupported(indices.float(), 2)
    strided = torch.zeros(1, 2, 8, dtype=torch.int32)[..., ::2]
    assert "contiguous last dimension" in slab_order_module.kernel_unsupported(strided, 2)
    # On CPU slab_order is the torch form (the kernel needs CUDA, or Triton's interpreter in tests/gpu/).
    assert slab_order_module.slab_order(indices, 4, 6)[0].tolist() == [[[0, 3, 5, -1]]]
    # The kernel's wrapper refuses before it would import Triton.
    with pytest.raises(ValueError, match="does not take 256 slabs.*use slab_order_reference"):
        slab_order_module.slab_order_triton(indices, 1, 256)
    with pytest.raises(ValueError, match="out buffers must be contiguous int32"):
        slab_order_module.slab_order_triton(indices, 4, 6, out=(torch.empty(1, 1, 4, dtype=torch.int32),
                                                                 torch.empty(1, 1, 2, dtype=torch.int32)))


def test_row_dot_is_the_fp32_row_sum_in_pieces():
    gen = torch.Generator().manual_seed(0)
    out = torch.randn(2, 11, 3, 8, generator=gen).bfloat16()
    d_out = torch.randn(2, 11, 3, 8, generator=gen).bfloat16()
    delta = row_dot.row_dot_reference(out, d_out, rows_per_step=4)
    assert delta.dtype == torch.float32 and delta.shape == (2, 11, 3)
    torch.testing.assert_close(delta, (out.float() * d_out.float()).sum(-1), rtol=0, atol=0)
    assert torch.equal(row_dot.row_dot(out, d_out), row_dot.row_dot_reference(out, d_out))   # CPU: the torch form
    assert row_dot.kernel_unsupported(out, d_out) is None
    assert "one dtype" in row_dot.kernel_unsupported(out, d_out.float())
    assert "non-contiguous" in row_dot.kernel_unsupported(out.transpose(1, 2), d_out.transpose(1, 2))
    with pytest.raises(ValueError, match="does not take rank 1025.*use row_dot_reference"):
        row_dot.row_dot_triton(torch.zeros(1, 1, 1, 1025), torch.zeros(1, 1, 1, 1025))


def _forward_lse(q_lat, latent, indices, scale):
    rows = latent[torch.arange(latent.shape[0])[:, None, None], indices.long().clamp_min(0)]   # [B, T, W, R]
    scores = torch.einsum("bthr,btwr->bthw", q_lat, rows) * scale
    scores = scores.masked_fill((indices < 0)[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)


@pytest.mark.parametrize("slab_rows", [16, 37, 1000])
def test_slabbed_algorithm_matches_autograd_through_the_reference(slab_rows):
    gen = torch.Generator().manual_seed(slab_rows)
    batch, length, heads, rank, kv_len, width, scale = 2, 23, 3, 16, 101, 13, 0.3
    q_lat = torch.randn(batch, length, heads, rank, generator=gen, dtype=torch.float64, requires_grad=True)
    latent = torch.randn(batch, kv_len, rank, generator=gen, dtype=torch.float64, requires_grad=True)
    # Distinct rows per query (the model's rows are distinct), a third of the slots empty, one row all empty.
    indices = torch.rand(batch, length, kv_len, generator=gen).topk(width, -1).indices.int()
    indices = indices.masked_fill(torch.rand(indices.shape, generator=gen) < 0.3, -1)
    indices[0, 5] = -1
    out = reference.sparse_latent_attention(q_lat, latent, indices, scale)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    expected_dq, expected_dc = torch.autograd.grad(out, (q_lat, latent), d_out)
    lse = _forward_lse(q_lat.detach(), latent.detach(), indices, scale)
    d_q, d_c = slabbed_backward_reference(q_lat.detach(), latent.detach(), indices, out.detach(),
                                                         lse, d_out, scale, slab_rows)
    torch.testing.assert_close(d_q, expected_dq, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(d_c, expected_dc, rtol=1e-10, atol=1e-10)
    assert torch.equal(d_q[0, 5], torch.zeros_like(d_q[0, 5]))


def test_default_config_is_one_stage_and_the_builder_refuses_more():
    config = backward_slabs.default_slabbed_config(384)
    assert config.num_stages == 1
    two_stages = backward_slabs.BackwardConfig(num_stages=2, rank_parts=3)
    with pytest.raises(ValueError, match="one pipeline stage"):
        backward_slabs.build_slabbed_backward_prim_func(12, 384, 2051, "bfloat16", 0.1, two_stages)


def test_the_op_runs_in_slabs_from_the_threshold_on(monkeypatch):
    from genolc.model.ops.dsa.tilelang import backward

    calls = []
    monkeypatch.setattr(backward, "sparse_latent_attention_backward",
                        lambda *args: calls.append(("one block", args)) or "one block's gradients")
    monkeypatch.setattr(backward_slabs, "sparse_latent_attention_backward_slabs",
                        lambda *args: calls.append(("slabs", args)) or "the slabs' gradients")
    assert backward.TILELANG_KERNELS[1] is backward.chosen_backward
    results = []
    for rows in (backward.SLABBED_FROM_ROWS - 1, backward.SLABBED_FROM_ROWS):
        latent = torch.empty(1, rows, 16, device="meta")
        results.append(backward.chosen_backward("q", latent, "indices", "out", "lse", "d_out", 0.5))
    assert results == ["one block's gradients", "the slabs' gradients"]
    assert [(kind, args[1].shape[1]) for kind, args in calls] == [
        ("one block", backward.SLABBED_FROM_ROWS - 1), ("slabs", backward.SLABBED_FROM_ROWS)]
    for _, args in calls:
        assert args[0] == "q" and args[2:] == ("indices", "out", "lse", "d_out", 0.5)
