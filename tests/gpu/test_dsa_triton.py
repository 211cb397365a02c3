"""Fused Triton latent sparse attention (genolc.model.ops.dsa.triton) against the pure-torch reference. Needs CUDA.

The reference runs in fp32 on fp32 copies of the bf16 inputs (its own bf16 backward scatter-adds the latent
gradient in bf16 and drifts by a few percent at long T).
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.ops import dispatch  # noqa: E402
from genolc.model.ops.dsa import reference, triton as dsa_triton  # noqa: E402
from genolc.model.ops.indexer.reference import select_indices  # noqa: E402

pytestmark = pytest.mark.gpu


def random_index_rows(length: int, topk: int, kpool: int, seed: int) -> torch.Tensor:
    """Indexer-layout rows ``[1, T, topk + kpool - 1]`` (int64) from the reference indexer on random features."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    index_q = torch.randn(1, length, 2, 32, generator=gen, device="cuda")
    weights = torch.rand(1, length, 2, generator=gen, device="cuda")
    pooled = torch.randn(1, length // kpool, 32, generator=gen, device="cuda")
    return select_indices(index_q, weights, pooled, kpool=kpool, topk=topk, select_tail=True, softmax_scale=0.2,
                          query_chunk=4096)


def _inputs(batch, length, heads, rank, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q_lat = torch.randn(batch, length, heads, rank, generator=gen, device="cuda").bfloat16()
    latent = torch.randn(batch, length, rank, generator=gen, device="cuda").bfloat16()
    d_out = torch.randn(batch, length, heads, rank, generator=gen, device="cuda")
    return [t.detach().requires_grad_(True) for t in (q_lat, latent)], d_out


def _fwd_bwd(op, q_lat, latent, indices, d_out, scale):
    out = op(q_lat, latent, indices, scale)
    return out, torch.autograd.grad((out.float() * d_out).sum(), (q_lat, latent))


def _check(leaves, indices, d_out, scale, poison, rel_err, poison_gib=4.0):
    ref_out, ref_grads = _fwd_bwd(reference.sparse_latent_attention, *(t.float() for t in leaves), indices, d_out,
                                  scale)
    poison(poison_gib)
    out, grads = _fwd_bwd(dsa_triton.sparse_latent_attention, *leaves, indices, d_out, scale)
    assert out.dtype == torch.bfloat16 and out.shape == ref_out.shape
    assert rel_err(out, ref_out) < 1e-2
    for name, mine, theirs in zip(("q_lat", "latent"), grads, ref_grads):
        assert mine.dtype == torch.bfloat16, name
        assert rel_err(mine, theirs) < 1e-2, name
    return out


@pytest.mark.parametrize("length, topk, heads, rank, index_dtype", [
    (4099, 256, 12, 384, torch.int32),   # base: H = 12 -> 16 rows, R = 384 -> 512
    (4099, 256, 8, 256, torch.int64),    # small
    (1001, 64, 3, 32, torch.int32),      # tiny rank, odd heads
    (1001, 64, 40, 48, torch.int64),     # two head blocks, R not a power of two
])
def test_matches_reference(length, topk, heads, rank, index_dtype, poison, rel_err):
    indices = random_index_rows(length, topk, 4, seed=length + heads).to(index_dtype)
    indices[0, 17] = -1                          # a row with nothing selected returns zeros
    indices[0, length // 2, ::3] = -1            # holes inside a row
    leaves, d_out = _inputs(1, length, heads, rank, seed=length + rank)
    out = _check(leaves, indices, d_out, 0.7 * rank ** -0.5, poison, rel_err)
    assert out[0, 17].float().abs().max() == 0


def test_forward_lse(poison, rel_err):
    """The contract the TileLang forward shares: o_lat in q's dtype, natural-log lse of the scaled scores, +inf
    for an empty row."""
    length, heads, rank, scale = 1001, 8, 256, 0.06
    indices = random_index_rows(length, 64, 4, seed=5).to(torch.int32)
    indices[0, 3] = -1
    (q_lat, latent), _ = _inputs(1, length, heads, rank, seed=6)
    poison()
    out, lse = dsa_triton.sparse_latent_attention_forward(*dsa_triton.prepare_inputs(q_lat.detach(), latent.detach(), indices),
                                                    scale)
    rows = indices.long()
    gathered = latent.float()[0][rows[0].clamp_min(0)]                               # [T, W, R]
    scores = torch.einsum("thr,twr->thw", q_lat.float()[0], gathered) * scale
    expected = scores.masked_fill((rows[0] < 0)[:, None, :], float("-inf")).logsumexp(-1)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and lse.shape == (1, length, heads)
    assert torch.isinf(lse[0, 3]).all() and (lse[0, 3] > 0).all()
    keep = torch.ones(length, dtype=torch.bool, device="cuda")
    keep[3] = False
    torch.testing.assert_close(lse[0, keep], expected[keep], atol=2e-2, rtol=1e-3)
    assert rel_err(out, reference.sparse_latent_attention(q_lat.float(), latent.float(), indices, scale)) < 1e-2


def test_long_sequence_full_width(poison, rel_err):
    """T = 128k - 1 with the presets' index width 2051 (topk 2048, kpool 4), int32 indices, batch 2."""
    length = 131071
    indices = torch.cat([random_index_rows(length, 2048, 4, seed=s) for s in (1, 2)]).to(torch.int32)
    leaves, d_out = _inputs(2, length, 4, 64, seed=3)
    _check(leaves, indices, d_out, 0.125, poison, rel_err, poison_gib=16.0)


def test_rejects_cpu_and_bad_inputs():
    q_lat, latent = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 16)
    rows = torch.zeros(1, 8, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="CUDA"):
        dsa_triton.sparse_latent_attention(q_lat, latent, rows, 0.25)
    q_lat, latent, rows = q_lat.cuda(), latent.cuda(), rows.cuda()
    with pytest.raises(ValueError, match="int32 or int64"):
        dsa_triton.sparse_latent_attention(q_lat, latent, rows.float(), 0.25)
    with pytest.raises(ValueError, match="disagree"):
        dsa_triton.sparse_latent_attention(q_lat, latent[..., :8], rows, 0.25)
    with pytest.raises(ValueError, match="share one dtype"):
        dsa_triton.sparse_latent_attention(q_lat.to(torch.float64), latent.to(torch.float64), rows, 0.25)


@pytest.mark.parametrize("length, heads, rank, kpool", [
    (4099, 12, 384, 4),    # base
    (4099, 8, 256, 4),     # small
    (1001, 40, 48, 16),    # two head blocks, kpool 16
])
def test_pool_mass_matches_reference(length, heads, rank, kpool, poison, rel_err):
    """The indexer loss's target in bf16 against the reference on fp32 copies: rows with holes, an empty row (no
    mass anywhere), the tail slots in the softmax but in no pool."""
    topk = 256
    indices = random_index_rows(length, topk, kpool, seed=length + kpool).to(torch.int32)
    indices[0, 17] = -1
    indices[0, length // 2, ::3] = -1
    (q_lat, latent), _ = _inputs(1, length, heads, rank, seed=length + heads)
    q_lat, latent, scale = q_lat.detach(), latent.detach(), 0.7 * rank ** -0.5
    expected = reference.sparse_pool_mass(q_lat.float(), latent.float(), indices, scale, kpool=kpool, topk=topk)
    poison()
    got = dsa_triton.sparse_pool_mass(q_lat, latent, indices, scale, kpool=kpool, topk=topk)
    assert got.dtype == torch.float32 and got.shape == (1, length, topk // kpool)
    assert got[0, 17].abs().max() == 0
    assert rel_err(got, expected) < 1e-2
    # Mass is at most the number of heads, all of it when no tail slot is valid.
    assert float(got.sum(-1).max()) <= heads * (1 + 1e-3)
    # Given the attention forward's lse (the kernels the layer runs), one pass gives the same mass.
    _, lse = dispatch.sparse_latent_attention_forward(q_lat, latent, indices, scale)
    given = dsa_triton.sparse_pool_mass(q_lat, latent, indices, scale, kpool=kpool, topk=topk, lse=lse)
    assert given[0, 17].abs().max() == 0
    assert rel_err(given, got) < 1e-3 and rel_err(given, expected) < 1e-2
    shifted = dsa_triton.sparse_pool_mass(q_lat, latent, indices, scale, kpool=kpool, topk=topk, lse=lse - 1.0)
    assert rel_err(shifted, given * torch.e) < 1e-5                     # the lse is read, not formed again
