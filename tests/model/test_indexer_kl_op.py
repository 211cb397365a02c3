"""The sparse indexer KL's op on CPU: the dispatch sends CPU tensors to the reference, the reference's per-row form
against the loss it serves, and what the fused kernels refuse (pure torch, no Triton needed to ask). The kernels
themselves: tests/gpu/test_indexer_kl_triton.py, and under Triton's interpreter
tests/gpu/triton_interpreter_check.py (group ``indexer_kl``)."""

from __future__ import annotations

import pytest
import torch

from genolc.model.ops import dispatch
from genolc.model.ops.indexer_kl import reference, triton as indexer_kl_triton


KPOOL = 4


def index_rows_of(pools: torch.Tensor, kpool: int, tail: int = 3) -> torch.Tensor:
    """Index rows whose pool slots hold ``pools [B, C, K]`` (each pool's ``kpool`` tokens, -1 for an empty slot),
    then ``tail`` entries the op must not read as pools."""
    tokens = pools[..., None] * kpool + torch.arange(kpool)
    rows = tokens.masked_fill(pools[..., None] < 0, -1).flatten(-2)
    return torch.cat([rows, torch.full((*rows.shape[:2], tail), 7)], dim=-1)


def _operands(rows: int = 9, heads: int = 4, dim: int = 16, n_pools: int = 30, slots: int = 12):
    generator = torch.Generator().manual_seed(rows)
    pools = torch.rand(1, rows, n_pools, generator=generator).topk(slots, dim=-1).indices
    pools[0, 2, 5:] = -1
    pools[0, 4] = -1
    return (torch.rand(1, rows, slots, generator=generator), torch.randn(1, rows, heads, dim, generator=generator),
            torch.randn(1, rows, heads, generator=generator), torch.randn(1, n_pools, dim, generator=generator),
            index_rows_of(pools, KPOOL)), pools


SHAPE = {"kpool": KPOOL, "topk": 12 * KPOOL}


def test_cpu_tensors_take_the_reference(monkeypatch):
    operands, _ = _operands()
    assert not dispatch.fused_indexer_kl(*operands[1:4])
    calls = []
    monkeypatch.setattr(reference, "sparse_kl_rows", lambda *args, **kwargs: calls.append(args) or (None, None))
    dispatch.sparse_indexer_kl(*operands, 0.25, **SHAPE)
    assert len(calls) == 1


def test_each_rows_kl_is_the_formula_and_a_row_without_a_pool_has_none():
    """The reference's per-row KL against the module formula written out row by row in fp64
    (genolc/model/indexer_loss.py's notes): scores over the row's pools, the target normalised over them, the
    indexer's softmax over them; a row whose slots are all empty has KL 0 and no pool."""
    (pool_mass, index_q, head_weights, pooled, indices), pools = _operands()
    kl, has_pool = reference.sparse_kl_rows(pool_mass, index_q, head_weights, pooled, indices, 0.25, **SHAPE)
    assert kl.shape == has_pool.shape == (1, 9) and kl[0, 4] == 0 and not has_pool[0, 4] and has_pool.sum() == 8
    for row in range(9):
        chosen = pools[0, row][pools[0, row] >= 0]
        if not len(chosen):
            continue
        dots = torch.einsum("hd,pd->hp", index_q[0, row].double(), pooled[0, chosen].double())
        scores = (head_weights[0, row].double()[:, None] * torch.relu(0.25 * dots)).sum(0)
        target = pool_mass[0, row][pools[0, row] >= 0].double()
        target = target / target.sum()
        probs = scores.softmax(0)
        expected = (target * ((target + 1e-10).log() - (probs + 1e-10).log())).sum()
        assert float(kl[0, row]) == pytest.approx(float(expected), rel=1e-5, abs=1e-7)


def test_the_fused_kernels_refuse_what_they_do_not_take():
    (pool_mass, index_q, head_weights, pooled, indices), _ = _operands()
    assert indexer_kl_triton.unsupported_reason(index_q, head_weights, pooled) is None
    assert "float64" in indexer_kl_triton.unsupported_reason(index_q.double(), head_weights, pooled)
    assert "pooled" in indexer_kl_triton.unsupported_reason(index_q, head_weights, pooled.double())
    # GLM-5.3-Flash's own indexer (32 heads of 128) spilled on sm_90: the reference takes it.
    many = torch.randn(1, 9, 32, 128)
    assert "32 heads" in indexer_kl_triton.unsupported_reason(many, torch.randn(1, 9, 32), torch.randn(1, 30, 128))
    with pytest.raises(ValueError, match="head_weights must be"):
        reference.sparse_kl_rows(pool_mass, index_q, head_weights[..., :3], pooled, indices, 0.25, **SHAPE)
    with pytest.raises(ValueError, match="pool_mass must be"):
        reference.sparse_kl_rows(pool_mass[..., :5], index_q, head_weights, pooled, indices, 0.25, **SHAPE)
    with pytest.raises(ValueError, match="int32 or int64"):
        reference.sparse_kl_rows(pool_mass, index_q, head_weights, pooled, indices.float(), 0.25, **SHAPE)
    with pytest.raises(ValueError, match="indices must be"):
        reference.sparse_kl_rows(pool_mass, index_q, head_weights, pooled, indices[..., :40], 0.25, **SHAPE)


def test_the_kernels_products_follow_the_queries(monkeypatch):
    """TF32 for 16-bit queries (autocast's products are coarser still); for fp32 ones what torch's fp32 matmuls do;
    ``DOT_PRECISION`` forces one."""
    monkeypatch.setattr(indexer_kl_triton, "DOT_PRECISION", None)
    # Set and restored by hand: torch's cuBLAS flags are not plain attributes monkeypatch can undo.
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert indexer_kl_triton.dot_precision(torch.bfloat16) == "tf32"
        assert indexer_kl_triton.dot_precision(torch.float16) == "tf32"
        assert indexer_kl_triton.dot_precision(torch.float32) == "ieee"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert indexer_kl_triton.dot_precision(torch.float32) == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    monkeypatch.setattr(indexer_kl_triton, "DOT_PRECISION", "ieee")
    assert indexer_kl_triton.dot_precision(torch.bfloat16) == "ieee"
