"""MoE routing and grouping, mHC Sinkhorn, the forward contract (aux losses, tokens per expert), resize_vocab."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from genolc.model import build_model, preset, resize_vocab
from genolc.model.layers.mhc import HyperConnection, merge_streams
from genolc.model.layers.moe import MoE, balance_loss, clamped_swiglu
from genolc.model.ops.mhc.reference import sinkhorn

from glm5_reference import small_config


def _random_moe(config, seed=0):
    torch.manual_seed(seed)
    moe = MoE(config)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
        moe.gate.e_score_correction_bias.normal_(0, 0.1)
    return moe


@pytest.mark.parametrize("overrides", [{}, {"n_routed_experts": 8, "n_group": 4, "topk_group": 2,
                                            "norm_topk_prob": False}])
def test_moe_equals_a_per_token_loop(overrides):
    config = small_config(**overrides)
    moe = _random_moe(config)
    x = torch.randn(2, 13, config.hidden_size)
    out = moe(x)
    flat = x.reshape(-1, config.hidden_size)
    scores = torch.sigmoid(flat @ moe.gate.weight.T)
    expected = moe.shared_experts(flat)
    per_group = config.n_routed_experts // config.n_group
    for n in range(flat.shape[0]):
        choice = scores[n] + moe.gate.e_score_correction_bias
        groups = choice.view(config.n_group, per_group).topk(min(2, per_group)).values.sum(-1)
        allowed = torch.zeros(config.n_routed_experts, dtype=torch.bool)
        for g in groups.topk(config.topk_group).indices.tolist():
            allowed[g * per_group:(g + 1) * per_group] = True
        chosen = choice.masked_fill(~allowed, -1e9).topk(config.num_experts_per_tok).indices
        weights = scores[n, chosen]
        if config.norm_topk_prob:
            weights = weights / weights.sum()
        for e, w in zip(chosen.tolist(), weights * config.routed_scaling_factor):
            gate, up = (moe.experts.gate_up_proj[e] @ flat[n]).chunk(2)
            expected[n] += w * (moe.experts.down_proj[e] @ clamped_swiglu(gate, up, config.swiglu_limit))
    assert torch.allclose(out.hidden.reshape(-1, config.hidden_size), expected, atol=1e-5)
    assert out.tokens_per_expert.sum().item() == flat.shape[0] * config.num_experts_per_tok
    assert out.tokens_per_expert.shape == (config.n_routed_experts,)


def test_swiglu_clamps_gate_and_up():
    gate, up = torch.tensor([20.0, -3.0]), torch.tensor([30.0, -30.0])
    expected = F.silu(torch.tensor([10.0, -3.0])) * torch.tensor([10.0, -10.0])
    assert torch.allclose(clamped_swiglu(gate, up, 10.0), expected)


def test_balance_loss_is_one_when_balanced_and_larger_when_not():
    from genolc.model.layers.moe import Routing

    even = Routing(expert_ids=torch.tensor([[0, 1], [2, 3]]), weights=torch.ones(2, 2), scores=torch.full((2, 4), 0.5))
    assert balance_loss(even, 4).item() == pytest.approx(1.0)
    skewed = Routing(expert_ids=torch.tensor([[0, 1], [0, 1]]), weights=torch.ones(2, 2),
                     scores=torch.tensor([[0.9, 0.9, 0.1, 0.1]] * 2))
    assert balance_loss(skewed, 4).item() > 1.5


def test_sinkhorn_makes_mixing_doubly_stochastic():
    matrix = torch.rand(5, 4, 4) + 0.01
    mixed = sinkhorn(matrix, iterations=20, eps=1e-6)
    assert torch.allclose(mixed.sum(-1), torch.ones(5, 4), atol=1e-3)
    assert torch.allclose(mixed.sum(-2), torch.ones(5, 4), atol=1e-3)
    hc = HyperConnection(small_config())
    streams = torch.randn(2, 3, 4, 32)
    post, comb, block_in, for_merge = hc(streams)
    assert post.shape == (2, 3, 4) and comb.shape == (2, 3, 4, 4) and block_in.shape == (2, 3, 32)
    assert torch.equal(for_merge, streams)
    with pytest.raises(ValueError, match="streams must be"):
        hc(torch.randn(2, 3, 32))


def test_merge_is_post_times_block_plus_comb_transposed_times_streams():
    """The element-wise merge against the product it spells out, in fp64; under bf16 autocast, with a bf16 block
    output as the layers hand it, it stays exact to fp32 (the matmul form, run in bf16 there, was 2.7e-2 off)."""
    torch.manual_seed(0)
    block_out, post = torch.randn(2, 5, 32, dtype=torch.float64), torch.rand(2, 5, 4, dtype=torch.float64)
    comb, streams = torch.rand(2, 5, 4, 4, dtype=torch.float64), torch.randn(2, 5, 4, 32, dtype=torch.float64)
    expected = post.unsqueeze(-1) * block_out.unsqueeze(-2) + comb.transpose(-1, -2) @ streams
    assert torch.allclose(merge_streams(block_out, post, comb, streams), expected, rtol=1e-12, atol=1e-12)
    block_bf16 = block_out.bfloat16()
    expected = post.unsqueeze(-1) * block_bf16.double().unsqueeze(-2) + comb.transpose(-1, -2) @ streams
    with torch.autocast("cpu", dtype=torch.bfloat16):
        merged = merge_streams(block_bf16, post.float(), comb.float(), streams.float())
    assert merged.dtype == torch.float32
    assert float((merged.double() - expected).abs().max()) < 1e-5


def test_forward_contract_and_indexer_losses():
    torch.manual_seed(0)
    config = preset("tiny")
    model = build_model(config)
    ids = torch.randint(0, config.vocab_size, (2, 72))
    out = model(ids)
    assert out.logits.shape == (2, 72, config.vocab_size)
    assert set(out.aux_losses) == {"moe_balance"} and set(out.tokens_per_expert) == {1, 2, 3}
    for counts in out.tokens_per_expert.values():
        assert counts.sum().item() == 2 * 72 * config.num_experts_per_tok
    for mode in ("dense", "sparse"):
        out = model(ids, indexer_loss=mode)
        kl = out.aux_losses["indexer_kl"]
        assert kl.ndim == 0 and torch.isfinite(kl)
        indexer = model.layers[3].self_attn.indexer
        grads = torch.autograd.grad(kl, [indexer.wk.weight, model.embed_tokens.weight], allow_unused=True)
        assert grads[0] is not None and grads[0].abs().sum() > 0
        assert grads[1] is None, "the indexer KL must not reach the LM's weights"
    with pytest.raises(ValueError, match="indexer_loss"):
        model(ids, indexer_loss="warmup")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        model(ids[0])


def test_resize_vocab_keeps_the_body_and_shared_rows():
    torch.manual_seed(0)
    config = small_config(vocab_size=300, pad_token_id=299)
    model = build_model(config)
    body = {k: v.clone() for k, v in model.state_dict().items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    old_embed = model.embed_tokens.weight.detach().clone()
    resize_vocab(model, 16)
    assert model.config.vocab_size == 16 and model.config.pad_token_id is None
    assert model.embed_tokens.weight.shape == (16, 32) and model.lm_head.weight.shape == (16, 32)
    assert torch.equal(model.embed_tokens.weight[:16], old_embed[:16])
    assert all(torch.equal(model.state_dict()[k], v) for k, v in body.items())
    assert model(torch.randint(0, 16, (1, 9))).logits.shape == (1, 9, 16)
    resize_vocab(model, 40, pad_token_id=39)
    assert model.embed_tokens.padding_idx == 39 and model.embed_tokens.weight[39].abs().sum() == 0


def _fields(routing):
    return routing.expert_ids, routing.weights, routing.scores


@pytest.mark.parametrize("overrides", [{}, {"n_routed_experts": 8, "n_group": 4, "topk_group": 2,
                                            "norm_topk_prob": False}])
def test_router_under_autocast_is_bit_equal_to_the_fp32_copy_it_no_longer_makes(overrides):
    """Under autocast the router hands a bf16 x to the product as it is, where it made an fp32 copy that autocast
    cast back (what handing it ``x.float()`` still does): choices, weights, scores and x's gradient bit-equal (random
    weights, so choices and gradients vary). Without autocast a bf16 x is still routed in fp32."""
    moe = _random_moe(small_config(**overrides))
    x = torch.randn(257, moe.gate.weight.shape[1]).to(torch.bfloat16).requires_grad_()
    probe = torch.randn(257, moe.gate.top_k)
    results = []
    for route in (lambda: _fields(moe.gate(x)), lambda: _fields(moe.gate(x.float()))):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expert_ids, weights, scores = route()
        (grad,) = torch.autograd.grad((weights.float() * probe).sum() + scores.float().square().sum(), x)
        results.append((expert_ids, weights, scores, grad))
    assert results[0][2].dtype == torch.bfloat16 and results[0][3].abs().sum() > 0
    assert len(set(results[0][0].flatten().tolist())) > 1
    for mine, theirs in zip(*results):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    plain = moe.gate(x.detach())
    assert plain.scores.dtype == torch.float32
    torch.testing.assert_close(plain.scores, torch.sigmoid(x.detach().float() @ moe.gate.weight.T))


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


def test_swiglu_mlp_one_product_matches_two():
    from genolc.model.layers.moe import SwiGLUMLP

    torch.manual_seed(3)
    mlp = SwiGLUMLP(48, 80, 7.0)
    x = torch.randn(3, 11, 48, requires_grad=True)
    out = mlp(x)
    expected = mlp.down_proj(clamped_swiglu(mlp.gate_proj(x), mlp.up_proj(x), 7.0))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    mine = torch.autograd.grad(out.square().sum(), [x, mlp.gate_proj.weight, mlp.up_proj.weight])
    theirs = torch.autograd.grad(expected.square().sum(), [x, mlp.gate_proj.weight, mlp.up_proj.weight])
    for got, want in zip(mine, theirs):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("autocast", [False, True])
def test_a_counting_pass_routes_from_the_forwards_scores(autocast):
    """MoE.routing_counts (the fill pass's last layer) routes from the very scores MoE.forward routes from: a
    router product of another width rounds otherwise, and near-tied experts would be chosen differently."""
    moe = _random_moe(small_config())
    x = torch.randn(2, 29, moe.gate.weight.shape[1])
    seen = []
    moe.gate.register_forward_hook(lambda module, inputs, routing: seen.append(routing))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        counts = moe(x).tokens_per_expert
        counted = moe.routing_counts(x)
    assert counted.hidden is None and torch.equal(counted.tokens_per_expert, counts)
    assert torch.equal(seen[0].scores, seen[1].scores) and torch.equal(seen[0].expert_ids, seen[1].expert_ids)


def test_a_forward_without_logits_stops_a_dense_last_layer_after_its_token_mixer():
    from genolc.model.cache import ChunkCache

    config = preset("tiny").replace(mlp_layer_types=("dense", "sparse", "sparse", "dense"))
    torch.manual_seed(0)
    model = build_model(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 300))
    results = []
    for logits in (True, False):
        cache = ChunkCache.empty(config.num_hidden_layers, start=0, window_len=600, aux=False)
        with torch.no_grad():
            out = model(ids, cache=cache, logits=logits)
        results.append((out, [layer.present for layer in cache.layers]))
    (whole, whole_entries), (fill, fill_entries) = results
    assert fill.logits is None and whole.logits is not None
    assert list(fill.tokens_per_expert) == list(whole.tokens_per_expert) == [1, 2]
    for entries, others in zip(whole_entries, fill_entries):
        assert entries.keys() == others.keys()
        for name, value in entries.items():
            assert torch.equal(value, others[name]), name
