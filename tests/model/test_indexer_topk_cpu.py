"""The indexer's Triton top-k (genolc.model.ops.indexer.triton_topk) on CPU: its launch shape and input checks. The
kernel itself runs in tests/gpu/test_indexer_triton.py and, under Triton's interpreter, in
tests/gpu/triton_interpreter_check.py."""

from __future__ import annotations

import pytest
import torch

from genolc.model.ops.indexer import triton_topk


@pytest.mark.parametrize("keep", [1, 2, 7, 16, 48, 100, 512, 513, 2048])
def test_top_pools_launch_shape_keeps_its_floor_guarantee(keep):
    # The floor (lowest of G groups' second-best scores) has >= 2 G >= keep scores at or above it; the output
    # block covers keep; the candidate slots hold every score of a row too short to fill two per group.
    keep_block, groups, cap = triton_topk.launch_shape(keep)
    assert keep_block >= keep and keep_block & (keep_block - 1) == 0 and keep_block < 2 * keep
    assert 2 * groups >= keep and groups & (groups - 1) == 0
    assert cap >= 2 * groups and cap >= triton_topk.CAP_PER_KEPT * keep and cap % triton_topk.BLOCK == 0


def test_top_pools_refuses_what_the_kernel_cannot_take():
    scores = torch.zeros(4, 64)
    out = torch.empty(4, 8, dtype=torch.int64)
    with pytest.raises(ValueError, match="scores must be float32"):
        triton_topk.top_pools(scores.double(), first_query=0, kpool=4, keep=8, out=out)
    with pytest.raises(ValueError, match="out must be"):
        triton_topk.top_pools(scores, first_query=0, kpool=4, keep=8, out=out.float())
    with pytest.raises(ValueError, match="candidates must be"):
        triton_topk.top_pools(scores, first_query=0, kpool=4, keep=8, out=out,
                              candidates=triton_topk.candidate_buffers(2, 8, torch.device("cpu")))
    with pytest.raises(ValueError, match="keep must be positive"):
        triton_topk.launch_shape(0)
