"""Helpers for tests that compare genolc's model with transformers' glm5_next (the independent reference)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from genolc.model.config import ModelConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# A vision tower as small as transformers allows, so multimodal checkpoints stay tiny.
TINY_VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=32,
                   projection_intermediate_size=16, patch_size=2, image_size=4)


def small_config(**overrides) -> ModelConfig:
    """A ~50k-parameter config with KDA, a full and a shared DSA layer, dense and MoE feed-forwards."""
    fields = dict(
        vocab_size=37, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2, kv_lora_rank=16,
        q_lora_rank=24, qk_nope_head_dim=8, v_head_dim=8, index_n_heads=2, index_head_dim=8, index_kpool=4,
        index_topk=32, linear_num_heads=2, linear_head_dim=8, pad_token_id=0,
        layer_types=("linear_attention", "indexed_attention", "indexed_attention", "linear_attention"),
        indexer_types=("full", "full", "shared", "full"),
        mlp_layer_types=("dense", "sparse", "sparse", "dense"),
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def random_reference_model(config: ModelConfig, seed: int):
    """transformers' Glm5NextForConditionalGeneration for ``config`` with every text weight randomised."""
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = Glm5NextForConditionalGeneration(Glm5NextConfig(text_config=config.to_hf(), vision_config=TINY_VISION))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if not name.startswith("model.visual."):
                parameter.add_(0.15 * torch.randn(parameter.shape, generator=generator))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
    return model.eval()


def save_reference(model, directory: Path) -> Path:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model.save_pretrained(str(directory))
    return directory


def reference_name(genolc_name: str) -> str:
    """transformers' parameter name (multimodal model) for a GenomeLM parameter name."""
    return genolc_name if genolc_name == "lm_head.weight" else "model.language_model." + genolc_name

# The tests are timed on shared 2-core machines where intra-op threads mostly wait on each other.
torch.set_num_threads(1)
