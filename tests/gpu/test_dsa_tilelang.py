"""TileLang sparse attention (genolc.model.ops.dsa.tilelang_{fwd,bwd}) against the pure-torch reference.

Needs CUDA and TileLang (the H200 pack). Outputs and gradients in bf16 against the fp32 reference, odd lengths,
-1 slots and an empty row, NaN-poisoned memory; the benchmark (benchmarks/bench_dsa_tilelang.py) times the pair.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("tilelang")

from genolc.model.ops.dsa import reference
from genolc.model.ops.dsa.tilelang import backward as tilelang_backward
from genolc.model.ops.dsa.tilelang import forward as tilelang_forward  # noqa: E402
from test_dsa_triton import _fwd_bwd, _inputs, random_index_rows  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("length, topk, heads, rank", [(4099, 256, 12, 384), (1001, 64, 8, 256), (777, 32, 3, 64)])
def test_matches_reference(length, topk, heads, rank, poison, rel_err):
    indices = random_index_rows(length, topk, 4, seed=length + heads).to(torch.int32)
    indices[0, 17] = -1                          # a row with nothing selected: zeros, lse = +inf, no gradient
    indices[0, length // 2, ::3] = -1
    leaves, d_out = _inputs(1, length, heads, rank, seed=length + rank)
    scale = 0.7 * rank ** -0.5
    ref_out, ref_grads = _fwd_bwd(reference.sparse_latent_attention, *(t.float() for t in leaves), indices, d_out,
                                  scale)
    poison()
    out, grads = _fwd_bwd(tilelang_backward.sparse_latent_attention, *leaves, indices, d_out, scale)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref_out) < 1e-2
    assert out[0, 17].float().abs().max() == 0
    for name, mine, theirs in zip(("q_lat", "latent"), grads, ref_grads):
        assert rel_err(mine, theirs) < 1e-2, name
    assert grads[0][0, 17].float().abs().max() == 0

    _, lse = tilelang_forward.sparse_latent_attention_forward(*(t.detach() for t in leaves), indices, scale)
    assert lse[0, 17].isinf().all() and (lse[0, 17] > 0).all()


@pytest.mark.parametrize("batch, length, topk, heads, rank, slab_rows", [
    (1, 4099, 256, 12, 384, 1000),     # slabs that do not divide the keys, most (query, slab) pairs non-empty
    (2, 1001, 64, 8, 256, 64),         # two windows, many slabs, many pairs with no slot
    (1, 777, 32, 3, 64, 100000),       # one slab: the same work as the one-block-per-query kernel
])
def test_slab_ordered_backward_matches_reference(batch, length, topk, heads, rank, slab_rows, poison, rel_err):
    from genolc.model.ops.dsa.tilelang import backward_slabs

    indices = torch.cat([random_index_rows(length, topk, 4, seed=length + heads + 1 + b) for b in range(batch)])
    indices = indices.to(torch.int32).contiguous()
    indices[0, 17] = -1
    indices[-1, length // 2, ::3] = -1
    leaves, d_out = _inputs(batch, length, heads, rank, seed=length + rank + 1)
    scale = 0.7 * rank ** -0.5
    _, ref_grads = _fwd_bwd(reference.sparse_latent_attention, *(t.float() for t in leaves), indices, d_out, scale)
    q_lat, latent = (t.detach() for t in leaves)
    out, lse = tilelang_forward.sparse_latent_attention_forward(q_lat, latent, indices, scale)
    poison()
    grads = backward_slabs.sparse_latent_attention_backward_slabs(q_lat, latent, indices, out, lse,
                                                                  d_out.bfloat16(), scale, slab_rows=slab_rows)
    for name, mine, theirs in zip(("q_lat", "latent"), grads, ref_grads):
        assert mine.dtype == torch.bfloat16, name
        assert rel_err(mine, theirs) < 1e-2, name
    assert grads[0][0, 17].float().abs().max() == 0
    one_block = tilelang_backward.sparse_latent_attention_backward(q_lat, latent, indices, out, lse,
                                                                   d_out.bfloat16(), scale)
    assert rel_err(grads[0], one_block[0]) < 1e-2 and rel_err(grads[1], one_block[1]) < 1e-2


def test_op_over_a_long_key_range_runs_in_slabs_and_matches_reference(poison, rel_err, monkeypatch):
    """Queries at the end of a window past SLABBED_FROM_ROWS (a chunk's view): the autograd op's backward runs the
    slab-ordered kernel there, and its gradients match the reference."""
    from genolc.model.ops.dsa.tilelang import backward_slabs

    queries, keys, width, heads, rank = 300, tilelang_backward.SLABBED_FROM_ROWS + 777, 259, 12, 384
    gen = torch.Generator(device="cuda").manual_seed(3)
    q_lat = torch.randn(1, queries, heads, rank, generator=gen, device="cuda").bfloat16().requires_grad_(True)
    latent = torch.randn(1, keys, rank, generator=gen, device="cuda").bfloat16().requires_grad_(True)
    d_out = torch.randn(1, queries, heads, rank, generator=gen, device="cuda")
    indices = torch.rand(queries, keys, generator=gen, device="cuda").topk(width, -1).indices.int()[None]
    indices[0, 5] = -1
    indices[0, 100, ::4] = -1
    indices = indices.contiguous()
    scale = 0.7 * rank ** -0.5
    _, ref_grads = _fwd_bwd(reference.sparse_latent_attention, q_lat.float(), latent.float(), indices, d_out, scale)
    ran = []
    slabbed = backward_slabs.sparse_latent_attention_backward_slabs
    monkeypatch.setattr(backward_slabs, "sparse_latent_attention_backward_slabs",
                        lambda *args: ran.append("slabs") or slabbed(*args))
    poison()
    _, grads = _fwd_bwd(tilelang_backward.sparse_latent_attention, q_lat, latent, indices, d_out, scale)
    assert ran == ["slabs"]
    for name, mine, theirs in zip(("q_lat", "latent"), grads, ref_grads):
        assert rel_err(mine, theirs) < 1e-2, name
    assert grads[0][0, 5].float().abs().max() == 0
