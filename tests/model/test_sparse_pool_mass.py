"""The DSA sparse attention's mass per selected pool (the indexer loss's target), pure-torch reference: the formula
from the attention's own log-sum-exp, pieces, empty rows and slots, and its arguments."""

from __future__ import annotations

import pytest
import torch

from genolc.model.ops import dispatch
from genolc.model.ops.dsa import reference
from genolc.model.ops.indexer.reference import select_indices


def inputs(batch: int, length: int, heads: int, rank: int, kpool: int, topk: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    q_lat = torch.randn(batch, length, heads, rank, generator=generator, dtype=torch.float64)
    latent = torch.randn(batch, length, rank, generator=generator, dtype=torch.float64)
    indices = select_indices(torch.randn(batch, length, 2, 8, generator=generator),
                             torch.rand(batch, length, 2, generator=generator),
                             torch.randn(batch, length // kpool, 8, generator=generator), kpool=kpool, topk=topk,
                             select_tail=True, softmax_scale=0.3)
    indices = indices.masked_fill(torch.rand(indices.shape, generator=generator) < 0.2, -1)
    indices[0, length // 2] = -1
    return q_lat, latent, indices


@pytest.mark.parametrize(("batch", "length", "heads", "rank", "kpool", "topk"),
                         [(2, 45, 3, 8, 4, 16), (1, 71, 5, 12, 16, 32), (2, 37, 1, 6, 1, 8)])
def test_mass_is_the_attention_probability_summed_over_heads_and_pool_slots(batch, length, heads, rank, kpool, topk):
    q_lat, latent, indices = inputs(batch, length, heads, rank, kpool, topk, seed=length)
    scale = 0.4
    _, lse = reference.sparse_latent_attention_forward(q_lat, latent, indices, scale)
    expected = torch.zeros(batch, length, topk // kpool, dtype=torch.float64)
    for b in range(batch):
        for t in range(length):
            for slot in range(topk):
                row = int(indices[b, t, slot])
                if row >= 0:
                    probs = (scale * q_lat[b, t] @ latent[b, row] - lse[b, t].double()).exp()
                    expected[b, t, slot // kpool] += probs.sum()
    for query_chunk in (None, 1, 7):
        got = reference.sparse_pool_mass(q_lat, latent, indices, scale, kpool=kpool, topk=topk,
                                         query_chunk=query_chunk)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert got[0, length // 2].abs().max() == 0
    # With the tail counted, each row's probabilities add up to the number of heads.
    tail_mass = sum((scale * torch.einsum("hr,r->h", q_lat[0, 1], latent[0, int(row)]) - lse[0, 1].double()).exp()
                    .sum() for row in indices[0, 1, topk:] if row >= 0)
    torch.testing.assert_close(float(got[0, 1].sum() + tail_mass), float(heads), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dispatch.sparse_pool_mass(q_lat, latent, indices, scale, kpool=kpool, topk=topk), got)


def test_bf16_inputs_give_fp32_mass_and_bad_arguments_raise():
    q_lat, latent, indices = inputs(1, 20, 2, 8, 4, 8, seed=3)
    got = reference.sparse_pool_mass(q_lat.bfloat16(), latent.bfloat16(), indices.int(), 0.3, kpool=4, topk=8)
    assert got.dtype == torch.float32 and got.shape == (1, 20, 2)
    with pytest.raises(ValueError, match="multiple of kpool"):
        reference.sparse_pool_mass(q_lat, latent, indices, 0.3, kpool=4, topk=6)
    with pytest.raises(ValueError, match="width"):
        reference.sparse_pool_mass(q_lat, latent, indices, 0.3, kpool=4, topk=64)
    with pytest.raises(ValueError, match="int32 or int64"):
        reference.sparse_pool_mass(q_lat, latent, indices.float(), 0.3, kpool=4, topk=8)


def test_the_triton_kernel_takes_only_what_it_can():
    """dispatch.sparse_pool_mass sends CUDA operands to the Triton kernel only when this says None; anything else
    goes to the reference (checked here on CPU tensors: the check reads shapes, dtypes and layouts only)."""
    from genolc.model.ops.dsa.triton import pool_mass_unsupported

    q_lat, latent = torch.randn(1, 9, 3, 32, dtype=torch.bfloat16), torch.randn(1, 9, 32, dtype=torch.bfloat16)
    rows = torch.zeros(1, 9, 11, dtype=torch.int32)
    assert pool_mass_unsupported(q_lat, latent, rows, 4) is None
    assert pool_mass_unsupported(q_lat, latent, rows, 64) is None          # one pool a 64-slot block
    assert "kpool 3" in pool_mass_unsupported(q_lat, latent, rows, 3)
    assert "kpool 128" in pool_mass_unsupported(q_lat, latent, rows, 128)
    assert "dtype" in pool_mass_unsupported(q_lat.double(), latent.double(), rows, 4)
    assert "contiguous" in pool_mass_unsupported(q_lat.transpose(1, 2).contiguous().transpose(1, 2), latent, rows, 4)


@pytest.mark.parametrize(("batch", "length", "heads", "rank", "kpool", "topk"),
                         [(2, 45, 3, 8, 4, 16), (1, 29, 2, 5, 1, 8)])
def test_the_forwards_log_sum_exp_stands_for_the_masss_own(batch, length, heads, rank, kpool, topk):
    """Given the attention forward's ``lse`` (fp32, +inf for an empty row) the mass is the one the reference forms
    its own normaliser for, within that lse's fp32 rounding; an empty row still gets none; a wrong lse is refused."""
    q_lat, latent, indices = inputs(batch, length, heads, rank, kpool, topk, seed=2 * length)
    _, lse = reference.sparse_latent_attention_forward(q_lat, latent, indices, 0.4)
    assert torch.isinf(lse[0, length // 2]).all()
    expected = reference.sparse_pool_mass(q_lat, latent, indices, 0.4, kpool=kpool, topk=topk)
    for query_chunk in (None, 5):
        got = reference.sparse_pool_mass(q_lat, latent, indices, 0.4, kpool=kpool, topk=topk,
                                         query_chunk=query_chunk, lse=lse)
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6)
        assert got[0, length // 2].abs().max() == 0
    torch.testing.assert_close(dispatch.sparse_pool_mass(q_lat, latent, indices, 0.4, kpool=kpool, topk=topk,
                                                         lse=lse), got)
    torch.testing.assert_close(dispatch.sparse_pool_mass(q_lat, latent, indices, 0.4, kpool=kpool, topk=topk,
                                                         lse=lse - 1.0), got * torch.e)
    # A normaliser other than the forward's is read, not checked: the mass scales with it.
    torch.testing.assert_close(reference.sparse_pool_mass(q_lat, latent, indices, 0.4, kpool=kpool, topk=topk,
                                                          lse=lse - 1.0), got * torch.e)
    for bad in (lse[:, 1:], lse[..., None], lse.long(), lse.bfloat16()):
        with pytest.raises(ValueError, match=r"lse must be the attention forward's \[B, T, H\]"):
            reference.sparse_pool_mass(q_lat, latent, indices, 0.4, kpool=kpool, topk=topk, lse=bad)
