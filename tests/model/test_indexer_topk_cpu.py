"""The indexer's Triton top-k (genolc.model.ops.indexer.triton_topk) on CPU: its launch shape, input checks and
pure-torch reference (genolc.model.ops.indexer.reference.top_pools). The kernel itself runs against that reference
in tests/gpu/test_indexer_triton.py and, under Triton's interpreter, in tests/gpu/triton_interpreter_check.py."""

from __future__ import annotations

import pytest
import torch

from genolc.model.ops.indexer import reference, triton_topk


@pytest.mark.parametrize("keep", [1, 2, 7, 16, 48, 100, 512, 513, 2048])
def test_top_pools_launch_shape_keeps_its_floor_guarantee(keep):
    # The floor (the keep-th largest of G groups' two best scores) needs 2 G >= keep of them, and G at or above
    # keep makes it tight; the output block covers keep; the candidate slots hold every score of a row too short
    # to fill two per group; a segment is whole tiles of whole group rows (a pool's group is its id mod G in every
    # segment).
    shape = triton_topk.launch_shape(keep)
    assert shape.keep_block >= keep and shape.keep_block & (shape.keep_block - 1) == 0 and shape.keep_block < 2 * keep
    assert shape.groups >= keep and shape.groups & (shape.groups - 1) == 0
    assert shape.cap >= 2 * shape.groups and shape.cap >= triton_topk.CAP_PER_KEPT * keep
    assert shape.cap % triton_topk.BLOCK == 0 and shape.group_rows & (shape.group_rows - 1) == 0
    assert shape.segment % (shape.group_rows * shape.groups) == 0 and shape.segment % triton_topk.BLOCK == 0
    assert shape.segments(1) == 1 and shape.segments(shape.segment + 1) == 2


def test_top_pools_refuses_what_the_kernel_cannot_take():
    scores = torch.zeros(4, 64)
    out = torch.empty(4, 8, dtype=torch.int64)
    with pytest.raises(ValueError, match="scores must be float32"):
        triton_topk.top_pools(scores.double(), first_query=0, kpool=4, keep=8, out=out)
    with pytest.raises(ValueError, match="out must be"):
        triton_topk.top_pools(scores, first_query=0, kpool=4, keep=8, out=out.float())
    with pytest.raises(ValueError, match="do not fit a 4 x 64 block"):
        triton_topk.top_pools(scores, first_query=0, kpool=4, keep=8, out=out,
                              buffers=triton_topk.TopPoolsBuffers.allocate(2, 64, 8, torch.device("cpu")))
    with pytest.raises(ValueError, match="do not fit a 4 x 64 block"):
        triton_topk.top_pools(scores, first_query=0, kpool=4, keep=8, out=out,
                              buffers=triton_topk.TopPoolsBuffers.allocate(4, 16, 8, torch.device("cpu")))
    with pytest.raises(ValueError, match="must be on one device"):
        triton_topk.top_pools(scores, first_query=0, kpool=4, keep=8, out=out,
                              buffers=triton_topk.TopPoolsBuffers.allocate(4, 64, 8, torch.device("meta")))
    with pytest.raises(ValueError, match="keep must be positive"):
        triton_topk.launch_shape(0)
    with pytest.raises(ValueError, match=r"2 \* groups >= keep \(512\)"):
        triton_topk.launch_shape(512, groups=128)
    with pytest.raises(ValueError, match=r"groups \(384\) must be a power of two"):
        triton_topk.launch_shape(512, groups=384)


def test_top_pools_reference_keeps_the_best_causal_pools():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 50, generator=gen)
    kept = reference.top_pools(scores, first_query=30, kpool=4, keep=8)    # rows see 7, 8, 8, 8, 8, 9 pools
    for t in range(6):
        n = min((30 + t + 1) // 4, 50)
        count = min(n, 8)
        assert torch.equal(kept[t, count:], torch.full((8 - count,), -1))
        assert torch.equal(kept[t, :count], scores[t, :n].topk(count).indices.sort().values)
    wide = reference.top_pools(scores, first_query=200, kpool=1, keep=8)    # every row sees all 50 pools
    assert torch.equal(wide, scores.topk(8, dim=-1).indices.sort(-1).values)


def test_top_pools_reference_breaks_ties_by_pool_id_and_ranks_minus_zero_below_zero():
    scores = torch.tensor([[0.0, 1.0, 0.0, 0.0, 2.0, 0.0], [-0.0, 0.0, -0.0, 0.0, -1.0, -0.0]])
    kept = reference.top_pools(scores, first_query=100, kpool=1, keep=3)
    assert kept.tolist() == [[0, 1, 4], [0, 1, 3]]
