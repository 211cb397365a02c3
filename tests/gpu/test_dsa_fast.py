"""Fused Triton sparse attention (genolc.model.ops.dsa.fast) against the pure-torch reference. Needs CUDA."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.ops.dsa import fast, reference  # noqa: E402
from genolc.model.ops.indexer.reference import select_indices  # noqa: E402

pytestmark = pytest.mark.gpu


def random_index_rows(length: int, topk: int, kpool: int, seed: int) -> torch.Tensor:
    """Indexer-layout rows ``[1, T, topk + kpool - 1]`` from the reference indexer on random features."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    index_q = torch.randn(1, length, 2, 32, generator=gen, device="cuda")
    weights = torch.rand(1, length, 2, generator=gen, device="cuda")
    pooled = torch.randn(1, length // kpool, 32, generator=gen, device="cuda")
    return select_indices(index_q, weights, pooled, kpool=kpool, topk=topk, select_tail=True, softmax_scale=0.2,
                          query_chunk=4096)


def _qkv(batch, length, heads, dim, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, length, heads, dim, generator=gen, device="cuda").bfloat16()
    # k and v as strided views of one projection, as the layer produces them.
    kv = torch.randn(batch, length, heads, 2 * dim, generator=gen, device="cuda").bfloat16()
    k, v = kv.split(dim, dim=-1)
    return [t.detach().requires_grad_(True) for t in (q, k, v)]


def _fwd_bwd(op, q, k, v, indices, d_out, scale):
    out = op(q, k, v, indices, scale)
    return out, torch.autograd.grad((out.float() * d_out).sum(), (q, k, v))


@pytest.mark.parametrize("length, topk, heads, dim", [(4099, 256, 4, 128), (1001, 64, 3, 48)])
def test_matches_reference(length, topk, heads, dim, poison, rel_err):
    indices = random_index_rows(length, topk, 4, seed=length)
    indices[0, 17] = -1                          # a row with nothing selected returns zeros
    q, k, v = _qkv(1, length, heads, dim, seed=length + 1)
    d_out = torch.randn(1, length, heads, dim, device="cuda")
    scale = dim ** -0.5
    ref = _fwd_bwd(reference.sparse_attention, *(t.float() for t in (q, k, v)), indices, d_out, scale)
    poison()
    out, grads = _fwd_bwd(fast.sparse_attention, q, k, v, indices, d_out, scale)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref[0]) < 1e-2
    assert out[0, 17].float().abs().max() == 0
    for name, mine, theirs in zip("qkv", grads, ref[1]):
        assert rel_err(mine, theirs) < 1e-2, name


def test_long_sequence_full_width(poison, rel_err):
    """T = 128k - 1 with the presets' index width 2051 (topk 2048, kpool 4), int32 indices, batch 2."""
    length = 131071
    indices = torch.cat([random_index_rows(length, 2048, 4, seed=s) for s in (1, 2)]).to(torch.int32)
    q, k, v = _qkv(2, length, 2, 64, seed=3)
    d_out = torch.randn(2, length, 2, 64, device="cuda")
    # fp32 reference: its bf16 backward scatter-adds dk/dv in bf16 and drifts by ~3% at this length.
    ref = _fwd_bwd(reference.sparse_attention, *(t.float() for t in (q, k, v)), indices, d_out, 0.125)
    poison(16.0)
    out, grads = _fwd_bwd(fast.sparse_attention, q, k, v, indices, d_out, 0.125)
    assert rel_err(out, ref[0]) < 1e-2
    for name, mine, theirs in zip("qkv", grads, ref[1]):
        assert rel_err(mine, theirs) < 1e-2, name


def test_rejects_cpu_and_bad_indices():
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    with pytest.raises(ValueError, match="CUDA"):
        fast.sparse_attention(q, k, v, torch.zeros(1, 8, 4, dtype=torch.long), 0.25)
    with pytest.raises(ValueError, match="int32 or int64"):
        fast.sparse_attention(q.cuda(), k.cuda(), v.cuda(), torch.zeros(1, 8, 4, device="cuda"), 0.25)
