"""SkyRL 0.4.0's SFT config classes and pretokenized-row rules, transcribed from its source for CPU tests.

Sources (the ``skyrl-0.4.0-py3-none-any.whl`` wheel): ``skyrl/train/config/sft_config.py`` (``SFTConfig`` lines
58-325, ``SFTPlacementConfig`` line 51, ``validate_sft_cfg`` lines 530-624), ``skyrl/train/config/config.py``
(``ModelConfig`` 179, ``OptimizerConfig`` 200, ``MegatronDDPConfig`` 262, ``MegatronConfig`` 478,
``build_nested_dataclass`` 1798, which rejects unknown keys), ``skyrl/train/dataset/pretokenized.py``
(``_validate_and_plan`` 163-260, ``_NormalizeTransform`` 268-312). Field types were read with
``typing.get_type_hints`` on the real classes (in a separate Python 3.11 environment holding SkyRL's source).
The types are Python types (``None`` allowed where SkyRL says ``Optional``); nested classes are dicts of their own.
"""

from __future__ import annotations

OPT = type(None)

MEGATRON_DDP = {"grad_reduce_in_fp32": (bool,), "overlap_grad_reduce": (bool,), "overlap_param_gather": (bool,),
                "fp8_param_gather": (bool,), "average_in_collective": (bool,)}

MEGATRON = {
    "tensor_model_parallel_size": (int,), "pipeline_model_parallel_size": (int,), "context_parallel_size": (int,),
    "expert_model_parallel_size": (int,), "expert_tensor_parallel_size": (int, OPT),
    "moe_token_dispatcher_type": (str,), "moe_router_load_balancing_type": (str,), "moe_aux_loss_coeff": (float,),
    "moe_grouped_gemm": (bool,), "moe_router_score_function": (str, OPT), "moe_router_enable_expert_bias": (bool, OPT),
    "moe_enable_routing_replay": (bool,), "moe_per_layer_logging": (bool,), "moe_router_dtype": (str,),
    "ddp_config": MEGATRON_DDP, "hf_export_config": (dict,), "lora_config": (dict,),
    "optimizer_config_kwargs": (dict,), "fp8": (str, OPT), "fp8_recipe": (str, OPT), "fp8_param": (bool, OPT),
    "fp8_amax_compute_algo": (str, OPT), "transformer_config_kwargs": (dict,), "empty_cuda_cache": (bool, OPT),
    "model_config_kwargs": (dict,), "dist_ckpt_optim_fully_reshardable": (bool,), "freeze_moe_router": (bool,),
    "freeze_dsa_indexer": (bool,), "mtp_num_layers": (int, OPT), "mtp_loss_weight": (float,),
    "mtp_loss_chunk_size": (int, OPT), "mtp_loss_topk": (int, OPT), "async_dist_ckpt_save": (bool,),
    "async_save_prestage_to_cpu": (bool,),
}

SFT = {
    "model": {"path": (str, OPT), "lora": (dict,), "fake_int4_qat": (dict,)},
    "optimizer_config": {"lr": (float,), "adam_betas": (list,), "weight_decay": (float,), "max_grad_norm": (float,),
                         "offload_after_step": (bool,), "num_warmup_steps": (int,), "scheduler": (str,)},
    "placement": {"num_nodes": (int,), "num_gpus_per_node": (int,)},
    "megatron_config": MEGATRON,
    "fsdp_config": (dict,), "sequence_parallel_size": (int,), "model_config_kwargs": (dict,),
    "use_torch_compile": (bool,), "record_memory": (bool,), "torch_profiler_config": (dict,), "strategy": (str,),
    "dataset_name": (str, OPT), "dataset_split": (str, OPT), "train_datasets": (list, OPT),
    "train_dataset_splits": (list, OPT), "train_dataset_weights": (list, OPT),
    "pretokenized_dataset_paths": (list, OPT), "messages_key": (str,), "tools_key": (str,), "system_key": (str,),
    "eval_dataset_name": (str, OPT), "eval_dataset_split": (str, OPT), "eval_datasets": (list, OPT),
    "eval_dataset_splits": (list, OPT), "eval_dataset_names": (list, OPT),
    "eval_pretokenized_dataset_paths": (list, OPT), "eval_interval": (int,), "eval_before_train": (bool,),
    "max_length": (int, OPT), "num_steps": (int, OPT), "num_epochs": (int, OPT), "batch_size": (int,),
    "micro_train_batch_size_per_gpu": (int,), "logger": (str,), "project_name": (str,), "run_name": (str,),
    "tags": (list, OPT), "ckpt_path": (str,), "ckpt_interval": (int,), "enable_ray_gpu_monitor": (bool,),
    "max_ckpts_to_keep": (int,), "resume_from": (str,), "hf_save_interval": (int,), "export_path": (str,),
    "seed": (int,), "num_workers": (int,), "async_batch_collation": (bool,), "dataloader_num_workers": (int,),
    "dataloader_persistent_workers": (bool,), "sampler": (str,), "sampler_class_path": (str, OPT),
    "sampler_kwargs": (dict,), "cache_dir": (str,), "force_recache": (bool,), "disable_cache": (bool,),
    "train_on_what": (str,), "remove_microbatch_padding": (bool,), "use_sequence_packing": (bool,),
    "max_tokens_per_microbatch": (int, OPT), "dummy_run_full_ctx": (bool,), "dummy_run_max_steps": (int,),
    "max_training_steps": (int, OPT),
}


def schema_errors(config: dict, schema: dict = SFT, where: str = "") -> list[str]:
    """Keys SkyRL's ``build_nested_dataclass`` would reject, and values of the wrong type."""
    errors = []
    for key, value in config.items():
        name = f"{where}{key}"
        if key not in schema:
            errors.append(f"unknown field {name}")
            continue
        expected = schema[key]
        if isinstance(expected, dict):
            if not isinstance(value, dict):
                errors.append(f"{name} must be a mapping")
            else:
                errors.extend(schema_errors(value, expected, name + "."))
        elif not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
            errors.append(f"{name}={value!r} is not {expected}")
    return errors


def validate_sft(config: dict) -> list[str]:
    """``validate_sft_cfg``'s checks that apply to a pretokenized Megatron run (sft_config.py lines 530-624)."""
    errors = schema_errors(config)
    if config.get("strategy") not in ("megatron", "fsdp"):
        errors.append("strategy must be megatron or fsdp")
    if config.get("train_datasets") is not None and config.get("pretokenized_dataset_paths") is not None:
        errors.append("pretokenized_dataset_paths and train_datasets are exclusive")
    if not config.get("pretokenized_dataset_paths"):
        errors.append("pretokenized_dataset_paths must be a non-empty list")
    if config.get("micro_train_batch_size_per_gpu", 2) <= 0 or config.get("batch_size", 4) <= 0:
        errors.append("batch sizes must be > 0")
    if config.get("num_steps") is not None and config["num_steps"] <= 0:
        errors.append("num_steps must be > 0")
    if not config.get("model", {}).get("path"):
        errors.append("model.path must be set")
    if config.get("sampler", "random") not in ("random", "sequential", "custom"):
        errors.append("unknown sampler")
    megatron = config.get("megatron_config", {})
    tp = megatron.get("tensor_model_parallel_size", 1)
    pp = megatron.get("pipeline_model_parallel_size", 1)
    cp = megatron.get("context_parallel_size", 1)
    placement = config.get("placement", {})
    world = placement.get("num_nodes", 1) * placement.get("num_gpus_per_node", 4)
    if world % (tp * pp * cp):
        errors.append(f"world {world} is not divisible by TP*PP*CP {tp * pp * cp}")
    if cp > 1 and not config.get("remove_microbatch_padding", True):
        errors.append("context parallel needs remove_microbatch_padding")
    if config.get("sequence_parallel_size", 1) != 1:
        errors.append("Ulysses sequence parallel is not supported with megatron")
    # MegatronConfig's documented rule (config.py lines 480-489): experts tile the world.
    ep, etp = megatron.get("expert_model_parallel_size", 1), megatron.get("expert_tensor_parallel_size") or tp
    if world % (pp * ep * etp):
        errors.append(f"world {world} is not divisible by PP*EP*ETP {pp * ep * etp}")
    return errors


def normalized_row(input_ids: list[int], loss_mask: list[int], max_length: int | None) -> dict | None:
    """What SkyRL's pretokenized loader makes of one row (None: dropped), per ``_validate_and_plan`` and
    ``_NormalizeTransform``."""
    if len(input_ids) != len(loss_mask):
        raise ValueError("loss_mask length must equal len(input_ids)")
    if any(v not in (0, 1) for v in loss_mask):
        raise ValueError("loss_mask must contain only 0s and 1s")
    window = loss_mask[:max_length] if max_length is not None else loss_mask
    if 1 not in window:
        return None
    first = loss_mask.index(1)
    if max_length is not None and len(input_ids) > max_length:
        input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "num_actions": len(input_ids) - first,
            "loss_mask": loss_mask[first:]}
