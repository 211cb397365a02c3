"""The sparse indexer KL's fused pair (genolc/model/ops/indexer_kl/triton.py) on CUDA: against fp64 autograd of the
reference at the presets' shapes, and inside genolc.model.indexer_loss.indexer_kl_loss against the reference path
it replaced. Needs CUDA; the same kernels run on CPU under Triton's interpreter in
tests/gpu/triton_interpreter_check.py (group ``indexer_kl``)."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.indexer_loss import indexer_kl_loss  # noqa: E402
from genolc.model.ops import dispatch  # noqa: E402
from genolc.model.ops.indexer.layout import index_rows  # noqa: E402
from genolc.model.ops.indexer_kl import reference, triton as indexer_kl_triton  # noqa: E402

pytestmark = pytest.mark.gpu


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _distinct_pools(rows: int, slots: int, n_pools: int, generator: torch.Generator) -> torch.Tensor:
    """``[1, rows, slots]`` int32: distinct pools a row (as the selection gives), the last quarter of slots empty in
    every fifth row."""
    pools = torch.rand(rows, n_pools, device="cuda", generator=generator).topk(slots, dim=-1).indices.int()
    pools[::5, -slots // 4:] = -1
    return pools[None]


def _rows_of(pools: torch.Tensor, kpool: int) -> torch.Tensor:
    """Index rows holding ``pools`` (each pool's tokens; -1 for an empty slot) and a tail of ``kpool - 1`` tokens."""
    tokens = (pools[..., None] * kpool + torch.arange(kpool, device="cuda", dtype=pools.dtype)).masked_fill(
        pools[..., None] < 0, -1).flatten(-2)
    return torch.cat([tokens, torch.zeros(*tokens.shape[:2], kpool - 1, device="cuda", dtype=pools.dtype)], dim=-1)


def _poison_allocator(gib: float = 2.0) -> None:
    """NaN in the blocks the caching allocator hands out next: a kernel that reads a buffer before writing it shows."""
    torch.full((int(gib * 2**28),), float("nan"), device="cuda")
    torch.cuda.synchronize()


# Norm-relative limits against fp64: (KL, index_q, head_weights, pooled). IEEE products: the KL to fp32 summation
# order, the bf16 queries' gradient rounded once (2^-9 relative on average), the fp32 ones in another summation
# order. TF32 products round the fp32 keys and score gradients to 10 mantissa bits (2^-11 relative each): 7e-4 on
# the loss and 1e-3 on the gradients' norms in the bench (benchmarks/results/indexer_kl_lse_2026-12-05/).
LIMITS = {"ieee": (1e-5, 4e-3, 1e-4, 1e-4), "tf32": (3e-3, 1e-2, 5e-3, 5e-3)}


@pytest.mark.parametrize("precision", ["tf32", "ieee"])
@pytest.mark.parametrize("rows, n_pools, heads, dim", [(999, 16384, 8, 64), (77, 700, 3, 40)])
def test_fused_indexer_kl_matches_fp64_autograd(rows, n_pools, heads, dim, precision, monkeypatch):
    """bf16 queries, fp32 head weights and pool keys (what the indexer hands the loss under autocast), 512 slots a
    row; a shape off the tiles too; the kernels' TF32 products (the default for such queries) and IEEE ones. The KL,
    which rows have a pool, and the three gradients."""
    monkeypatch.setattr(indexer_kl_triton, "DOT_PRECISION", precision)
    kl_limit, *grad_limits = LIMITS[precision]
    generator = torch.Generator(device="cuda").manual_seed(rows)
    index_q = torch.randn(1, rows, heads, dim, device="cuda", generator=generator).bfloat16().requires_grad_()
    head_weights = torch.randn(1, rows, heads, device="cuda", generator=generator).requires_grad_()
    pooled = torch.randn(1, n_pools, dim, device="cuda", generator=generator).requires_grad_()
    pools = _distinct_pools(rows, 512, n_pools, generator)
    pools[0, 3] = -1                                                   # a row without a pool
    pool_mass = torch.rand(1, rows, 512, device="cuda", generator=generator)
    upstream = torch.randn(1, rows, device="cuda", generator=generator)
    leaves = [index_q, head_weights, pooled]
    _poison_allocator()
    indices, shape = _rows_of(pools, 4), {"kpool": 4, "topk": 2048}
    kl, has_pool = indexer_kl_triton.sparse_kl_rows(pool_mass, *leaves, indices, dim ** -0.5, **shape)
    grads = torch.autograd.grad((kl * upstream).sum(), leaves)
    exact_leaves = [t.detach().double().requires_grad_() for t in leaves]
    q64, w64, pooled64 = exact_leaves
    chosen = pooled64[0, pools[0].long().clamp_min(0)][None]
    scores = (w64[..., None] * torch.relu(dim ** -0.5 * torch.einsum("bchd,bcpd->bchp", q64, chosen))).sum(2)
    exact_kl, exact_has = reference.kl_rows(pool_mass.double(), scores, pools >= 0)
    exact = torch.autograd.grad((exact_kl * upstream.double()).sum(), exact_leaves)
    assert torch.isfinite(kl).all() and torch.equal(has_pool, exact_has) and not has_pool[0, 3]
    assert _relative(kl, exact_kl) < kl_limit
    for name, got, truth, tolerance in zip(("index_q", "head_weights", "pooled"), grads, exact, grad_limits):
        assert got.dtype == {"index_q": torch.bfloat16}.get(name, torch.float32), name
        assert _relative(got, truth) < tolerance, name


def test_indexer_kl_loss_runs_the_fused_op_and_matches_the_reference_path(monkeypatch):
    """The sparse loss of the last 3,000 queries of a 16k window (the window's row count as its denominator, the
    chunks left to indexer_kl_loss as the DSA layer leaves them), fp32 throughout (the kernels' products too): the
    fused op, in one call without a checkpoint, against the reference path (checkpointed chunks)."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    keys, queries, heads, rank, kpool, topk = 16384, 3000, 8, 64, 4, 2048
    offset = keys - queries
    visible = torch.arange(offset, keys, device="cuda").add(1).div(kpool, rounding_mode="floor")
    scores = torch.rand(queries, keys // kpool, device="cuda", generator=generator)
    scores.masked_fill_(torch.arange(keys // kpool, device="cuda")[None, :] >= visible[:, None], -1.0)
    top, pools = scores.topk(topk // kpool, dim=-1)
    pools = pools.masked_fill(top < 0, -1).int()[None]
    indices = index_rows(pools, query_offset=offset, kpool=kpool, select_tail=True, dtype=torch.int32)
    tensors = {"main_q": torch.randn(1, queries, heads, rank, device="cuda", generator=generator),
               "main_k": torch.randn(1, keys, 1, rank, device="cuda", generator=generator)}
    leaves = {"index_q": torch.randn(1, queries, 8, 64, device="cuda", generator=generator),
              "head_weights": torch.randn(1, queries, 8, device="cuda", generator=generator),
              "pooled": torch.randn(1, keys // kpool, 64, device="cuda", generator=generator)}

    def loss_and_grads():
        inputs = {name: t.detach().requires_grad_() for name, t in leaves.items()}
        loss = indexer_kl_loss("sparse", **tensors, **inputs, softmax_scale=rank ** -0.5, index_softmax_scale=0.125,
                               kpool=kpool, topk=topk, indices=indices, query_offset=offset,
                               row_count=keys - kpool + 1)
        return loss, torch.autograd.grad(loss, list(inputs.values()))

    # The reference's products in full fp32, and so the kernels' (fp32 queries follow torch's matmuls).
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    assert indexer_kl_triton.dot_precision(torch.float32) == "ieee"
    checkpoints, calls = [], []
    monkeypatch.setattr("genolc.model.indexer_loss.checkpoint",
                        lambda *args, **kwargs: checkpoints.append(1) or torch.utils.checkpoint.checkpoint(
                            *args, **kwargs))
    fused_op = indexer_kl_triton.sparse_kl_rows
    monkeypatch.setattr(indexer_kl_triton, "sparse_kl_rows",
                        lambda *args, **kwargs: calls.append(args[1].shape[1]) or fused_op(*args, **kwargs))
    assert dispatch.fused_indexer_kl(*leaves.values())
    fused_loss, fused_grads = loss_and_grads()
    assert not checkpoints and calls == [queries]
    monkeypatch.setattr(dispatch, "fused_indexer_kl", lambda *operands: False)
    reference_loss, reference_grads = loss_and_grads()
    assert checkpoints and calls == [queries]                          # the reference path, chunk by chunk
    assert float(fused_loss) == pytest.approx(float(reference_loss), rel=1e-5)
    for got, truth in zip(fused_grads, reference_grads):
        assert _relative(got, truth) < 1e-4
