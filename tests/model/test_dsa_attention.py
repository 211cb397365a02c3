"""DSA attention: the layer against transformers' glm5_next, the sparse ops against dense references and each other
(absorbed latent form vs per-head form), shapes."""

from __future__ import annotations

import pytest
import torch

from genolc.model.config import ModelConfig
from genolc.model.indexer_loss import indexer_kl_loss
from genolc.model.layers.dsa import DSAAttention
from genolc.model.ops.dsa.dense import dense_causal_attention
from genolc.model.ops.dsa.reference import sparse_attention, sparse_latent_attention

glm5 = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig  # noqa: E402


def hf_config(kpool: int, indexer_types=("full",)) -> Glm5NextTextConfig:
    n = len(indexer_types)
    config = Glm5NextTextConfig(
        vocab_size=16, hidden_size=64, num_hidden_layers=n, num_attention_heads=2, num_key_value_heads=2,
        q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, v_head_dim=16, qk_rope_head_dim=0, index_n_heads=2,
        index_head_dim=16, index_kpool=kpool, index_topk=64, layer_types=["indexed_attention"] * n,
        mlp_layer_types=["dense"] * n, indexer_types=list(indexer_types), pad_token_id=None, n_routed_experts=4,
        num_experts_per_tok=2)
    config._attn_implementation = "eager"
    return config


def randomized_layers(config: Glm5NextTextConfig, seed: int):
    """[(transformers module, genolc module)] per layer, random weights, genolc's loaded from transformers'."""
    torch.manual_seed(seed)
    ours_config = ModelConfig.from_hf(config.to_dict())
    pairs = []
    for layer_idx in range(config.num_hidden_layers):
        reference = glm5.Glm5NextTextAttention(config, layer_idx)
        with torch.no_grad():
            for parameter in reference.parameters():
                parameter.normal_(0.0, 0.3)
        ours = DSAAttention(ours_config, layer_idx)
        ours.load_state_dict(reference.state_dict(), strict=True)
        pairs.append((reference, ours))
    return pairs


def row_sets(indices: torch.Tensor) -> list[list[frozenset[int]]]:
    return [[frozenset(i for i in row.tolist() if i >= 0) for row in batch] for batch in indices]


@pytest.mark.parametrize("kpool", [4, 16])
@pytest.mark.parametrize("seq_len", [37, 203])
def test_layer_matches_transformers(kpool: int, seq_len: int) -> None:
    for seed in (0, 1):
        [(reference, ours)] = randomized_layers(hf_config(kpool), seed)
        hidden = torch.randn(2, seq_len, 64)
        mask = torch.ones(2, seq_len, dtype=torch.bool)
        with torch.no_grad():
            expected, _, _ = reference(hidden, mask)
            theirs = reference.indexer(hidden, reference.q_a_layernorm(reference.q_a_proj(hidden)), mask, None)
            got = ours(hidden)
        # Rows whose selection is the same set (all but near-ties, see test_dsa_indexer) give the same output.
        same = torch.tensor([[a == b for a, b in zip(x, y)] for x, y in zip(row_sets(got.indices), row_sets(theirs))])
        assert same.float().mean() > 0.75
        assert (got.hidden - expected)[same].abs().max() <= 1e-5
        # With transformers' own selection, every row agrees.
        ours.select_op = lambda *args, **kwargs: theirs.long()
        with torch.no_grad():
            assert (ours(hidden).hidden - expected).abs().max() <= 1e-5


def test_layer_gradients_match_transformers_outside_the_indexer() -> None:
    [(reference, ours)] = randomized_layers(hf_config(4), seed=2)
    hidden = torch.randn(1, 203, 64)
    mask = torch.ones(1, 203, dtype=torch.bool)
    weights = torch.randn(1, 203, 64)
    expected, _, _ = reference(hidden, mask)
    (expected * weights).sum().backward()
    with torch.no_grad():
        theirs = reference.indexer(hidden, reference.q_a_layernorm(reference.q_a_proj(hidden)), mask, None)
    ours.select_op = lambda *args, **kwargs: theirs.long()
    (ours(hidden).hidden * weights).sum().backward()
    reference_grads = dict(reference.named_parameters())
    for name, parameter in ours.named_parameters():
        if name.startswith("indexer."):
            assert parameter.grad is None, name  # the selection is not differentiable; transformers uses no_grad
            continue
        their_grad = reference_grads[name].grad
        assert (parameter.grad - their_grad).norm() <= 1e-3 * their_grad.norm(), name


def test_shared_layer_reuses_the_previous_selection() -> None:
    (reference_full, ours_full), (reference_shared, ours_shared) = randomized_layers(
        hf_config(4, indexer_types=("full", "shared")), seed=4)
    assert ours_shared.indexer is None and not any(k.startswith("indexer.") for k in ours_shared.state_dict())
    hidden = torch.randn(2, 151, 64)
    mask = torch.ones(2, 151, dtype=torch.bool)
    with torch.no_grad():
        _, _, their_indices = reference_full(hidden, mask)
        expected, _, _ = reference_shared(hidden, mask, prev_topk_indices=their_indices)
        full = ours_full(hidden)
        ours_full.select_op = lambda *args, **kwargs: their_indices.long()
        shared = ours_shared(hidden, shared_indices=ours_full(hidden).indices, indexer_loss="sparse")
    assert torch.equal(shared.indices, their_indices.long())
    assert shared.indexer_kl is None
    assert (shared.hidden - expected).abs().max() <= 1e-5
    assert full.indices.shape == (2, 151, 67)
    with pytest.raises(ValueError, match="shared_indices"):
        ours_shared(hidden)
    with pytest.raises(ValueError, match="shared_indices"):
        ours_shared(hidden, shared_indices=full.indices[:, :, :-1])


def random_qkv(batch=2, seq_len=29, heads=3, qk_dim=8, v_dim=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, seq_len, heads, dim, generator=generator, requires_grad=True)
            for dim in (qk_dim, qk_dim, v_dim)]


def random_causal_indices(batch: int, seq_len: int, width: int, seed: int = 0) -> torch.Tensor:
    """Distinct causal key positions per row in random order, -1 padding; some rows use the full width."""
    generator = torch.Generator().manual_seed(seed)
    indices = torch.full((batch, seq_len, width), -1, dtype=torch.long)
    for b in range(batch):
        for t in range(seq_len):
            count = int(torch.randint(1, min(t + 1, width) + 1, (1,), generator=generator))
            chosen = torch.randperm(t + 1, generator=generator)[:count]
            slots = torch.randperm(width, generator=generator)[:count]
            indices[b, t, slots] = chosen
    return indices


def dense_masked_attention(q, k, v, indices, scale):
    """The obvious [B, H, T, S] implementation of attention restricted to the selected keys."""
    selected = torch.zeros(q.shape[0], q.shape[1], k.shape[1], dtype=torch.bool)
    for b in range(q.shape[0]):
        for t in range(q.shape[1]):
            row = indices[b, t]
            selected[b, t, row[row >= 0]] = True
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    probs = scores.masked_fill(~selected[:, None], float("-inf")).softmax(dim=-1)
    return torch.einsum("bhts,bshd->bthd", probs, v)


def gradients(fn, tensors, weights):
    for tensor in tensors:
        tensor.grad = None
    out = fn()
    (out * weights).sum().backward()
    return out.detach(), [tensor.grad.clone() for tensor in tensors]


def test_sparse_gradients_match_dense_masked_attention() -> None:
    q, k, v = random_qkv()
    indices = random_causal_indices(2, 29, width=9)
    weights = torch.randn(2, 29, 3, 5)
    expected, expected_grads = gradients(lambda: dense_masked_attention(q, k, v, indices, 0.3), (q, k, v), weights)
    for query_chunk, recompute in ((1, True), (4, False), (29, True), (None, None)):
        got, got_grads = gradients(lambda: sparse_attention(q, k, v, indices, 0.3, query_chunk=query_chunk,
                                                            recompute=recompute), (q, k, v), weights)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
        for g, e in zip(got_grads, expected_grads):
            torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("qk_dim", "v_dim"), [(8, 5), (5, 8), (8, 8)])  # the dense path pads to one head size
def test_dense_fallback_equals_sparse_when_every_key_is_selected(qk_dim: int, v_dim: int) -> None:
    q, k, v = random_qkv(seq_len=31, qk_dim=qk_dim, v_dim=v_dim)
    positions = torch.arange(31)
    # Every causal key, shuffled, plus empty slots: the sparse path must give the dense path's numbers.
    everything = torch.where(positions[None, :] <= positions[:, None], positions[None, :], -1)
    everything = torch.cat([everything, torch.full((31, 4), -1)], dim=-1)[:, torch.randperm(35)]
    everything = everything.expand(2, -1, -1)
    weights = torch.randn(2, 31, 3, v_dim)
    dense, dense_grads = gradients(lambda: dense_causal_attention(q, k, v, 0.3), (q, k, v), weights)
    sparse, sparse_grads = gradients(lambda: sparse_attention(q, k, v, everything, 0.3, query_chunk=8),
                                     (q, k, v), weights)
    torch.testing.assert_close(sparse, dense, atol=1e-6, rtol=1e-6)
    for s, d in zip(sparse_grads, dense_grads):
        torch.testing.assert_close(s, d, atol=1e-6, rtol=1e-6)


def test_empty_rows_give_zeros() -> None:
    q, k, v = random_qkv(seq_len=6)
    indices = random_causal_indices(2, 6, width=3)
    indices[:, 2] = -1
    out = sparse_attention(q, k, v, indices, 0.3)
    assert torch.equal(out[:, 2], torch.zeros_like(out[:, 2]))
    assert torch.isfinite(out).all()


def test_indexer_trains_only_through_its_loss() -> None:
    [(_, ours)] = randomized_layers(hf_config(4), seed=5)
    hidden = torch.randn(1, 97, 64, requires_grad=True)
    out = ours(hidden)
    assert out.indexer_kl is None
    out.hidden.sum().backward()
    assert all(p.grad is None for n, p in ours.named_parameters() if n.startswith("indexer."))
    ours.zero_grad(set_to_none=True)
    hidden.grad = None

    for mode in ("sparse", "dense"):
        out = ours(hidden, indexer_loss=mode)
        assert out.indexer_kl is not None and out.indexer_kl.item() > 0
        out.indexer_kl.backward()
        for name, parameter in ours.named_parameters():
            assert (parameter.grad is not None) == name.startswith("indexer."), (mode, name)
        assert hidden.grad is None  # the indexer's inputs are detached
        ours.zero_grad(set_to_none=True)


def test_the_sparse_kl_reads_the_attentions_own_log_sum_exp(monkeypatch) -> None:
    """Under ``indexer_loss="sparse"`` the layer hands the KL's target the attention forward's log-sum-exp (the op
    then takes that forward as kept): the same output, KL and gradients as the layer without it, and as the layer
    running the plain op (no forward kept)."""
    import genolc.model.layers.dsa as dsa_layer

    [(_, ours)] = randomized_layers(hf_config(4), seed=8)
    hidden = torch.randn(1, 203, 64, requires_grad=True)
    handed = []

    def spy(mode, **kwargs):
        handed.append(kwargs["main_lse"])
        return indexer_kl_loss(mode, **kwargs)

    def without_lse(mode, **kwargs):
        return indexer_kl_loss(mode, **dict(kwargs, main_lse=None))

    def plain_op(q_lat, latent, indices, cache, want_lse):
        return ours.sparse_attention_op(q_lat, latent, indices, ours.softmax_scale), None

    results = []
    for loss, attention in ((spy, None), (without_lse, None), (indexer_kl_loss, plain_op)):
        monkeypatch.setattr(dsa_layer, "indexer_kl_loss", loss)
        if attention is not None:
            monkeypatch.setattr(ours, "_sparse_attention", attention)
        out = ours(hidden, indexer_loss="sparse")
        (out.hidden.square().sum() + out.indexer_kl).backward()
        results.append((out.hidden.detach(), out.indexer_kl.detach(), hidden.grad.clone(),
                        {n: p.grad.clone() for n, p in ours.named_parameters()}))
        ours.zero_grad(set_to_none=True)
        hidden.grad = None
    [lse] = handed
    assert lse is not None and lse.shape == (1, 203, 2) and lse.dtype == torch.float32
    # fp32 throughout; the kept forward's lse and the op's own differ in rounding (the gradients by up to 2e-6).
    (hidden_a, kl_a, grad_a, params_a), *others = results
    for hidden_b, kl_b, grad_b, params_b in others:
        torch.testing.assert_close(hidden_a, hidden_b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kl_a, kl_b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad_a, grad_b, atol=1e-5, rtol=1e-5)
        assert params_a.keys() == params_b.keys()
        for name in params_a:
            torch.testing.assert_close(params_a[name], params_b[name], atol=1e-5, rtol=1e-5, msg=name)


def test_dense_mode_attends_densely() -> None:
    [(_, ours)] = randomized_layers(hf_config(4), seed=6)
    hidden = torch.randn(1, 203, 64)
    with torch.no_grad():
        got = ours(hidden, indexer_loss="dense")
        q = ours.q_b_proj(ours.q_a_layernorm(ours.q_a_proj(hidden))).view(1, 203, 2, 16)
        k, v = ours.kv_b_proj(ours.kv_a_layernorm(ours.kv_a_proj_with_mqa(hidden))).view(1, 203, 2, 32).split(16, -1)
        expected = ours.o_proj(dense_causal_attention(q, k, v, 16 ** -0.5).reshape(1, 203, 32))
    torch.testing.assert_close(got.hidden, expected, atol=1e-6, rtol=1e-6)
    assert got.indices.shape == (1, 203, 67)


def test_bad_shapes_raise_value_error() -> None:
    q, k, v = random_qkv(seq_len=10)
    indices = random_causal_indices(2, 10, width=4)
    with pytest.raises(ValueError, match="indices"):
        sparse_attention(q, k, v, indices[:, :-1], 0.3)
    with pytest.raises(ValueError, match="int32 or int64"):
        sparse_attention(q, k, v, indices.float(), 0.3)
    with pytest.raises(ValueError, match="disagree"):
        sparse_attention(q, k[..., :-1], v, indices, 0.3)
    with pytest.raises(ValueError, match=r"\[B, T, H, D\]"):
        dense_causal_attention(q[0], k, v, 0.3)
    with pytest.raises(ValueError, match="query_chunk"):
        sparse_attention(q, k, v, indices, 0.3, query_chunk=0)
    [(_, ours)] = randomized_layers(hf_config(4), seed=7)
    with pytest.raises(ValueError, match=r"\[B, T, D\]"):
        ours(torch.randn(10, 64))
    with pytest.raises(ValueError, match="indexer_loss"):
        ours(torch.randn(1, 10, 64), indexer_loss="kl")


def test_latent_attention_equals_per_head_attention() -> None:
    """q_lat = q @ W_k, attention over the shared latent, then @ W_v.T: the per-head op's outputs and gradients
    (fp64; int32 and int64 rows, an empty row, every chunking)."""
    batch, seq_len, heads, qk_dim, v_dim, rank = 2, 29, 3, 8, 5, 7
    generator = torch.Generator().manual_seed(11)
    q = torch.randn(batch, seq_len, heads, qk_dim, generator=generator, dtype=torch.float64, requires_grad=True)
    latent = torch.randn(batch, seq_len, rank, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(heads, qk_dim + v_dim, rank, generator=generator, dtype=torch.float64, requires_grad=True)
    indices = random_causal_indices(batch, seq_len, width=9, seed=3)
    indices[1, 4] = -1
    out_weights = torch.randn(batch, seq_len, heads, v_dim, generator=generator, dtype=torch.float64)

    def per_head():
        k = torch.einsum("bsr,hdr->bshd", latent, weight[:, :qk_dim])
        v = torch.einsum("bsr,hdr->bshd", latent, weight[:, qk_dim:])
        return sparse_attention(q, k, v, indices, 0.3)

    def absorbed(rows, query_chunk, recompute):
        q_lat = torch.einsum("bthd,hdr->bthr", q, weight[:, :qk_dim])
        o_lat = sparse_latent_attention(q_lat, latent, rows, 0.3, query_chunk=query_chunk, recompute=recompute)
        assert o_lat.shape == (batch, seq_len, heads, rank) and o_lat.dtype == torch.float64
        return torch.einsum("bthr,hvr->bthv", o_lat, weight[:, qk_dim:])

    expected, expected_grads = gradients(per_head, (q, latent, weight), out_weights)
    assert torch.equal(expected[1, 4], torch.zeros_like(expected[1, 4]))
    for rows, query_chunk, recompute in ((indices, None, None), (indices.int(), 1, True), (indices.int(), 5, False)):
        got, got_grads = gradients(lambda: absorbed(rows, query_chunk, recompute), (q, latent, weight), out_weights)
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
        for g, e in zip(got_grads, expected_grads):
            torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-10)


def test_latent_attention_mixed_dtypes_and_bad_shapes() -> None:
    q_lat = torch.randn(1, 10, 2, 6)
    latent = torch.randn(1, 10, 6)
    indices = random_causal_indices(1, 10, width=4)
    out = sparse_latent_attention(q_lat.bfloat16(), latent, indices, 0.3)
    assert out.dtype == torch.float32  # latent's dtype; the scores in the wider of the two
    torch.testing.assert_close(out, sparse_latent_attention(q_lat.bfloat16().float(), latent, indices, 0.3))
    with pytest.raises(ValueError, match=r"q_lat must be \[B, T, H, R\]"):
        sparse_latent_attention(q_lat[0], latent, indices, 0.3)
    with pytest.raises(ValueError, match="disagree"):
        sparse_latent_attention(q_lat, latent[..., :-1], indices, 0.3)
    with pytest.raises(ValueError, match="indices"):
        sparse_latent_attention(q_lat, latent, indices[:, :-1], 0.3)
    with pytest.raises(ValueError, match="int32 or int64"):
        sparse_latent_attention(q_lat, latent, indices.float(), 0.3)
    with pytest.raises(ValueError, match="query_chunk"):
        sparse_latent_attention(q_lat, latent, indices, 0.3, query_chunk=0)


@pytest.mark.parametrize("indexer_loss", [None, "sparse"])
def test_layer_equals_the_per_head_computation(indexer_loss: str | None) -> None:
    """The layer's absorbed sparse path gives the per-head (non-absorbed) layer's output, gradients and KL."""
    [(_, ours)] = randomized_layers(hf_config(4), seed=8)
    hidden = torch.randn(2, 203, 64)
    weights = torch.randn(2, 203, 64)
    got = ours(hidden, indexer_loss=indexer_loss)
    assert got.indices.dtype == torch.int64 and got.indices.shape == (2, 203, 67)
    got_loss = (got.hidden * weights).sum() + (got.indexer_kl if indexer_loss else 0.0)
    got_grads = torch.autograd.grad(got_loss, list(ours.parameters()), allow_unused=True)

    indices = got.indices
    q = ours.q_b_proj(ours.q_a_layernorm(ours.q_a_proj(hidden))).view(2, 203, 2, 16)
    k, v = ours.kv_b_proj(ours.kv_a_layernorm(ours.kv_a_proj_with_mqa(hidden))).view(2, 203, 2, 32).split(16, -1)
    expected = ours.o_proj(sparse_attention(q, k, v, indices, 16 ** -0.5).reshape(2, 203, 32))
    expected_loss = (expected * weights).sum()
    if indexer_loss:
        q_resid = ours.q_a_layernorm(ours.q_a_proj(hidden.detach())).detach()
        features = ours.indexer.features(hidden.detach(), q_resid)
        kl = indexer_kl_loss("sparse", main_q=q, main_k=k, softmax_scale=16 ** -0.5, index_q=features.queries,
                             head_weights=features.head_weights, pooled=features.pooled,
                             index_softmax_scale=ours.indexer.softmax_scale, kpool=4, topk=64, indices=indices)
        torch.testing.assert_close(got.indexer_kl, kl, atol=1e-6, rtol=1e-5)
        expected_loss = expected_loss + kl
    expected_grads = torch.autograd.grad(expected_loss, list(ours.parameters()), allow_unused=True)
    torch.testing.assert_close(got.hidden, expected, atol=1e-5, rtol=1e-5)
    for (name, _), mine, theirs in zip(ours.named_parameters(), got_grads, expected_grads):
        assert (mine is None) == (theirs is None), name
        if theirs is not None:
            assert (mine - theirs).norm() <= 1e-5 * theirs.norm().clamp_min(1e-12), name
