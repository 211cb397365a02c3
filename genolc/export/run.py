"""`genolc export`: write a SkyRL pretokenized SFT dataset (or Megatron-core arguments) from a prepared dataset.

Everything that can be refused is checked before anything is written: the format, the output directory (genolc's
own or empty), the dataset, the model, the window length against the train records, and whether the model fits the
GPUs. The output is built under a temporary name and renamed into place (:func:`genolc.fsutil.atomic_dir`), so a
failure or Ctrl-C leaves nothing half-written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from genolc.errors import ConfigError
from genolc.export import skyrl as skyrl_export
from genolc.export.config import DEFAULT_MODEL_PATH, ExportConfig
from genolc.fsutil import atomic_dir, atomic_write_bytes, atomic_write_json, check_output_dir, file_md5

EXPORT_KIND = "export directory"
MEGATRON_NAME = "megatron.json"


def resolve_model(config: ExportConfig, vocab_size: int) -> tuple[Any, str]:
    """``(ModelConfig, checkpoint path for the trainer)`` from --model (a preset or a checkpoint directory)."""
    from genolc.model.config import ModelConfig
    from genolc.model.presets import PRESETS, preset

    path = Path(config.model).expanduser()
    if path.is_dir():
        model = ModelConfig.from_hf(path)
        checkpoint = str(path.absolute()) if config.model_path == DEFAULT_MODEL_PATH else config.model_path
    elif config.model in PRESETS:
        if config.model == "glm-5.3-flash":
            model, checkpoint = preset(config.model), config.model_path
        else:
            if config.model_path == DEFAULT_MODEL_PATH:
                raise ConfigError(f"preset {config.model!r} has no published checkpoint for the trainer to load",
                                  where="--model",
                                  fix="give --model-path, a transformers-layout checkpoint of it (genolc convert "
                                      "RUN --out DIR --layout multimodal), or --model CHECKPOINT_DIR")
            model, checkpoint = preset(config.model, vocab_size=vocab_size), config.model_path
    else:
        raise ConfigError(f"--model {config.model!r} is neither a preset nor a checkpoint directory",
                          where="--model", fix=f"use one of {', '.join(PRESETS)}, or a transformers-layout "
                                               "checkpoint directory")
    if vocab_size > model.vocab_size:
        raise ConfigError(f"the export's tokenizer has {vocab_size} tokens but the model's vocabulary has "
                          f"{model.vocab_size}", where="--model/--text-tokenizer",
                          fix="use the checkpoint's own tokenizer (--text-tokenizer), or a checkpoint whose "
                              "vocabulary holds the genome tokenizer's ids")
    return model, checkpoint


def export(config: ExportConfig) -> dict[str, Any]:
    """Write the export described by ``config``; returns its manifest."""
    from genolc.data.dataset import PreparedDataset
    from genolc.data.sampler import TrainSampler
    from genolc.export.layout import choose_layout
    from genolc.export.megatron import provider_kwargs
    from genolc.export.rows import RowBuilder, TextTokenizer
    from genolc.export.skyrl_config import launch_command, sft_config, skyrl_run_dir, to_yaml

    if config.format == "skyrl":
        skyrl_export.parquet_schema()  # pyarrow missing: say so before any work
    out = check_output_dir(config.out, EXPORT_KIND)
    dataset = PreparedDataset(config.data)
    text = TextTokenizer(config.text_tokenizer) if config.text_tokenizer is not None else None
    sampler = TrainSampler(dataset, config.seq_len, seed=config.seed, max_n_fraction=config.max_n_fraction,
                           reverse_complement=config.reverse_complement)
    builder = RowBuilder(dataset, sampler, text)
    model, checkpoint = resolve_model(config, builder.vocab_size)
    layout = choose_layout(model, sampler.window_tokens, config.gpus, config.gpus_per_node, config.gpu_memory_gib,
                           config.max_context_parallel)
    parallel = layout.to_dict()
    if config.format == "skyrl" and config.windows < layout.data_parallel:
        raise ConfigError(f"--windows {config.windows} is fewer than one step's batch: the layout for {config.gpus} "
                          f"GPUs has {layout.data_parallel} data-parallel ranks, one window each a step",
                          where="--windows", fix=f"export at least {layout.data_parallel} windows")

    with atomic_dir(out, EXPORT_KIND) as tmp:
        lines: list[str] = []
        files: dict[str, str] = {"windows": skyrl_export.WINDOWS_NAME}
        progress = _progress(config)
        if config.format == "skyrl":
            (tmp / skyrl_export.DATA_DIR).mkdir()
            parquet = tmp / skyrl_export.DATA_DIR / skyrl_export.PARQUET_NAME
            counts = skyrl_export.write_rows(builder.rows(config.windows), parquet, sampler.window_tokens,
                                             on_row=lambda row: (lines.append(skyrl_export.window_line(row)),
                                                                 progress.update(1)))
            files["data"] = f"{skyrl_export.DATA_DIR}/{skyrl_export.PARQUET_NAME}"
            files["data_md5"] = file_md5(parquet)
            sft = sft_config(model_path=checkpoint, data_dir=out / skyrl_export.DATA_DIR,
                             seq_tokens=sampler.window_tokens, rows=counts["rows"], layout=layout,
                             nodes=config.nodes, gpus_per_node=config.gpus_on_each_node, seed=config.seed,
                             out=skyrl_run_dir(out))
            sft["run_name"] = f"genolc-{out.name}"
            header = (f"SkyRL {skyrl_export.SKYRL_VERSION} SFTConfig written by genolc export for {config.model} at "
                      f"{sampler.window_tokens} tokens a row on {config.gpus} GPUs of {config.gpu_memory_gib:g} GiB.\n"
                      f"Run: genolc finetune --backend skyrl --data {out}\n"
                      f"  or: {launch_command(sft)}")
            atomic_write_bytes(tmp / skyrl_export.CONFIG_NAME, to_yaml(sft, header).encode())
            files["skyrl_config"] = skyrl_export.CONFIG_NAME
        else:
            for row in builder.rows(config.windows):
                lines.append(skyrl_export.window_line(row))
                progress.update(1)
            counts = {"rows": len(lines), "tokens": 0, "loss_tokens": 0, "row_groups": 0}
            megatron = {
                "megatron_core": "0.16.1",
                "provider": provider_kwargs(model, sampler.window_tokens - 1, layout),
                "checkpoint": checkpoint,
                "dataset": {"class": "genolc.export.megatron.MegatronWindowDataset", "path": str(dataset.path),
                            "seq_len": config.seq_len, "length": config.windows, "seed": config.seed,
                            "max_n_fraction": config.max_n_fraction,
                            "reverse_complement": config.reverse_complement},
                "global_batch_size": layout.data_parallel,
                "micro_batch_size": 1,
            }
            atomic_write_json(tmp / MEGATRON_NAME, megatron)
            files["megatron"] = MEGATRON_NAME
        progress.close()
        skyrl_export.write_windows_tsv(tmp / skyrl_export.WINDOWS_NAME, lines)
        manifest = skyrl_export.export_manifest(config, dataset, builder, counts, files, parallel)
        manifest["model"] = {"name": config.model, "checkpoint": checkpoint, "vocab_size": model.vocab_size}
        atomic_write_json(tmp / skyrl_export.MANIFEST_NAME, manifest)
    return manifest


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(config: ExportConfig):
    if not config.progress:
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=config.windows, unit="window", desc="genolc export", file=sys.stderr, leave=False)


def summary_line(manifest: dict[str, Any], out: Path) -> str:
    p = manifest["parallel"]
    layout = (f"TP {p['tensor_parallel']}, PP {p['pipeline_parallel']}, CP {p['context_parallel']}, "
              f"EP {p['expert_parallel']}, "
              f"DP {p['data_parallel']}{', optimizer on CPU' if p['optimizer_offload'] else ''}; "
              f"{p['memory_gib']['total']:g} GiB/GPU by genolc's memory model")
    c = manifest["counts"]
    if manifest["format"] == "skyrl":
        return (f"genolc export: wrote {out}: {c['rows']} rows of {manifest['row_tokens']} tokens "
                f"({c['loss_tokens']:,} trained), SkyRL config for {layout}.")
    return f"genolc export: wrote {out}: Megatron-core arguments and {c['rows']} windows for {layout}."

