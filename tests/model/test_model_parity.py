"""GenomeLM against transformers' glm5_next: checkpoints saved by transformers, loaded with load_pretrained.

Per case: max |Δ log-prob| <= 1e-4, gradients of a cross-entropy loss within relative error 1e-3 for every
parameter except the indexer's (transformers runs its indexer without grad), and the indexer's selected token sets
equal after dropping -1 entries and pools whose score lies within 1e-6 of the k-th best. Then save -> transformers
load gives the same logits, in both layouts.
"""

from __future__ import annotations

import pytest
import torch

from genolc.model import load_pretrained, save_pretrained
from genolc.model.ops.indexer.reference import pool_scores

pytest.importorskip("transformers.models.glm5_next")
from glm5_reference import (TINY_VISION, random_reference_model, reference_name, save_reference,  # noqa: E402
                            small_config)

LOGPROB_TOLERANCE = 1e-4
GRAD_TOLERANCE = 1e-3
TIE_TOLERANCE = 1e-6
BATCH = 2

CASES = {
    # name: (seed, config overrides, T); index_topk is 32 unless overridden.
    "kpool4-T77-above-topk": (0, {}, 77),
    "kpool16-T150-above-topk": (1, {"index_kpool": 16}, 150),
    "kpool4-T23-below-topk": (2, {}, 23),
    "kpool16-T45-no-tail": (3, {"index_kpool": 16, "index_topk": 64, "index_kpool_always_select_tail": False}, 45),
    "grouped-router-softplus-gate-T99": (4, {"n_routed_experts": 8, "n_group": 2, "topk_group": 1,
                                             "norm_topk_prob": False, "linear_lower_bound": None,
                                             "mlp_layer_types": ("sparse",) * 4}, 99),
}


def _capture_selection(ours, reference):
    """Hooks recording, per full DSA layer, our index rows and input, and transformers' index rows."""
    ours_rows, ours_inputs, reference_rows, handles = {}, {}, {}, []
    for i, layer in enumerate(ours.layers):
        attention = layer.self_attn
        if getattr(attention, "indexer", None) is None:
            continue
        handles.append(attention.register_forward_pre_hook(
            lambda module, args, i=i: ours_inputs.__setitem__(i, args[0].detach())))
        handles.append(attention.register_forward_hook(
            lambda module, args, out, i=i: ours_rows.__setitem__(i, out.indices.detach())))
        reference_indexer = reference.model.language_model.layers[i].self_attn.indexer
        handles.append(reference_indexer.register_forward_hook(
            lambda module, args, out, i=i: reference_rows.__setitem__(i, out.detach().long())))
    return ours_rows, ours_inputs, reference_rows, handles


def _assert_same_selection(layer, hidden, ours_rows, reference_rows, config) -> int:
    """Compare index sets row by row, ignoring near-tied pools; returns how many rows had a real choice."""
    with torch.no_grad():
        q_resid = layer.q_a_layernorm(layer.q_a_proj(hidden))
        features = layer.indexer.features(hidden, q_resid)
        scores = pool_scores(features.queries, features.head_weights, features.pooled, layer.indexer.softmax_scale)
    kpool, budget = config.index_kpool, config.index_topk // config.index_kpool
    assert ours_rows.shape == reference_rows.shape
    contested = 0
    for b in range(hidden.shape[0]):
        for t in range(hidden.shape[1]):
            visible = (t + 1) // kpool
            ignored: set[int] = set()
            if visible > budget:
                contested += 1
                row_scores = scores[b, t, :visible]
                kth = row_scores.topk(budget).values[-1]
                for pool in ((row_scores - kth).abs() <= TIE_TOLERANCE).nonzero().flatten().tolist():
                    ignored.update(range(pool * kpool, (pool + 1) * kpool))
            ours_set = set(ours_rows[b, t].tolist()) - {-1} - ignored
            reference_set = set(reference_rows[b, t].tolist()) - {-1} - ignored
            assert ours_set == reference_set, f"query {t} of sequence {b}: {sorted(ours_set ^ reference_set)}"
    return contested


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             ids[:, 1:].reshape(-1))


@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers(case, tmp_path):
    seed, overrides, length = CASES[case]
    config = small_config(**overrides)
    reference = random_reference_model(config, seed)
    ours = load_pretrained(save_reference(reference, tmp_path / "reference")).eval()
    ids = torch.randint(0, config.vocab_size, (BATCH, length), generator=torch.Generator().manual_seed(seed))

    ours_rows, ours_inputs, reference_rows, handles = _capture_selection(ours, reference)
    ours_logits = ours(ids).logits
    reference_logits = reference(input_ids=ids, use_cache=False).logits
    for handle in handles:
        handle.remove()

    delta = (ours_logits.log_softmax(-1) - reference_logits.float().log_softmax(-1)).abs().max().item()
    assert delta <= LOGPROB_TOLERANCE, f"max |Δ logprob| = {delta:.2e}"

    _next_token_loss(ours_logits, ids).backward()
    _next_token_loss(reference_logits, ids).backward()
    reference_params = dict(reference.named_parameters())
    checked = 0
    for name, parameter in ours.named_parameters():
        if ".indexer." in name:
            continue
        reference_grad = reference_params[reference_name(name)].grad
        reference_grad = torch.zeros_like(parameter) if reference_grad is None else reference_grad
        our_grad = torch.zeros_like(parameter) if parameter.grad is None else parameter.grad
        error = (our_grad - reference_grad).norm() / (reference_grad.norm() + 1e-12)
        assert error <= GRAD_TOLERANCE or reference_grad.norm() == our_grad.norm() == 0, \
            f"{name}: relative gradient error {error:.2e}"
        checked += 1
    assert checked > 50

    assert set(ours_rows) == set(reference_rows) and ours_rows, "no full DSA layer ran"
    contested = sum(_assert_same_selection(ours.layers[i].self_attn, ours_inputs[i], ours_rows[i],
                                           reference_rows[i], config) for i in ours_rows)
    if length > config.index_topk + config.index_kpool:
        assert contested > 0, "T above index_topk must exercise the selection"


def test_save_then_transformers_load_gives_same_logits(tmp_path):
    from transformers import Glm5NextForConditionalGeneration, Glm5NextTextModel

    config = small_config()
    ours = load_pretrained(save_reference(random_reference_model(config, 7), tmp_path / "reference")).eval()
    ids = torch.randint(0, config.vocab_size, (BATCH, 61), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = ours(ids).logits

        save_pretrained(ours, tmp_path / "text")
        text_model = Glm5NextTextModel.from_pretrained(str(tmp_path / "text")).eval()
        lm_head = load_pretrained(tmp_path / "text").lm_head.weight
        text_logits = text_model(input_ids=ids, use_cache=False).last_hidden_state @ lm_head.T
        assert (text_logits - expected).abs().max().item() <= 1e-5

        save_pretrained(ours, tmp_path / "multimodal", layout="multimodal", vision_config=TINY_VISION)
        full = Glm5NextForConditionalGeneration.from_pretrained(str(tmp_path / "multimodal")).eval()
        assert (full(input_ids=ids, use_cache=False).logits - expected).abs().max().item() <= 1e-5
