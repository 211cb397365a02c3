"""The pure-torch references compute in fp32 even inside a bf16 autocast region (the model's training setting)."""

from __future__ import annotations

import torch

from genolc.model.ops.indexer.reference import pool_scores
from genolc.model.ops.kda.reference import chunk_kda


def _kda_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    shape = (1, 77, 2, 16)
    q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    g = -torch.rand(shape, generator=gen)
    beta = torch.rand(1, 77, 2, generator=gen)
    return q, k, v, g, beta


def test_kda_reference_ignores_autocast():
    inputs = _kda_inputs(0)
    plain, plain_state = chunk_kda(*inputs, output_final_state=True, chunk_size=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        boxed, boxed_state = chunk_kda(*inputs, output_final_state=True, chunk_size=16)
    assert boxed.dtype == torch.float32
    torch.testing.assert_close(boxed, plain, rtol=0, atol=0)
    torch.testing.assert_close(boxed_state, plain_state, rtol=0, atol=0)


def test_indexer_scores_ignore_autocast():
    gen = torch.Generator().manual_seed(1)
    index_q = torch.randn(1, 40, 3, 32, generator=gen)
    weights = torch.rand(1, 40, 3, generator=gen)
    pooled = torch.randn(1, 10, 32, generator=gen)
    plain = pool_scores(index_q, weights, pooled, 0.2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        boxed = pool_scores(index_q, weights, pooled, 0.2)
    assert boxed.dtype == torch.float32
    torch.testing.assert_close(boxed, plain, rtol=0, atol=0)
    # Without the guard the einsums would run in bf16 and differ: the test can fail.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rounded = torch.einsum("bqhd,bpd->bqhp", index_q, pooled)
    assert rounded.dtype == torch.bfloat16
