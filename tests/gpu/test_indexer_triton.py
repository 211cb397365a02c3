"""Triton-scored, streamed indexer top-k (genolc.model.ops.indexer.triton) against the reference. Needs CUDA."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.ops.indexer import layout, reference, triton as indexer_triton  # noqa: E402
from genolc.model.ops.indexer.triton_topk import TopPoolsBuffers, launch_shape, top_pools  # noqa: E402
from top_pools_check import overflow_problems, score_blocks, score_tops_problems, top_pools_problems  # noqa: E402,E501

pytestmark = pytest.mark.gpu


def _features(batch, length, heads, dim, kpool, seed, dtype):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    index_q = torch.randn(batch, length, heads, dim, generator=gen, device="cuda").to(dtype)
    weights = torch.randn(batch, length, heads, generator=gen, device="cuda") * heads ** -0.5
    pooled = torch.randn(batch, length // kpool, dim, generator=gen, device="cuda").to(dtype)
    return index_q, weights, pooled


def _selected_scores(index_q, weights, pooled, rows, topk, kpool, scale):
    """Reference fp32 scores of each row's selected pools, sorted descending (-inf for empty slots)."""
    pools = layout.selected_pools(rows, topk, kpool)
    out = []
    for q0 in range(0, rows.shape[1], 4096):
        sl = slice(q0, q0 + 4096)
        chunk_pools = pools[:, sl]
        gathered = pooled[torch.arange(pooled.shape[0], device="cuda")[:, None, None], chunk_pools.clamp_min(0)]
        scores = reference.pool_scores(index_q[:, sl], weights[:, sl], gathered, scale)
        out.append(scores.masked_fill(chunk_pools < 0, float("-inf")).sort(-1, descending=True).values)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("batch, length, heads, dim, topk, kpool, tail, dtype", [
    (2, 3001, 4, 32, 256, 4, True, torch.float32),
    (1, 131071, 8, 64, 2048, 4, True, torch.bfloat16),
    (1, 5003, 8, 64, 64, 1, False, torch.bfloat16),
])
def test_same_selection_as_reference(batch, length, heads, dim, topk, kpool, tail, dtype):
    index_q, weights, pooled = _features(batch, length, heads, dim, kpool, seed=length, dtype=dtype)
    kwargs = dict(kpool=kpool, topk=topk, select_tail=tail, softmax_scale=dim ** -0.5)
    expected = reference.select_indices(index_q, weights, pooled, **kwargs)
    got = indexer_triton.select_indices(index_q, weights, pooled, **kwargs)
    assert got.shape == expected.shape and got.dtype == torch.int64
    # Same layout: the tail slots and the count of empty slots per row match exactly.
    assert torch.equal(got[..., topk:], expected[..., topk:])
    assert torch.equal((got < 0).sum(-1), (expected < 0).sum(-1))
    # Causal, and each slot holds kpool consecutive tokens of one pool.
    positions = torch.arange(length, device="cuda")[None, :, None]
    assert bool((got <= positions).all())
    slots = got[..., :topk].view(batch, length, topk // kpool, kpool)
    assert bool(((slots[..., 1:] - slots[..., :1] == torch.arange(1, kpool, device="cuda")) | (slots[..., 1:] < 0))
                .all())
    identical = (got[..., :topk].sort(-1).values == expected[..., :topk].sort(-1).values).all(-1)
    assert identical.float().mean() > 0.95
    # Where the sets differ, the chosen pools must score the same as the reference's (near-ties only).
    mine = _selected_scores(index_q.float(), weights, pooled.float(), got, topk, kpool, dim ** -0.5)
    theirs = _selected_scores(index_q.float(), weights, pooled.float(), expected, topk, kpool, dim ** -0.5)
    finite = torch.isfinite(theirs)
    assert torch.equal(finite, torch.isfinite(mine))
    assert torch.allclose(mine[finite], theirs[finite], rtol=1e-3, atol=1e-3)


def test_int32_output_and_small_query_chunk():
    index_q, weights, pooled = _features(1, 777, 2, 16, 4, seed=5, dtype=torch.bfloat16)
    kwargs = dict(kpool=4, topk=32, select_tail=True, softmax_scale=0.25)
    wide = indexer_triton.select_indices(index_q, weights, pooled, **kwargs)
    narrow = indexer_triton.select_indices(index_q, weights, pooled, query_chunk=64, out_dtype=torch.int32, **kwargs)
    assert narrow.dtype == torch.int32
    assert torch.equal(wide.sort(-1).values, narrow.long().sort(-1).values)


# The default launch, and the two the device has yet to time against it (benchmarks/run_selection_checks.sh).
@pytest.mark.parametrize("launch", [{}, {"prefetch": True}, {"block": 512}, {"block": 512, "prefetch": True}],
                         ids=["default", "prefetch", "block512", "block512_prefetch"])
@pytest.mark.parametrize("rows, cols, first_query, kpool, keep", [
    (64, 131072, 524287 - 63, 4, 512),     # `base`'s and `small`'s last queries at 512k: 128k pools, keep 512
    (48, 5000, 2020, 4, 512),              # rows below keep (505-511 pools) beside rows above it (512-517)
    (16, 40000, 39990, 1, 100),            # keep not a power of two, kpool 1
])
def test_top_pools_kernel(rows, cols, first_query, kpool, keep, launch):
    shape = launch_shape(keep, **launch)
    buffers = TopPoolsBuffers.allocate(rows, cols, keep, torch.device("cuda"), shape)
    for name, scores in score_blocks(rows, cols, keep, seed=cols, device="cuda").items():
        for dtype in (torch.int32, torch.int64):
            out = torch.full((rows, keep), 7, dtype=dtype, device="cuda")
            top_pools(scores, first_query=first_query, kpool=kpool, keep=keep, out=out, buffers=buffers,
                      shape=shape)
            problems = top_pools_problems(scores.cpu(), out.cpu(), first_query=first_query, kpool=kpool, keep=keep)
            problems += overflow_problems(name, scores, buffers, first_query=first_query, kpool=kpool, keep=keep)
            assert problems == [], (name, dtype, problems)


@pytest.mark.parametrize("rows, n_pools, first_query, keep, heads, dim",
                         [(2048, 40000, 159990, 512, 8, 64), (24, 300, 180, 48, 1, 16), (77, 3001, 11990, 64, 3, 24)])
def test_scoring_kernel_writes_the_top_ks_first_read(rows, n_pools, first_query, keep, heads, dim):
    """The presets' indexer (bf16, 8 heads x 64, 512 pools kept) over three segments of pools; rows that see fewer
    pools than keep; ReLU ties; a dim off the tiles."""
    problems = score_tops_problems(rows, n_pools, first_query, keep, heads, dim, dtype=torch.bfloat16,
                                   device="cuda")
    assert problems == [], problems[:5]


@pytest.mark.parametrize("tops_from_scoring", [False, True])
def test_fused_topk_selects_as_torch_topk(tops_from_scoring, monkeypatch):
    """Both ways of the first read: top_pools' own, and the scoring kernel's (indexer_triton.SCORE_GROUP_TOPS)."""
    monkeypatch.setattr(indexer_triton, "SCORE_GROUP_TOPS", tops_from_scoring)
    tops_given = []
    score_block = indexer_triton.pool_score_block

    def spy(*args, **kwargs):
        tops_given.append(kwargs.get("tops") is not None)
        return score_block(*args, **kwargs)

    monkeypatch.setattr(indexer_triton, "pool_score_block", spy)
    index_q, weights, pooled = _features(1, 20000, 8, 64, 4, seed=3, dtype=torch.bfloat16)
    kwargs = dict(kpool=4, topk=2048, select_tail=True, softmax_scale=64 ** -0.5, query_chunk=None,
                  out_dtype=torch.int64, query_offset=0)
    fused = indexer_triton.streamed_select(index_q, weights, pooled, **kwargs)
    # The flag took the path it names: the scoring kernel wrote the tops in every block, or in none.
    assert tops_given and set(tops_given) == {tops_from_scoring}
    unfused = indexer_triton.streamed_select(index_q, weights, pooled, fused_topk=False, **kwargs)
    # The same scores feed both (to rounding where the scoring kernel writes the tops: its tiles differ); only ties
    # at the cut may be broken differently (test_top_pools_kernel checks the kernel's choice exactly).
    assert ((fused.sort(-1).values == unfused.sort(-1).values).all(-1)).float().mean() > 0.99
    assert torch.equal((fused < 0).sum(-1), (unfused < 0).sum(-1))
