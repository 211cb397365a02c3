"""The DSA indexer KL loss: Megatron-core parity at kpool = 1, a naive full-matrix check at kpool > 1, chunking."""

from __future__ import annotations

import types

import pytest
import torch

import genolc.model.indexer_loss as indexer_loss_module
from genolc.model.indexer_loss import indexer_kl_loss
from genolc.model.ops.dsa.reference import sparse_latent_attention_forward
from genolc.model.ops.indexer.pooling import pool_keys
from genolc.model.ops.indexer.reference import pool_scores, select_indices

INDEX_SCALE = 0.25
MAIN_SCALE = 0.35


def random_inputs(batch: int, seq_len: int, kpool: int, heads: int = 3, index_heads: int = 2, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    main_q = torch.randn(batch, seq_len, heads, 8, generator=generator)
    main_k = torch.randn(batch, seq_len, heads, 8, generator=generator)
    index_q = torch.randn(batch, seq_len, index_heads, 6, generator=generator, requires_grad=True)
    head_weights = torch.randn(batch, seq_len, index_heads, generator=generator, requires_grad=True)
    keys = torch.randn(batch, seq_len, 6, generator=generator)
    gates = torch.randn(batch, seq_len, 6, generator=generator)
    bias = torch.randn(kpool, 6, generator=generator)
    pooled = pool_keys(keys, gates, bias, kpool).detach().requires_grad_(True)
    return main_q, main_k, index_q, head_weights, pooled


def run_loss(mode, inputs, kpool, topk, indices=None, query_chunk=None, target_piece=None):
    main_q, main_k, index_q, head_weights, pooled = inputs
    return indexer_kl_loss(mode, main_q=main_q, main_k=main_k, softmax_scale=MAIN_SCALE, index_q=index_q,
                           head_weights=head_weights, pooled=pooled, index_softmax_scale=INDEX_SCALE, kpool=kpool,
                           topk=topk, indices=indices, query_chunk=query_chunk, target_piece=target_piece)


def selection(inputs, kpool, topk):
    _, _, index_q, head_weights, pooled = inputs
    return select_indices(index_q.detach(), head_weights.detach(), pooled.detach(), kpool=kpool, topk=topk,
                          select_tail=True, softmax_scale=INDEX_SCALE)


@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize(("batch", "seq_len", "topk", "seed"), [(2, 13, 4, 0), (1, 37, 8, 1), (2, 50, 16, 2),
                                                                 (1, 9, 16, 3)])
def test_equals_megatron_at_single_token_pools(mode: str, batch: int, seq_len: int, topk: int, seed: int) -> None:
    dsa = pytest.importorskip("megatron.core.transformer.experimental_attention_variant.dsa")
    inputs = random_inputs(batch, seq_len, kpool=1, seed=seed)
    main_q, main_k, index_q, head_weights, pooled = inputs
    indices = selection(inputs, 1, topk)

    with torch.no_grad():
        scores = pool_scores(index_q, head_weights, pooled, INDEX_SCALE)  # [B, T, T]: every token is a pool
    causal = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
    # Megatron takes [T, B, H, D] and a full-width top-k; empty slots point at a future key, masked causally.
    megatron_topk = indices[..., : min(topk, seq_len)].masked_fill(indices[..., : min(topk, seq_len)] < 0,
                                                                   seq_len - 1)
    single_rank = types.SimpleNamespace(tp=types.SimpleNamespace(size=lambda: 1))
    expected = dsa.compute_dsa_indexer_loss(
        (scores + causal).clone(), megatron_topk, main_q.transpose(0, 1), main_k.transpose(0, 1), MAIN_SCALE,
        loss_coeff=1.0, sparse_loss=mode == "sparse", pg_collection=single_rank)
    got = run_loss(mode, inputs, kpool=1, topk=topk, indices=indices, query_chunk=5)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def naive_loss(mode, inputs, kpool, topk, indices):
    """The module docstring's formula, written out with full [B, H, T, T] matrices and Python loops."""
    main_q, main_k, index_q, head_weights, pooled = inputs
    batch, seq_len = main_q.shape[:2]
    logits = torch.einsum("bqhd,bkhd->bhqk", main_q, main_k) * MAIN_SCALE
    scores = pool_scores(index_q, head_weights, pooled, INDEX_SCALE)
    total, rows = 0.0, 0
    for b in range(batch):
        for t in range(seq_len):
            if mode == "dense":
                keys = list(range(t + 1))
                pools = list(range((t + 1) // kpool))
            else:
                keys = [i for i in indices[b, t].tolist() if i >= 0]
                pools = sorted({i // kpool for i in indices[b, t, :topk].tolist() if i >= 0})
            if not pools:
                continue
            attention = logits[b, :, t, keys].softmax(dim=-1)  # [H, |keys|]
            per_key = attention.sum(dim=0)
            key_pools = torch.tensor(keys) // kpool
            mass = torch.stack([per_key[key_pools == p].sum() for p in pools])
            target = mass / mass.sum()
            index_probs = scores[b, t, pools].softmax(dim=-1)
            total = total + (target * (torch.log(target + 1e-10) - torch.log(index_probs + 1e-10))).sum()
            rows += 1
    return total / rows


@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize("kpool", [4, 16])
def test_matches_the_documented_formula_with_pools(mode: str, kpool: int) -> None:
    seq_len, topk = (45 if kpool == 4 else 71), 2 * kpool
    inputs = random_inputs(2, seq_len, kpool, seed=kpool)
    indices = selection(inputs, kpool, topk)
    expected = naive_loss(mode, inputs, kpool, topk, indices)
    expected_grads = torch.autograd.grad(expected, inputs[2:])
    for query_chunk, target_piece in ((7, None), (None, None), (9, 2), (None, 5), (1, 1)):
        got = run_loss(mode, inputs, kpool, topk, indices, query_chunk=query_chunk, target_piece=target_piece)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
        got_grads = torch.autograd.grad(got, inputs[2:])
        for g, e in zip(got_grads, expected_grads):
            torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_the_sparse_target_is_computed_once_and_the_dense_one_again_in_backward(mode: str,
                                                                                monkeypatch: pytest.MonkeyPatch):
    """The target has no gradient. The sparse one (linear in T) is computed once per chunk outside the checkpoint
    and kept, so the backward recomputes only the indexer's side; the dense one (quadratic in T over a window) is
    computed inside the checkpoint and again in the backward, never kept."""
    inputs = random_inputs(1, 40, kpool=4, seed=11)
    indices = selection(inputs, 4, 8)
    name = "_dense_pool_mass" if mode == "dense" else "_sparse_pool_mass"
    original, calls = getattr(indexer_loss_module, name), []

    def counted(*args):
        calls.append(torch.is_grad_enabled())
        return original(*args)

    monkeypatch.setattr(indexer_loss_module, name, counted)
    loss = run_loss(mode, inputs, 4, 8, indices, query_chunk=15)
    assert calls == [False, False, False]
    loss.backward()
    assert calls == [False] * (6 if mode == "dense" else 3)
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in inputs[2:])


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_what_the_forward_keeps_for_backward_is_linear_in_length(mode: str) -> None:
    """Tensors created by the loss's forward and alive when it returns (what the backward will read): linear in T in
    both modes. Kept dense targets would add up to T^2 / (2 kpool) floats over the chunks."""
    from tensor_memory import PeakTensorBytes

    kept = []
    for seq_len in (256, 512):
        inputs = random_inputs(1, seq_len, kpool=4, seed=12)
        indices = selection(inputs, 4, 16)
        with PeakTensorBytes() as tracker:
            loss = run_loss(mode, inputs, 4, 16, indices, query_chunk=8, target_piece=4)
        kept.append(tracker.current)
        loss.backward()
    assert 0 < kept[1] <= 2.2 * kept[0], kept


def test_sparse_equals_dense_when_everything_is_selected() -> None:
    inputs = random_inputs(2, 35, kpool=4, seed=7)
    indices = selection(inputs, 4, topk=64)
    dense = run_loss("dense", inputs, 4, 64)
    sparse = run_loss("sparse", inputs, 4, 64, indices)
    torch.testing.assert_close(sparse, dense, atol=1e-6, rtol=1e-6)


def test_gradient_reaches_only_the_indexer_and_zero_for_perfect_indexer() -> None:
    inputs = random_inputs(1, 30, kpool=4, seed=8)
    main_q, main_k = (t.detach().requires_grad_(True) for t in inputs[:2])
    loss = run_loss("dense", (main_q, main_k, *inputs[2:]), 4, 8)
    loss.backward()
    assert main_q.grad is None and main_k.grad is None
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in inputs[2:])
    # Three tokens: no complete pool of 4 anywhere, so no row has a candidate.
    short = random_inputs(1, 3, kpool=4)
    assert run_loss("dense", short, 4, 8).item() == 0.0


def test_bad_arguments_raise_value_error() -> None:
    inputs = random_inputs(1, 12, kpool=4)
    with pytest.raises(ValueError, match="mode"):
        run_loss("kl", inputs, 4, 8)
    with pytest.raises(ValueError, match="indices"):
        run_loss("sparse", inputs, 4, 8)
    with pytest.raises(ValueError, match="pooled"):
        run_loss("dense", inputs, 2, 8)
    with pytest.raises(ValueError, match="main_q"):
        run_loss("dense", (inputs[0][..., :-1], *inputs[1:]), 4, 8)
    with pytest.raises(ValueError, match="target_piece"):
        run_loss("dense", inputs, 4, 8, target_piece=0)


def test_the_sparse_attentions_log_sum_exp_gives_the_same_loss_and_is_refused_elsewhere() -> None:
    """With one shared key head the sparse target may read the attention forward's ``main_lse``: the same loss and
    indexer gradients as the target that forms its own, in chunks too. Refused in dense mode, with per-head keys
    and in the wrong shape."""
    batch, seq_len, heads, rank = 2, 37, 3, 5
    _, _, index_q, head_weights, pooled = random_inputs(batch, seq_len, kpool=4, heads=heads, seed=4)
    generator = torch.Generator().manual_seed(5)
    q_lat = torch.randn(batch, seq_len, heads, rank, generator=generator)
    latent = torch.randn(batch, seq_len, rank, generator=generator)
    indices = selection((q_lat, latent, index_q, head_weights, pooled), 4, 16)
    _, lse = sparse_latent_attention_forward(q_lat, latent, indices, MAIN_SCALE)
    arguments = dict(main_q=q_lat, main_k=latent[:, :, None, :], softmax_scale=MAIN_SCALE, index_q=index_q,
                     head_weights=head_weights, pooled=pooled, index_softmax_scale=INDEX_SCALE, kpool=4, topk=16,
                     indices=indices)
    own = indexer_kl_loss("sparse", **arguments)
    own_grads = torch.autograd.grad(own, (index_q, head_weights, pooled))
    for query_chunk in (None, 6):
        read = indexer_kl_loss("sparse", main_lse=lse, query_chunk=query_chunk, **arguments)
        torch.testing.assert_close(read, own, atol=1e-6, rtol=1e-6)
        for a, b in zip(torch.autograd.grad(read, (index_q, head_weights, pooled)), own_grads):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    # The target is normalised over the pools, so a shift common to every head changes nothing; one head's does.
    one_head = lse + torch.tensor([1.0] + [0.0] * (heads - 1))
    assert abs(float(indexer_kl_loss("sparse", main_lse=one_head, **arguments)) - float(own)) > 1e-5
    with pytest.raises(ValueError, match="main_lse"):
        indexer_kl_loss("dense", main_lse=lse, **arguments)
    with pytest.raises(ValueError, match="main_lse"):
        indexer_kl_loss("sparse", main_lse=lse[:, 1:], **arguments)
    per_head = dict(arguments, main_k=latent[:, :, None, :].expand(-1, -1, heads, -1))
    with pytest.raises(ValueError, match="main_lse"):
        indexer_kl_loss("sparse", main_lse=lse, **per_head)


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_one_shared_key_head_equals_per_head_keys_in_latent_space(mode: str) -> None:
    """MLA's absorbed form: main_q = q @ W_k per head and main_k = the latent as one shared head give the scores,
    hence the loss and the indexer's gradients, of per-head keys k = latent @ W_k.T."""
    batch, seq_len, heads, qk_dim, rank = 2, 41, 3, 8, 5
    main_q, _, index_q, head_weights, pooled = random_inputs(batch, seq_len, kpool=4, heads=heads, seed=9)
    generator = torch.Generator().manual_seed(10)
    latent = torch.randn(batch, seq_len, rank, generator=generator, dtype=torch.float64)
    key_weight = torch.randn(heads, qk_dim, rank, generator=generator, dtype=torch.float64)
    main_q = main_q.double()
    keys = torch.einsum("bsr,hdr->bshd", latent, key_weight)
    q_lat = torch.einsum("bthd,hdr->bthr", main_q, key_weight)
    indices = selection((main_q, keys, index_q, head_weights, pooled), 4, 16) if mode == "sparse" else None
    results = []
    for q, k in ((main_q, keys), (q_lat, latent[:, :, None, :])):
        loss = run_loss(mode, (q, k, index_q, head_weights, pooled), 4, 16, indices, query_chunk=7)
        results.append((loss, torch.autograd.grad(loss, (index_q, head_weights, pooled))))
    (per_head, per_head_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, per_head, atol=1e-6, rtol=1e-6)
    for a, b in zip(shared_grads, per_head_grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="main_k"):
        run_loss(mode, (q_lat, latent[:, :, None, :].expand(-1, -1, 2, -1), index_q, head_weights, pooled), 4, 16,
                 indices)
