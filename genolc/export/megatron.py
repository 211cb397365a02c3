"""Megatron-core hand-off: model-provider arguments for the GLM-5.3-Flash architecture and a dataset over genolc's
prepared dataset in the dict format Megatron's GPT training step reads.

Model-provider arguments follow SkyRL 0.4.0's GLM-5.3-Flash bridge (``skyrl/backends/skyrl_train/patches/megatron/
glm5_next/bridge.py``, ``Glm5NextBridge.provider_bridge``, lines 128-209) and the generic transformers-to-Megatron
field names Megatron-Bridge maps first (num_hidden_layers -> num_layers, intermediate_size -> ffn_hidden_size, ...).
They come in two groups:

- ``transformer_config``: fields of megatron-core 0.16.1's ``MLATransformerConfig`` (a test constructs one from
  them);
- ``glm5_next_extension``: fields megatron-core 0.16.1 lacks, which SkyRL's bridge sets on its
  ``Glm5NextModelProvider`` (``glm5_next/provider.py``): Manifold-Constrained Hyper-Connections, the KDA gate bound,
  the DSA indexer's k-pool (provider fields) and newer DSA indexer knobs (fields of megatron-core 0.19.2, the
  newest on PyPI for Python 3.12; SkyRL 0.4.0 does not pin megatron-core);
- ``gpt_model``: Megatron-Bridge ``GPTModelProvider`` fields (vocabulary, sequence length, tied embeddings).

megatron-core 0.16.1 alone has neither the KDA module nor mHC, so building the whole model takes
``Glm5NextModelProvider(**transformer_config, **glm5_next_extension, **gpt_model)`` from SkyRL's package (with
megatron-bridge); the same arguments then drive ``torchrun`` + Megatron without SkyRL's Ray trainer.

:class:`MegatronWindowDataset` yields, for index ``i``, genolc's training window for step ``i`` (micro-batch 0, one
data-parallel rank; the rows ``genolc export --format skyrl`` writes), as Megatron's ``GPTDataset`` does with
``create_attention_mask=False`` (megatron/core/datasets/gpt_dataset.py, ``__getitem__``): ``tokens`` (the window
without its last token), ``labels`` (without its first), ``loss_mask`` (float, 0 at ambiguous targets),
``position_ids``; no ``attention_mask`` key, so Megatron's ``get_batch`` passes ``attention_mask=None`` and the
attention is causal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from genolc.data.targets import window_targets
from genolc.export.layout import ParallelLayout
from genolc.model.config import ModelConfig

MEGATRON_CORE_VERSION = "0.16.1"


def provider_kwargs(config: ModelConfig, seq_tokens: int, layout: ParallelLayout | None = None) -> dict[str, Any]:
    """``{"transformer_config": {...}, "glm5_next_extension": {...}}`` for ``config`` (see the module docstring)."""
    c = config
    layer_freq = [1 if t == "linear_attention" else 0 for t in c.layer_types]
    transformer: dict[str, Any] = {
        "num_layers": c.num_hidden_layers,
        "hidden_size": c.hidden_size,
        "ffn_hidden_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_query_groups": c.num_key_value_heads,
        "layernorm_epsilon": c.rms_norm_eps,
        "init_method_std": c.initializer_range,
        "normalization": "RMSNorm",
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "add_qkv_bias": c.attention_bias,
        "hidden_dropout": 0.0,
        "attention_dropout": c.attention_dropout,
        "attention_softmax_in_fp32": False,
        "activation_func_clamp_value": c.swiglu_limit,
        "bias_activation_fusion": False,
        "use_te_activation_func": False,
        "bf16": True,
        # NoPE MLA on the DSA layers: qk_rope_head_dim is 0, so the rotary fields are inert.
        "multi_latent_attention": True,
        "q_lora_rank": c.q_lora_rank,
        "kv_lora_rank": c.kv_lora_rank,
        "qk_head_dim": c.qk_nope_head_dim,
        "qk_pos_emb_head_dim": c.qk_rope_head_dim,
        "v_head_dim": c.v_head_dim,
        "qk_layernorm": True,
        "rope_type": "rope",
        "rotary_scaling_factor": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "apply_rope_fusion": False,
        "experimental_attention_variant": "dsa",
        "dsa_indexer_n_heads": c.index_n_heads,
        "dsa_indexer_head_dim": c.index_head_dim,
        "dsa_indexer_topk": c.index_topk,
        "dsa_indexer_loss_coeff": 0.0,
        "linear_attention_freq": layer_freq,
        "linear_num_key_heads": c.linear_num_heads,
        "linear_num_value_heads": c.linear_num_heads,
        "linear_key_head_dim": c.linear_head_dim,
        "linear_value_head_dim": c.linear_head_dim,
        "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
        "num_moe_experts": c.n_routed_experts,
        "moe_ffn_hidden_size": c.moe_intermediate_size,
        "moe_shared_expert_intermediate_size": c.moe_intermediate_size * c.n_shared_experts or None,
        "moe_layer_freq": [1 if t == "sparse" else 0 for t in c.mlp_layer_types],
        "moe_router_topk": c.num_experts_per_tok,
        "moe_router_topk_scaling_factor": c.routed_scaling_factor,
        "moe_router_score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "moe_router_bias_update_rate": 0.0,
        "moe_router_pre_softmax": True,
        "moe_router_dtype": "fp32",
        "moe_grouped_gemm": True,
        "moe_token_dispatcher_type": "alltoall",
        "moe_router_num_groups": None if c.n_group in (None, 1) else c.n_group,
        "moe_router_group_topk": None if c.n_group in (None, 1) else c.topk_group,
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    }
    if layout is not None:
        transformer.update(
            tensor_model_parallel_size=layout.tensor_parallel,
            context_parallel_size=layout.context_parallel,
            expert_model_parallel_size=layout.expert_parallel,
            expert_tensor_parallel_size=layout.expert_tensor_parallel,
            pipeline_model_parallel_size=layout.pipeline_parallel,
            sequence_parallel=layout.tensor_parallel > 1,
        )
        if layout.pipeline_parallel > 1:
            transformer["pipeline_dtype"] = "bfloat16"  # a torch dtype name; see mla_transformer_config
        if layout.first_stage_layers is not None:
            transformer["num_layers_in_first_pipeline_stage"] = layout.first_stage_layers
    extension = {
        "enable_mhc_connections": True,
        "mhc_num_residual_streams": c.hc_mult,
        "mhc_sinkhorn_iterations": c.hc_sinkhorn_iters,
        "mhc_norm_eps": c.rms_norm_eps,
        "mhc_norm_eps_inside_sqrt": True,
        "kda_gate_lower_bound": c.linear_lower_bound,
        "dsa_indexer_kpool": c.index_kpool,
        "dsa_indexer_kpool_always_select_tail": c.index_kpool_always_select_tail,
        "dsa_indexer_rotate_activation": False,
        "dsa_indexer_scoring_relu": True,
        "dsa_indexer_k_norm_epsilon": 1e-6,
        "dsa_indexer_rope_interleaved": False,
        "dsa_indexer_topk_freq": 1,
        "dsa_indexer_skip_topk_offset": 0,
    }
    # Fields of Megatron-Bridge's GPTModelProvider (megatron-bridge 0.3.1, models/gpt_provider.py lines 125-196);
    # "rope" as its MLA providers set it, inert here (qk_rope_head_dim 0: NoPE).
    other = {
        "vocab_size": c.vocab_size,
        "seq_length": seq_tokens,
        "share_embeddings_and_output_weights": c.tie_word_embeddings,
        "position_embedding_type": "rope",
    }
    return {"transformer_config": transformer, "glm5_next_extension": extension, "gpt_model": other}


def mla_transformer_config(transformer_config: dict[str, Any]):
    """megatron-core's ``MLATransformerConfig`` from :func:`provider_kwargs`' ``transformer_config`` (dtype names, which
    JSON keeps as strings, become torch dtypes)."""
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    kwargs = dict(transformer_config)
    for key in ("pipeline_dtype", "params_dtype"):
        if isinstance(kwargs.get(key), str):
            kwargs[key] = getattr(torch, kwargs[key])
    return MLATransformerConfig(**kwargs)


class MegatronWindowDataset:
    """Map-style torch dataset: item ``i`` is genolc's training window for step ``i`` in Megatron's batch dict.

    ``seq_len`` counts input tokens (the window holds ``seq_len + 1``). Sampling arguments are
    :class:`~genolc.data.sampler.TrainSampler`'s; ``length`` is the number of items (steps) it offers.
    """

    def __init__(self, dataset: Any, seq_len: int | str, length: int, *, seed: int = 0,
                 max_n_fraction: float = 0.1, reverse_complement: bool = False):
        from genolc.data.dataset import PreparedDataset
        from genolc.data.sampler import TrainSampler

        self.dataset = dataset if not isinstance(dataset, (str, Path)) else PreparedDataset(dataset)
        self.sampler = TrainSampler(self.dataset, seq_len, seed=seed, max_n_fraction=max_n_fraction,
                                    reverse_complement=reverse_complement)
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        if not 0 <= int(index) < self.length:
            raise IndexError(f"window {index} is outside 0..{self.length - 1}")
        ids, weights = window_targets(self.dataset, self.sampler.window(int(index), 0))
        return {
            "tokens": torch.from_numpy(ids[:-1].copy()),
            "labels": torch.from_numpy(ids[1:].copy()),
            "loss_mask": torch.from_numpy(weights),
            "position_ids": torch.arange(ids.size - 1, dtype=torch.int64),
        }
