"""ModelConfig: transformers config.json round trips, validation errors, presets and their parameter counts."""

from __future__ import annotations

import json

import pytest
import torch

from genolc.errors import ConfigError, InputError
from genolc.model import ModelConfig, build_model, parameter_counts, preset
from genolc.model.config import ModelConfigError

transformers = pytest.importorskip("transformers")
from glm5_reference import small_config  # noqa: E402


def test_defaults_are_transformers_published_config():
    hf = transformers.Glm5NextTextConfig()
    ours = preset("glm-5.3-flash")
    for key, value in ours.to_hf().items():
        if key not in ("architectures", "model_type"):
            assert getattr(hf, key) == value, key


@pytest.mark.parametrize("layout", ["text", "multimodal"])
def test_round_trip_through_dict_and_file(layout, tmp_path):
    config = small_config(linear_lower_bound=None, eos_token_id=[1, 2])
    data = config.to_hf(layout)
    assert ("text_config" in data) == (layout == "multimodal")
    assert ModelConfig.from_hf(data) == config
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert ModelConfig.from_hf(tmp_path) == config
    assert ModelConfig.from_hf(tmp_path / "config.json") == config


def test_reads_configs_written_by_transformers(tmp_path):
    config = small_config()
    text = transformers.Glm5NextTextConfig(**{k: v for k, v in config.to_hf().items() if k != "architectures"})
    assert ModelConfig.from_hf(text.to_dict()) == config
    full = transformers.Glm5NextConfig(text_config=config.to_hf())
    full.save_pretrained(tmp_path)
    assert ModelConfig.from_hf(tmp_path) == config
    # and transformers reads ours back to the same architecture
    back = transformers.Glm5NextConfig(**config.to_hf("multimodal")).text_config
    assert back.layer_types == list(config.layer_types) and back.index_kpool == config.index_kpool


def test_legacy_spellings_and_default_schedules():
    config = ModelConfig.from_hf({
        "num_hidden_layers": 8, "linear_attn_config": {"head_dim": 64, "num_heads": 4, "short_conv_kernel_size": 3},
        "index_topk_pattern": "FFFFFFFS", "vocab_size": 300, "pad_token_id": None,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    })
    assert (config.linear_head_dim, config.linear_num_heads, config.linear_conv_kernel_dim) == (64, 4, 3)
    assert config.indexer_types[3] == "full" and config.indexer_types[7] == "shared"
    assert config.layer_types[3] == "indexed_attention"
    assert config.mlp_layer_types == ("dense",) * 3 + ("sparse",) * 5
    hf = transformers.Glm5NextTextConfig(num_hidden_layers=8, index_topk_freq=2)
    assert ModelConfig.from_hf({"num_hidden_layers": 8, "index_topk_freq": 2}).indexer_types == tuple(hf.indexer_types)


@pytest.mark.parametrize("changes,message", [
    ({"layer_types": ("linear_attention",) * 3}, "layer_types has 3 entries"),
    ({"mlp_layer_types": ("dense", "moe", "dense", "dense")}, "unknown value"),
    ({"index_topk": 30}, "divisible by index_kpool"),
    ({"indexer_types": ("full", "shared", "shared", "full")}, "no earlier DSA layer"),
    ({"num_key_value_heads": 1}, "num_key_value_heads"),
    ({"qk_rope_head_dim": 8}, "NoPE"),
    ({"pad_token_id": 37}, "outside the vocabulary"),
    ({"n_routed_experts": 6, "n_group": 4}, "divisible by n_group"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ({"hidden_size": 0}, "positive integer"),
])
def test_inconsistent_configs_are_rejected(changes, message):
    with pytest.raises(ModelConfigError, match=message) as info:
        small_config(**changes)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ConfigError)


def test_from_hf_errors_name_the_file(tmp_path):
    with pytest.raises(InputError, match="config.json not found"):
        ModelConfig.from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        ModelConfig.from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**small_config().to_hf(), "index_topk": 30}))
    with pytest.raises(ModelConfigError, match="config.json"):
        ModelConfig.from_hf(tmp_path)


# The shapes fixed by the model issue, written out independently of presets.py.
ISSUE_SHAPES = {
    #        hidden layers KDA heads x dim, MLA heads, q_lora, kv_lora, qk_nope, v, indexer heads x dim, kpool, topk,
    #        routed, top-k, moe_inter, dense inter
    "tiny": (64, 4, 4, 16, 2, 48, 32, 16, 16, 2, 16, 4, 64, 4, 2, 32, 128),
    "small": (1024, 12, 8, 128, 8, 384, 256, 128, 128, 8, 64, 4, 2048, 16, 2, 512, 2816),
    "base": (1536, 16, 12, 128, 12, 512, 384, 128, 128, 8, 64, 4, 2048, 32, 4, 768, 4096),
}
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "linear_num_heads", "linear_head_dim", "num_attention_heads",
                "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "index_n_heads", "index_head_dim",
                "index_kpool", "index_topk", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                "intermediate_size")


@pytest.mark.parametrize("name", list(ISSUE_SHAPES))
def test_presets_have_the_issue_shapes(name):
    config = preset(name)
    assert tuple(getattr(config, f) for f in SHAPE_FIELDS) == ISSUE_SHAPES[name]
    layers = config.num_hidden_layers
    assert config.layer_types == tuple("indexed_attention" if i % 4 == 3 else "linear_attention"
                                       for i in range(layers))
    assert config.mlp_layer_types == ("dense",) + ("sparse",) * (layers - 1)
    assert (config.n_shared_experts, config.hc_mult, config.qk_rope_head_dim) == (1, 4, 0)


def test_preset_vocab_override():
    assert preset("small").layer_types.count("indexed_attention") == 3
    assert preset("base", vocab_size=4096).vocab_size == 4096
    assert preset("glm-5.3-flash", vocab_size=16).pad_token_id is None
    with pytest.raises(ConfigError, match="unknown model preset"):
        preset("huge")


def test_parameter_counts_match_built_models():
    for config in (preset("tiny"), small_config(), small_config(tie_word_embeddings=True, attention_bias=True)):
        model = build_model(config)
        assert parameter_counts(config).total == sum(p.numel() for p in model.parameters())
    small = preset("small")
    model = build_model(small, device="meta")
    counts = parameter_counts(small)
    assert counts.total == sum(p.numel() for p in model.parameters()) == 356_911_952
    assert counts.active == 114_690_896
    assert parameter_counts(preset("tiny")).total == 248_900
    mini = preset("mini")
    assert parameter_counts(mini).total == sum(p.numel() for p in build_model(mini, device="meta").parameters()) \
        == 38_979_912
    assert parameter_counts(mini).active == 22_464_840
    assert parameter_counts(preset("base")).total == 1_924_049_904


def test_glm_5_3_flash_count_equals_transformers_on_meta():
    hf_config = transformers.Glm5NextTextConfig()
    with torch.device("meta"):
        text_model = transformers.Glm5NextTextModel(hf_config)
    reference = sum(p.numel() for p in text_model.parameters()) + hf_config.vocab_size * hf_config.hidden_size
    ours = build_model(preset("glm-5.3-flash"), device="meta")
    assert sum(p.numel() for p in ours.parameters()) == reference == parameter_counts(preset("glm-5.3-flash")).total
    assert reference == 313_326_816_766
