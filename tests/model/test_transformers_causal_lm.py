"""transformers' AutoModelForCausalLM loads genolc checkpoints of both layouts with their LM head, same logits."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from genolc.model import build_model, convert_checkpoint, load_pretrained, save_pretrained
from genolc.model.checkpoint import CAUSAL_LM_CODE

pytest.importorskip("transformers.models.glm5_next")
from glm5_reference import small_config  # noqa: E402
from transformers import AutoModelForCausalLM, dynamic_module_utils  # noqa: E402

IDS = torch.randint(0, 37, (2, 53), generator=torch.Generator().manual_seed(3))
TOLERANCE = 1e-5


@pytest.fixture
def isolated_auto_classes(tmp_path, monkeypatch):
    """Remote code is cached under tmp_path, and classes registered by a load do not leak into other tests."""
    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    mapping = AutoModelForCausalLM._model_mapping
    monkeypatch.setattr(mapping, "_extra_content", dict(mapping._extra_content))


def _model(tie: bool):
    """A genolc model with weights far from their initialisation, so every layer shapes the logits."""
    torch.manual_seed(5)
    model = build_model(small_config(tie_word_embeddings=tie)).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.15 * torch.randn(parameter.shape, generator=generator))
    return model


def _genolc_logits(model):
    with torch.no_grad():
        return model(IDS).logits


def _transformers_logits(model):
    with torch.no_grad():
        return model.eval()(input_ids=IDS, use_cache=False).logits


@pytest.mark.parametrize("tie", [False, True], ids=["separate-head", "tied-head"])
@pytest.mark.parametrize("layout", ["text", "multimodal"])
def test_auto_model_for_causal_lm_loads_both_layouts_with_head(layout, tie, tmp_path, isolated_auto_classes):
    ours = _model(tie)
    path = tmp_path / f"ckpt-{layout}-{tie}"
    save_pretrained(ours, path, layout=layout)
    assert (path / CAUSAL_LM_CODE).is_file()

    loaded, info = AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert hasattr(loaded, "lm_head") and loaded.lm_head.weight.shape == (37, 32)
    assert (loaded.lm_head.weight is loaded.get_input_embeddings().weight) == tie
    assert (_transformers_logits(loaded) - _genolc_logits(ours)).abs().max().item() <= TOLERANCE


def test_converted_and_old_checkpoints(tmp_path, isolated_auto_classes):
    """`genolc convert` writes the loadable config; a checkpoint written before (no auto_map) still loads in genolc
    and is made loadable by transformers by converting it."""
    ours = _model(False)
    save_pretrained(ours, tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    assert config["auto_map"] == {"AutoModelForCausalLM": "glm5_next_causal_lm.Glm5NextTextForCausalLM"}
    assert config["architectures"] == ["Glm5NextTextForCausalLM"]
    del config["auto_map"]
    config["architectures"] = ["Glm5NextForConditionalGeneration"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    (tmp_path / "old" / CAUSAL_LM_CODE).unlink()
    assert torch.equal(_genolc_logits(load_pretrained(tmp_path / "old")), _genolc_logits(ours))
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "old"), trust_remote_code=True)

    convert_checkpoint(tmp_path / "old", tmp_path / "mm", layout="multimodal")
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "mm"), trust_remote_code=True)
    assert type(loaded).__name__ == "Glm5NextForCausalLM"
    assert (_transformers_logits(loaded) - _genolc_logits(ours)).abs().max().item() <= TOLERANCE


def test_registered_classes_load_without_remote_code(tmp_path, isolated_auto_classes):
    from genolc.glm5_next_causal_lm import Glm5NextTextForCausalLM, register_auto_classes

    ours = _model(False)
    save_pretrained(ours, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"), trust_remote_code=False)
    register_auto_classes()
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"))
    assert type(loaded) is Glm5NextTextForCausalLM
    assert (_transformers_logits(loaded) - _genolc_logits(ours)).abs().max().item() <= TOLERANCE
