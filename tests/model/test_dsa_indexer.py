"""The k-pool DSA indexer: transformers parity of the selected sets, chunk invariance, layout, memory, shapes."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from genolc.model.config import ModelConfig
from genolc.model.layers.dsa import DSAAttention
from genolc.model.ops.indexer.layout import (complete_pools_visible, index_rows, index_width, selected_pools,
                                             selects_all_causal)
from genolc.model.ops.indexer.pooling import pool_keys
from genolc.model.ops.indexer.reference import pool_scores, select_indices

glm5 = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig  # noqa: E402

TIE_TOLERANCE = 1e-6


def hf_config(kpool: int, topk: int = 64, indexer_types=("full",), select_tail: bool = True) -> Glm5NextTextConfig:
    n = len(indexer_types)
    config = Glm5NextTextConfig(
        vocab_size=16, hidden_size=64, num_hidden_layers=n, num_attention_heads=2, num_key_value_heads=2,
        q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, v_head_dim=16, qk_rope_head_dim=0, index_n_heads=2,
        index_head_dim=16, index_kpool=kpool, index_topk=topk, index_kpool_always_select_tail=select_tail,
        layer_types=["indexed_attention"] * n, mlp_layer_types=["dense"] * n, indexer_types=list(indexer_types),
        pad_token_id=None, n_routed_experts=4, num_experts_per_tok=2)
    config._attn_implementation = "eager"
    return config


def randomized_pair(config: Glm5NextTextConfig, layer_idx: int, seed: int):
    """transformers' attention module with random weights, and ours loaded from its state dict."""
    torch.manual_seed(seed)
    reference = glm5.Glm5NextTextAttention(config, layer_idx)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.normal_(0.0, 0.3)
    ours = DSAAttention(ModelConfig.from_hf(config.to_dict()), layer_idx)
    ours.load_state_dict(reference.state_dict(), strict=True)
    return reference, ours


def split_row(row: torch.Tensor, t: int, kpool: int) -> tuple[set[int], set[int]]:
    """Index row -> (selected complete pools, tail tokens); asserts pools are selected whole."""
    tokens = [int(i) for i in row if i >= 0]
    assert len(tokens) == len(set(tokens)), f"duplicate index in row {t}"
    assert all(i <= t for i in tokens), f"non-causal index in row {t}"
    boundary = (t + 1) // kpool * kpool
    pool_tokens = [i for i in tokens if i < boundary]
    pools = {i // kpool for i in pool_tokens}
    assert len(pool_tokens) == len(pools) * kpool, f"row {t} holds a partial pool"
    return pools, {i for i in tokens if i >= boundary}


def assert_same_selection(ours: torch.Tensor, theirs: torch.Tensor, scores: torch.Tensor, kpool: int, topk: int,
                          select_tail: bool) -> int:
    """Equal sets per row after dropping pools tied within TIE_TOLERANCE of the k-th score; returns #tied rows."""
    pools_per_row = topk // kpool
    tied_rows = 0
    for b in range(ours.shape[0]):
        for t in range(ours.shape[1]):
            ours_pools, ours_tail = split_row(ours[b, t], t, kpool)
            their_pools, their_tail = split_row(theirs[b, t], t, kpool)
            visible = (t + 1) // kpool
            expected_tail = set(range(visible * kpool, t + 1)) if select_tail else set()
            assert ours_tail == their_tail == expected_tail, f"tail of row {t}"
            assert len(ours_pools) == len(their_pools) == min(pools_per_row, visible), f"pool count of row {t}"
            if visible > pools_per_row:
                row_scores = scores[b, t, :visible]
                kth = row_scores.topk(pools_per_row).values[-1]
                tied = {int(p) for p in torch.nonzero((row_scores - kth).abs() <= TIE_TOLERANCE).flatten()}
                tied_rows += len(tied) > 1
                ours_pools, their_pools = ours_pools - tied, their_pools - tied
            assert ours_pools == their_pools, f"batch {b} row {t}: {sorted(ours_pools)} vs {sorted(their_pools)}"
    return tied_rows


@pytest.mark.parametrize("kpool", [4, 16])
@pytest.mark.parametrize("seq_len", [37, 203])
def test_selection_matches_transformers(kpool: int, seq_len: int) -> None:
    config = hf_config(kpool)
    for seed in (0, 1):
        reference, ours = randomized_pair(config, 0, seed)
        hidden = torch.randn(2, seq_len, 64)
        with torch.no_grad():
            q_resid = reference.q_a_layernorm(reference.q_a_proj(hidden))
            theirs = reference.indexer(hidden, q_resid, torch.ones(2, seq_len, dtype=torch.bool), None)
            mine = ours(hidden).indices
            features = ours.indexer.features(hidden, q_resid)
            scores = pool_scores(features.queries, features.head_weights, features.pooled, ours.indexer.softmax_scale)
        assert mine.shape == theirs.shape == (2, seq_len, index_width(64, kpool, True))
        assert mine.dtype == torch.long
        tied_rows = assert_same_selection(mine, theirs.long(), scores, kpool, 64, select_tail=True)
        # ReLU zeros make exact ties common with 2 indexer heads; they must stay the exception.
        assert tied_rows < mine.shape[0] * seq_len // 4


def test_selection_without_tail_and_single_token_pools() -> None:
    for kpool, select_tail in ((4, False), (1, True)):
        config = hf_config(kpool, topk=16, select_tail=select_tail)
        reference, ours = randomized_pair(config, 0, seed=3)
        hidden = torch.randn(1, 41, 64)
        with torch.no_grad():
            q_resid = reference.q_a_layernorm(reference.q_a_proj(hidden))
            theirs = reference.indexer(hidden, q_resid, torch.ones(1, 41, dtype=torch.bool), None)
            features = ours.indexer.features(hidden, q_resid)
            mine = ours._select(features)
            scores = pool_scores(features.queries, features.head_weights, features.pooled, ours.indexer.softmax_scale)
        assert mine.shape[-1] == index_width(16, kpool, select_tail) == theirs.shape[-1]
        assert_same_selection(mine, theirs.long(), scores, kpool, 16, select_tail)


def random_features(batch: int, seq_len: int, kpool: int, heads: int = 3, dim: int = 8, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(batch, seq_len, heads, dim, generator=generator)
    head_weights = torch.randn(batch, seq_len, heads, generator=generator)
    keys = torch.randn(batch, seq_len, dim, generator=generator)
    gates = torch.randn(batch, seq_len, dim, generator=generator)
    bias = torch.randn(kpool, dim, generator=generator)
    return queries, head_weights, pool_keys(keys, gates, bias, kpool)


def full_scores(queries, head_weights, pooled):
    return pool_scores(queries, head_weights, pooled, 0.5)


@pytest.mark.parametrize("kpool", [1, 4, 16])
def test_chunk_sizes_do_not_change_the_selection(kpool: int) -> None:
    topk = 32 if kpool < 16 else 64
    queries, head_weights, pooled = random_features(1, 151, kpool, seed=kpool)
    scores = full_scores(queries, head_weights, pooled)
    baseline = select_indices(queries, head_weights, pooled, kpool=kpool, topk=topk, select_tail=True,
                              softmax_scale=0.5)
    for query_chunk, pool_block in ((1, 1000), (7, 3), (64, 5), (1000, 1000)):
        other = select_indices(queries, head_weights, pooled, kpool=kpool, topk=topk, select_tail=True,
                               softmax_scale=0.5, query_chunk=query_chunk, pool_block=pool_block)
        assert_same_selection(other, baseline, scores, kpool, topk, select_tail=True)


@pytest.mark.parametrize("seq_len, offset, kpool, topk, select_tail", [
    (37, 0, 4, 8, True), (53, 29, 4, 16, True), (41, 6, 4, 8, False), (13, 0, 1, 4, True), (9, 3, 4, 64, True)])
def test_index_rows_give_back_the_rows_their_pools_came_from(seq_len, offset, kpool, topk, select_tail) -> None:
    """A kept selection (pool ids) expands to the very rows chosen: pool slots, empty slots (fewer visible pools
    than topk // kpool, the last case) and the tail, for a chunk that starts mid-window and mid-pool."""
    queries, head_weights, pooled = random_features(2, seq_len, 4, seed=seq_len)
    pooled = torch.randn(2, (offset + seq_len) // kpool, pooled.shape[-1])
    rows = select_indices(queries, head_weights, pooled, kpool=kpool, topk=topk, select_tail=select_tail,
                          softmax_scale=0.5, query_offset=offset)
    pools = selected_pools(rows, topk, kpool).to(torch.int32)
    assert torch.equal(index_rows(pools, query_offset=offset, kpool=kpool, select_tail=select_tail), rows)
    narrow = index_rows(pools, query_offset=offset, kpool=kpool, select_tail=select_tail, dtype=torch.int32)
    assert narrow.dtype == torch.int32 and torch.equal(narrow.long(), rows)
    if topk // kpool > (offset + seq_len) // kpool:
        assert (pools == -1).any()


def test_pool_keys_are_gated_means_and_selection_layout() -> None:
    keys = torch.randn(1, 10, 4)
    gates = torch.zeros(1, 10, 4)
    pooled = pool_keys(keys, gates, torch.zeros(4, 4), kpool=4)
    assert pooled.shape == (1, 2, 4)  # the trailing 2 tokens form no complete pool
    torch.testing.assert_close(pooled, keys[:, :8].reshape(1, 2, 4, 4).mean(dim=2))

    queries, head_weights, pooled = random_features(1, 30, 4, seed=5)
    indices = select_indices(queries, head_weights, pooled, kpool=4, topk=8, select_tail=True, softmax_scale=0.5)
    assert indices.shape == (1, 30, 11)
    pools = selected_pools(indices, topk=8, kpool=4)
    for t in range(30):
        row = indices[0, t]
        for slot, pool in enumerate(pools[0, t].tolist()):
            expected = list(range(pool * 4, pool * 4 + 4)) if pool >= 0 else [-1] * 4
            assert row[slot * 4: slot * 4 + 4].tolist() == expected
        tail = [i for i in row[8:].tolist() if i >= 0]
        assert tail == list(range((t + 1) // 4 * 4, t + 1))
    assert complete_pools_visible(torch.tensor([0, 2, 3, 4, 7]), 4).tolist() == [0, 0, 1, 1, 2]


def test_selects_all_causal_rows_when_everything_fits() -> None:
    for kpool, seq_len, topk in ((4, 67, 64), (16, 79, 64), (1, 64, 64)):
        assert selects_all_causal(seq_len, topk, kpool, select_tail=True)
        queries, head_weights, pooled = random_features(1, seq_len, kpool, seed=seq_len)
        indices = select_indices(queries, head_weights, pooled, kpool=kpool, topk=topk, select_tail=True,
                                 softmax_scale=0.5, query_chunk=13)
        for t in range(seq_len):
            assert sorted(i for i in indices[0, t].tolist() if i >= 0) == list(range(t + 1))
    assert not selects_all_causal(68, 64, 4, select_tail=True)
    assert not selects_all_causal(10, 64, 4, select_tail=False)


class LargestAllocation(TorchDispatchMode):
    """Records the largest tensor storage any op produces while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(value, torch.Tensor):
                self.largest = max(self.largest, value.untyped_storage().nbytes())
        return result


def test_largest_allocation_grows_linearly_in_length() -> None:
    config = ModelConfig.from_hf(hf_config(4).to_dict())
    torch.manual_seed(0)
    layer = DSAAttention(config, 0)
    largest = {}
    for seq_len in (1024, 4096):
        hidden = torch.randn(1, seq_len, 64)
        tracker = LargestAllocation()
        with torch.no_grad(), tracker:
            q_resid = layer.q_a_layernorm(layer.q_a_proj(hidden))
            features = layer.indexer.features(hidden, q_resid)
            select_indices(features.queries, features.head_weights, features.pooled, kpool=4, topk=64,
                           select_tail=True, softmax_scale=layer.indexer.softmax_scale, query_chunk=128,
                           pool_block=128)
        largest[seq_len] = tracker.largest
    ratio = largest[4096] / largest[1024]
    assert 3.5 < ratio < 4.5, largest  # a [T, T / kpool] score matrix would grow 16x
    assert largest[4096] < 4096 * (4096 // 4) * 4 / 4  # and stay far below one such fp32 matrix


def test_bad_shapes_raise_value_error() -> None:
    queries, head_weights, pooled = random_features(1, 20, 4)
    common = dict(kpool=4, topk=8, select_tail=True, softmax_scale=0.5)
    with pytest.raises(ValueError, match="pooled"):
        select_indices(queries, head_weights, pooled[:, :-1], **common)
    with pytest.raises(ValueError, match="head_weights"):
        select_indices(queries, head_weights[..., :-1], pooled, **common)
    with pytest.raises(ValueError, match="multiple"):
        select_indices(queries, head_weights, pooled, **{**common, "topk": 6})
    with pytest.raises(ValueError, match="query_chunk"):
        select_indices(queries, head_weights, pooled, **common, query_chunk=0)
    with pytest.raises(ValueError, match=r"\[B, T, D\]"):
        pool_keys(torch.randn(1, 20, 8), torch.randn(1, 20, 4), torch.zeros(4, 8), 4)
    with pytest.raises(ValueError, match="position_bias"):
        pool_keys(torch.randn(1, 20, 8), torch.randn(1, 20, 8), torch.zeros(3, 8), 4)
    with pytest.raises(ValueError, match="pooled"):
        pool_scores(queries, head_weights, torch.randn(20, 8), 0.5)
    with pytest.raises(ValueError, match="indices"):
        selected_pools(torch.zeros(1, 20, 4, dtype=torch.long), topk=8, kpool=4)
