"""SkyRL 0.4.0 SFT configuration for a GLM-5.3-Flash-shaped model, and running SkyRL's SFT entry point.

The config is SkyRL's ``SFTConfig`` (``skyrl/train/config/sft_config.py``, class at lines 58-325 of the 0.4.0
wheel) written as YAML with only fields that class and its nested dataclasses define (``ModelConfig``,
``OptimizerConfig``, ``MegatronConfig`` and ``MegatronDDPConfig`` in ``skyrl/train/config/config.py``, lines 179,
200, 262 and 478; ``SFTPlacementConfig`` in ``sft_config.py`` line 51). SkyRL builds it with
``build_nested_dataclass``, which rejects unknown keys (``config.py`` lines 1686-1835), and checks it with
``validate_sft_cfg`` (``sft_config.py`` lines 530-624): for the Megatron strategy the world size must be divisible by
TP * PP * CP, context parallelism needs ``remove_microbatch_padding``, Ulysses ``sequence_parallel_size`` stays 1.

Choices, each for a reason:

- ``strategy: megatron`` with full recompute (``recompute_granularity: full``, ``recompute_method: uniform``,
  ``recompute_num_layers: 1``): a 512k-1M window's activations only fit recomputed layer by layer;
- TP/PP/CP/EP from :func:`genolc.export.layout.choose_layout` (CP 1: SkyRL 0.4.0's KDA refuses context
  parallelism); ``expert_tensor_parallel_size: 1`` as SkyRL recommends with EP > 1; when 45 layers do not split
  evenly over the pipeline stages the first stage takes fewer (``num_layers_in_first_pipeline_stage``);
- ``moe_router_score_function: sigmoid`` and ``moe_router_enable_expert_bias: true``: GLM-5.3-Flash's router;
  ``moe_router_load_balancing_type: none``: SkyRL's bridge freezes the bias update (``moe_router_bias_update_rate``
  0), and the aux loss is off by default;
- ``freeze_dsa_indexer: true``: the bridge sets ``dsa_indexer_loss_coeff`` to 0, so the indexer gets no gradient and
  SkyRL's own docs say to freeze it then;
- ``sampler: sequential`` and ``batch_size`` = data-parallel size, micro-batch 1: row ``i`` of the export is
  genolc's window for step ``i``, and every rank trains one window per step;
- ``hf_save_interval`` = the step count: SkyRL writes a transformers-layout checkpoint at the end, which
  ``genolc eval``/``score``/``embed`` read.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from genolc.errors import ConfigError, GenolcError
from genolc.export.layout import ParallelLayout

SKYRL_INSTALL_FIX = (
    "SkyRL runs in its own environment, not genolc's (it pins transformers <= 5.16.1): on the GPU machine, with "
    "Python 3.12, `python3.12 -m venv ~/skyrl && ~/skyrl/bin/pip install \"skyrl[megatron]==0.4.0\"`; then either "
    "install genolc there too and run this command from that environment, or run the `python -m "
    "skyrl.train.main_sft ...` line at the top of the export's skyrl_sft.yaml with ~/skyrl/bin/python")


def skyrl_run_dir(export_dir: Path) -> Path:
    """Where the launch line in an export's config sends SkyRL's checkpoints: beside the export, never inside it
    (re-exporting replaces the export directory whole)."""
    export_dir = Path(export_dir).absolute()
    return export_dir.parent / f"{export_dir.name}-skyrl-run"


def sft_config(*, model_path: str, data_dir: Path, seq_tokens: int, rows: int, layout: ParallelLayout, nodes: int,
               gpus_per_node: int, seed: int, out: Path, lr: float = 1e-5, warmup_steps: int = 0,
               weight_decay: float = 0.1, grad_clip: float = 1.0) -> dict[str, Any]:
    """The SFTConfig as a plain dict (see the module docstring for each choice)."""
    batch = layout.data_parallel
    steps = max(1, rows // batch)
    offload = layout.optimizer_offload
    transformer_kwargs: dict[str, Any] = {
        "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
        "gradient_accumulation_fusion": False,
    }
    if layout.first_stage_layers is not None:
        transformer_kwargs["num_layers_in_first_pipeline_stage"] = layout.first_stage_layers
    return {
        "strategy": "megatron",
        "model": {"path": model_path},
        "placement": {"num_nodes": nodes, "num_gpus_per_node": gpus_per_node},
        "optimizer_config": {
            "lr": lr, "weight_decay": weight_decay, "max_grad_norm": grad_clip, "num_warmup_steps": warmup_steps,
            "scheduler": "constant_with_warmup", "offload_after_step": False,
        },
        "megatron_config": {
            "tensor_model_parallel_size": layout.tensor_parallel,
            "pipeline_model_parallel_size": layout.pipeline_parallel,
            "context_parallel_size": layout.context_parallel,
            "expert_model_parallel_size": layout.expert_parallel,
            "expert_tensor_parallel_size": layout.expert_tensor_parallel,
            "moe_token_dispatcher_type": "alltoall",
            "moe_router_load_balancing_type": "none",
            "moe_grouped_gemm": True,
            "moe_router_score_function": "sigmoid",
            "moe_router_enable_expert_bias": True,
            "freeze_dsa_indexer": True,
            "transformer_config_kwargs": transformer_kwargs,
            "optimizer_config_kwargs": {
                "optimizer_cpu_offload": offload, "optimizer_offload_fraction": 1.0 if offload else 0.0,
                "overlap_cpu_optimizer_d2h_h2d": offload, "use_precision_aware_optimizer": False,
            },
        },
        "pretokenized_dataset_paths": [str(data_dir)],
        "max_length": seq_tokens,
        "num_steps": steps,
        "batch_size": batch,
        "micro_train_batch_size_per_gpu": 1,
        "remove_microbatch_padding": True,
        "use_sequence_packing": False,
        "sampler": "sequential",
        "seed": seed,
        "dataloader_num_workers": 0,
        "logger": "console",
        "project_name": "genolc",
        "run_name": f"genolc-{out.name}",
        "ckpt_path": str(out / "checkpoints"),
        "ckpt_interval": steps,
        "hf_save_interval": steps,
        "export_path": str(out / "hf"),
    }


def to_yaml(config: dict[str, Any], header: str) -> str:
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def dotlist(config: dict[str, Any], prefix: str = "") -> list[str]:
    """``key.path=value`` overrides for ``python -m skyrl.train.main_sft`` (values JSON-encoded, as SkyRL's own
    ``overrides_dict_to_dotlist`` does, so OmegaConf reads back the same types)."""
    import json

    out: list[str] = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key not in ("transformer_config_kwargs", "optimizer_config_kwargs"):
            out.extend(dotlist(value, name + "."))
        else:
            out.append(f"{name}={json.dumps(value)}")
    return out


def launch_command(config: dict[str, Any], python: str = "python") -> str:
    return " ".join([python, "-m", "skyrl.train.main_sft", *(shlex.quote(arg) for arg in dotlist(config))])


def require_skyrl() -> None:
    """One clear error unless SkyRL can run in this interpreter (Python 3.12 or later, ``skyrl`` importable)."""
    if sys.version_info < (3, 12):
        raise ConfigError(f"--backend skyrl needs SkyRL 0.4.0, which needs Python 3.12; this is Python "
                          f"{sys.version_info.major}.{sys.version_info.minor}", fix=SKYRL_INSTALL_FIX)
    if importlib.util.find_spec("skyrl") is None:
        raise ConfigError("--backend skyrl needs SkyRL 0.4.0, which is not installed in this environment",
                          fix=SKYRL_INSTALL_FIX)


def run_skyrl_sft(config: dict[str, Any]) -> int:
    """Run SkyRL's SFT entry point (``python -m skyrl.train.main_sft`` with ``config`` as overrides); its exit code."""
    require_skyrl()
    try:
        return subprocess.run([sys.executable, "-m", "skyrl.train.main_sft", *dotlist(config)]).returncode
    except OSError as exc:
        raise GenolcError(f"could not start SkyRL's SFT entry point ({exc.strerror})", fix=SKYRL_INSTALL_FIX) from None


def config_for_run(export_dir: Path, out: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The export's SkyRL config with ``finetune --backend skyrl``'s options applied and outputs under ``out``."""
    from genolc.errors import InputError
    from genolc.export.skyrl import CONFIG_NAME, DATA_DIR, load_export_manifest

    manifest = load_export_manifest(export_dir)
    path = Path(export_dir) / CONFIG_NAME
    if manifest.get("format") != "skyrl" or not path.is_file():
        raise InputError("--backend skyrl trains on a SkyRL export, and this is not one", where=str(export_dir),
                         fix="write one with `genolc export DATASET --format skyrl --seq LENGTH --out DIR` and pass "
                             "--data DIR")
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"the SkyRL config cannot be read ({exc})", where=str(path),
                         fix="write the export again") from None
    optimizer = config["optimizer_config"]
    for ours, theirs in (("lr", "lr"), ("weight_decay", "weight_decay"), ("grad_clip", "max_grad_norm"),
                         ("warmup_steps", "num_warmup_steps")):
        if ours in overrides:
            optimizer[theirs] = overrides[ours]
    if "steps" in overrides:
        config["num_steps"] = overrides["steps"]
    if "seed" in overrides:
        config["seed"] = overrides["seed"]
    if overrides.get("init") is not None:
        config["model"]["path"] = str(overrides["init"])
    steps = config["num_steps"]
    # The export may have moved since it was written (another machine, another folder): read it where it is now.
    config["pretokenized_dataset_paths"] = [str((Path(export_dir) / DATA_DIR).absolute())]
    config.update(ckpt_path=str(out / "checkpoints"), ckpt_interval=steps, hf_save_interval=steps,
                  export_path=str(out / "hf"), run_name=f"genolc-{out.name}")
    return config
