"""build_model on a GPU builds on the meta device and initialises once (genolc/model/model.py ``materialize``):
every parameter and buffer must get its value from ``init_weights``, not from whatever memory ``to_empty`` handed
out. Checked here through ``materialize`` on the CPU with NaN-filled storage."""

from __future__ import annotations

import pytest
import torch

from genolc.model import build_model, preset
from genolc.model import model as model_module


@pytest.mark.parametrize("name", ["tiny", "mini"])
def test_init_weights_sets_every_parameter_and_buffer(name, monkeypatch):
    model = build_model(preset(name, vocab_size=16), device="meta")
    real_init = model_module.init_weights

    def poisoned_then_initialised(module):
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                tensor.fill_(float("nan"))
        real_init(module)

    monkeypatch.setattr(model_module, "init_weights", poisoned_then_initialised)
    model = model_module.materialize(model, "cpu")
    unset = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if not torch.isfinite(t).all()]
    assert unset == []


def test_the_initial_values_transformers_uses():
    model = model_module.materialize(build_model(preset("tiny", vocab_size=16), device="meta"), "cpu")
    indexer = model.layers[model.config.dsa_layers[0]].self_attn.indexer
    assert torch.equal(indexer.index_kpool_compress_ape, torch.zeros_like(indexer.index_kpool_compress_ape))
    assert torch.equal(indexer.index_kpool_compress_gate, torch.ones_like(indexer.index_kpool_compress_gate))
    assert torch.equal(indexer.k_norm.weight, torch.ones_like(indexer.k_norm.weight))
    assert torch.equal(indexer.k_norm.bias, torch.zeros_like(indexer.k_norm.bias))
    assert 0.015 < model.lm_head.weight.std().item() < 0.025


def test_tied_embeddings_stay_tied_and_seeds_repeat():
    config = preset("tiny", vocab_size=16).replace(tie_word_embeddings=True)
    on_cpu = build_model(config)
    assert on_cpu.lm_head.weight is on_cpu.embed_tokens.weight
    materialized = model_module.materialize(build_model(config, device="meta"), "cpu")
    assert materialized.lm_head.weight is materialized.embed_tokens.weight
    torch.manual_seed(3)
    first = build_model(preset("tiny", vocab_size=16)).state_dict()
    torch.manual_seed(3)
    second = build_model(preset("tiny", vocab_size=16)).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_materialized_model_trains():
    model = model_module.materialize(build_model(preset("tiny", vocab_size=16), device="meta"), "cpu")
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    out = model(torch.randint(0, 16, (1, 300), generator=torch.Generator().manual_seed(0)))
    out.logits.float().logsumexp(-1).mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
