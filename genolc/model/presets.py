"""Model presets (fixed shapes, so benchmarks stay comparable over time) and exact parameter counts.

``preset(name, vocab_size=None)`` returns a :class:`ModelConfig`. The genome presets default to
``GENOME_VOCAB_SIZE`` tokens; pass the tokenizer's ``vocab_size`` to match a real tokenizer. Counts below are
computed by :func:`parameter_counts` from the shapes alone (tests check them against built models and
transformers); "active" counts the parameters one token passes through: all but the routed experts it is not sent
to. Buffers (the router's correction bias) are not parameters.

    preset          vocab  total parameters   active parameters
    tiny            16             248,900            212,036
    mini            16          38,979,912         22,464,840
    small           16         356,911,952        114,690,896
    base            16       1,924,049,904        437,693,424
    glm-5.3-flash   154880 313,326,816,766     17,376,726,526

(Regenerate with ``python -m genolc.model.presets``.)
"""

from __future__ import annotations

from dataclasses import dataclass

from genolc.errors import ConfigError
from genolc.model.config import ModelConfig

# Default genome vocabulary for the genome presets: small, like a character tokenizer's; override with the
# tokenizer's vocab_size.
GENOME_VOCAB_SIZE = 16


def _every_fourth_dsa(n_layers: int) -> tuple[str, ...]:
    return tuple("indexed_attention" if i % 4 == 3 else "linear_attention" for i in range(n_layers))


def _first_dense(n_layers: int) -> tuple[str, ...]:
    return ("dense",) + ("sparse",) * (n_layers - 1)


def _genome_preset(*, hidden: int, layers: int, kda_heads: int, kda_head_dim: int, mla_heads: int, q_lora: int,
                   kv_lora: int, qk_nope: int, v_dim: int, index_heads: int, index_head_dim: int, kpool: int,
                   topk: int, experts: int, experts_per_tok: int, moe_inter: int, dense_inter: int,
                   vocab_size: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=dense_inter,
        moe_intermediate_size=moe_inter,
        num_hidden_layers=layers,
        num_attention_heads=mla_heads,
        num_key_value_heads=mla_heads,
        n_shared_experts=1,
        n_routed_experts=experts,
        num_experts_per_tok=experts_per_tok,
        kv_lora_rank=kv_lora,
        q_lora_rank=q_lora,
        qk_rope_head_dim=0,
        qk_nope_head_dim=qk_nope,
        v_head_dim=v_dim,
        index_n_heads=index_heads,
        index_head_dim=index_head_dim,
        index_kpool=kpool,
        index_topk=topk,
        linear_num_heads=kda_heads,
        linear_head_dim=kda_head_dim,
        hc_mult=4,
        pad_token_id=None,
        layer_types=_every_fourth_dsa(layers),
        mlp_layer_types=_first_dense(layers),
        indexer_types=("full",) * layers,
    )


def tiny(vocab_size: int = GENOME_VOCAB_SIZE) -> ModelConfig:
    """4 layers (KDA, KDA, KDA, DSA), hidden 64: CPU tests in seconds."""
    return _genome_preset(hidden=64, layers=4, kda_heads=4, kda_head_dim=16, mla_heads=2, q_lora=48, kv_lora=32,
                          qk_nope=16, v_dim=16, index_heads=2, index_head_dim=16, kpool=4, topk=64, experts=4,
                          experts_per_tok=2, moe_inter=32, dense_inter=128, vocab_size=vocab_size)


def mini(vocab_size: int = GENOME_VOCAB_SIZE) -> ModelConfig:
    """8 layers (every 4th DSA), hidden 512: about 39M total / 22M active. ``small``'s head dims, latent rank, MLA head
    count, indexer and top-k (4 KDA heads, so ``--cp-kda heads`` takes at most 4 ranks; query rank 192), so the
    kernels ``small`` runs serve it; sized for experiments that must train many tokens in minutes on one GPU
    (experiments/long_context_dna.py: 93k tokens/s at 8k and 57k at 512k on an H200)."""
    return _genome_preset(hidden=512, layers=8, kda_heads=4, kda_head_dim=128, mla_heads=8, q_lora=192,
                          kv_lora=256, qk_nope=128, v_dim=128, index_heads=8, index_head_dim=64, kpool=4, topk=2048,
                          experts=8, experts_per_tok=2, moe_inter=256, dense_inter=1408, vocab_size=vocab_size)


def small(vocab_size: int = GENOME_VOCAB_SIZE) -> ModelConfig:
    """12 layers (every 4th DSA), hidden 1024: about 0.36B total / 0.12B active."""
    return _genome_preset(hidden=1024, layers=12, kda_heads=8, kda_head_dim=128, mla_heads=8, q_lora=384,
                          kv_lora=256, qk_nope=128, v_dim=128, index_heads=8, index_head_dim=64, kpool=4, topk=2048,
                          experts=16, experts_per_tok=2, moe_inter=512, dense_inter=2816, vocab_size=vocab_size)


def base(vocab_size: int = GENOME_VOCAB_SIZE) -> ModelConfig:
    """16 layers (every 4th DSA), hidden 1536: 1.92B total / 0.44B active (exact counts in the module docstring)."""
    return _genome_preset(hidden=1536, layers=16, kda_heads=12, kda_head_dim=128, mla_heads=12, q_lora=512,
                          kv_lora=384, qk_nope=128, v_dim=128, index_heads=8, index_head_dim=64, kpool=4, topk=2048,
                          experts=32, experts_per_tok=4, moe_inter=768, dense_inter=4096, vocab_size=vocab_size)


def glm_5_3_flash(vocab_size: int | None = None) -> ModelConfig:
    """The published GLM-5.3-Flash text decoder (transformers' Glm5NextTextConfig defaults)."""
    config = ModelConfig()
    if vocab_size is not None and vocab_size != config.vocab_size:
        pad = config.pad_token_id if config.pad_token_id is not None and config.pad_token_id < vocab_size else None
        config = config.replace(vocab_size=vocab_size, pad_token_id=pad)
    return config


PRESETS = {"tiny": tiny, "mini": mini, "small": small, "base": base, "glm-5.3-flash": glm_5_3_flash}


def preset(name: str, vocab_size: int | None = None) -> ModelConfig:
    """The named preset's config; ``vocab_size`` overrides the default vocabulary (the tokenizer's size)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}", where="--model", fix=f"use one of {', '.join(PRESETS)}")
    if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size < 1):
        raise ConfigError(f"vocab_size must be a positive integer, got {vocab_size!r}", where=f"preset {name}")
    builder = PRESETS[name]
    return builder(vocab_size) if vocab_size is not None else builder()


@dataclass(frozen=True)
class ParameterCounts:
    total: int
    active: int          # per token: everything except the routed experts it is not sent to
    embedding: int       # input embeddings + LM head (counted once when tied)


def parameter_counts(config: ModelConfig) -> ParameterCounts:
    """Exact trainable-parameter counts of ``build_model(config)`` from the shapes alone (works for any size)."""
    c = config
    d = c.hidden_size
    streams = c.hc_mult
    mix_width = (2 + streams) * streams
    hyper_connection = mix_width * streams * d + mix_width + 3
    kda_width = c.linear_num_heads * c.linear_head_dim
    kda = (3 * d * kda_width                                      # q, k, v projections
           + 3 * kda_width * c.linear_conv_kernel_dim             # depthwise short conv
           + d * c.linear_head_dim + c.linear_head_dim * kda_width + kda_width + c.linear_num_heads  # forget gate
           + d * c.linear_num_heads                               # beta
           + d * c.linear_head_dim + c.linear_head_dim * kda_width  # output gate
           + c.linear_head_dim                                    # gated RMSNorm
           + kda_width * d)                                       # output projection
    attn_bias = int(c.attention_bias)
    mla = (d * c.q_lora_rank + attn_bias * c.q_lora_rank + c.q_lora_rank
           + c.q_lora_rank * c.num_attention_heads * c.qk_head_dim
           + d * (c.kv_lora_rank + c.qk_rope_head_dim) + attn_bias * (c.kv_lora_rank + c.qk_rope_head_dim)
           + c.kv_lora_rank + c.kv_lora_rank * c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim)
           + c.num_attention_heads * c.v_head_dim * d + attn_bias * d)
    indexer = (c.q_lora_rank * c.index_n_heads * c.index_head_dim + d * c.index_head_dim + 2 * c.index_head_dim
               + d * c.index_n_heads + c.index_kpool * c.index_head_dim + c.index_head_dim * d)
    dense_mlp = 3 * d * c.intermediate_size
    one_expert = 3 * d * c.moe_intermediate_size
    moe = c.n_routed_experts * one_expert + c.n_routed_experts * d + c.n_shared_experts * one_expert

    total = active = 0
    for attn, mlp, indexer_type in zip(c.layer_types, c.mlp_layer_types, c.indexer_types):
        layer = 2 * hyper_connection + 2 * d
        if attn == "linear_attention":
            layer += kda
        else:
            layer += mla + (indexer if indexer_type == "full" else 0)
        layer += moe if mlp == "sparse" else dense_mlp
        total += layer
        active += layer - (c.n_routed_experts - c.num_experts_per_tok) * one_expert * (mlp == "sparse")
    embedding = c.vocab_size * d * (1 if c.tie_word_embeddings else 2)
    total += embedding + d
    active += embedding + d
    return ParameterCounts(total=total, active=active, embedding=embedding)


def _table() -> str:
    rows = []
    for name in PRESETS:
        config = preset(name)
        counts = parameter_counts(config)
        rows.append(f"    {name:<15} {config.vocab_size:<6} {counts.total:>15,} {counts.active:>18,}")
    return "\n".join(rows)


if __name__ == "__main__":
    print(_table())
