"""`genolc finetune`: parse options, build a TrainConfig, call genolc.train.loop.finetune in a claimed run directory."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import click

from genolc.config_defaults import config_default
from genolc.errors import ConfigError
from genolc.fsutil import output_dir
from genolc.train.config import DASHBOARDS, DEVICES, DTYPES, INDEXER_MODES, TrainConfig
from genolc.units import format_length, parse_length

RUN_KIND = "run directory"
# Run directories written before outputs carried genolc's marker: a training checkpoint or a finetune run record.
LEGACY_RUN = ("checkpoints/step-*/trainer_state.json", "runs/*_finetune.json")
_default = partial(config_default, TrainConfig)


def parse_chunk(text: str) -> int | None:
    """``--chunk``: 'auto' -> None, 'off' -> 0, else a length such as 64k."""
    word = text.strip().lower()
    if word == "auto":
        return None
    if word in ("off", "0"):
        return 0
    return parse_length(text, what="--chunk")


def _chunk_text(chunk: int | None) -> str:
    """``--chunk`` as typed for a TrainConfig.chunk: None -> 'auto', 0 -> 'off', else a length such as 64k."""
    return "auto" if chunk is None else "off" if chunk == 0 else format_length(chunk)


def _lengths(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    return tuple(parse_length(part, what="--seq-warmup length") for part in text.split(",") if part.strip())


@click.command("finetune")
@click.option("--data", "data", required=True, type=click.Path(path_type=Path), help="Prepared dataset (genolc prepare).")
@click.option("--seq", "seq", required=True, metavar="LENGTH",
              help="Input tokens per window, e.g. 512k (k = 1024).")
@click.option("--model", "model", default=None,
              help=f"Preset to train from scratch: tiny | small | base | glm-5.3-flash (default: {_default('model')}).")
@click.option("--init", "init", default=None, type=click.Path(path_type=Path),
              help="Start from a checkpoint: genolc's or a transformers-layout GLM-5.3-Flash (vocabulary resized), "
                   "or a finetune run directory: its newest checkpoint.")
@click.option("--out", "-o", "out", default=Path("finetune-out"), type=click.Path(path_type=Path), show_default=True,
              help="Run directory (new, empty or an earlier run's): checkpoints/, metrics.jsonl, summary.json, runs/.")
@click.option("--steps", default=_default("steps"), show_default=True, type=int, help="Optimizer steps.")
@click.option("--lr", default=_default("lr"), show_default=True, type=float, help="Peak learning rate.")
@click.option("--warmup", "warmup_steps", default=_default("warmup_steps"), show_default=True, type=int,
              help="Linear LR warm-up steps.")
@click.option("--min-lr-ratio", default=_default("min_lr_ratio"), show_default=True, type=float,
              help="Cosine floor as a fraction of --lr.")
@click.option("--weight-decay", default=_default("weight_decay"), show_default=True, type=float,
              help="AdamW weight decay.")
@click.option("--grad-clip", default=_default("grad_clip"), show_default=True, type=float,
              help="Max gradient norm (0: off).")
@click.option("--grad-accum", default=_default("grad_accum"), show_default=True, type=int,
              help="Micro-batches per optimizer step.")
@click.option("--micro-batch", default=_default("micro_batch"), show_default=True, type=int,
              help="Windows per micro-batch.")
@click.option("--seed", default=_default("seed"), show_default=True, type=int,
              help="Seed for the initial weights (with --model) and the training windows.")
@click.option("--seq-warmup", default=None, help="Shorter window lengths to train first, e.g. 128k,256k.")
@click.option("--seq-warmup-steps", default=_default("seq_warmup_steps"), show_default=True, type=int,
              help="Steps per --seq-warmup stage.")
@click.option("--softmask-weight", default=_default("softmask_weight"), show_default=True, type=float,
              help="Loss weight of soft-masked (repeat) targets; Evo 2 uses 0.1.")
@click.option("--moe-balance", "moe_balance_coef", default=_default("moe_balance_coef"), show_default=True, type=float,
              help="Weight of the MoE balancing loss.")
@click.option("--moe-bias-rate", "moe_bias_rate", default=_default("moe_bias_rate"), show_default=True, type=float,
              help="Aux-loss-free MoE balancing: router bias step per optimizer step (DeepSeek-V3: 1e-3; 0: off).")
@click.option("--indexer", default=_default("indexer"), show_default=True,
              type=click.Choice(INDEXER_MODES),
              help="DSA indexer KL training (from scratch: dense-then-sparse).")
@click.option("--indexer-dense-steps", default=_default("indexer_dense_steps"), show_default=True, type=int,
              help="With dense-then-sparse: dense warm-up steps.")
@click.option("--indexer-kl-coef", default=_default("indexer_kl_coef"), show_default=True, type=float,
              help="Weight of the indexer KL loss (with --indexer).")
@click.option("--max-n-fraction", default=_default("max_n_fraction"), show_default=True, type=float,
              help="Skip windows with more ambiguous (N) tokens than this.")
@click.option("--reverse-complement/--no-reverse-complement", default=_default("reverse_complement"), show_default=True,
              help="Train on the reverse-complement strand of half the windows.")
@click.option("--recompute/--no-recompute", default=_default("recompute"), show_default=True,
              help="Per-layer activation checkpointing.")
@click.option("--chunk", "chunk", default=_chunk_text(_default("chunk")), show_default=True, metavar="auto|off|LENGTH",
              help="Train each window in chunks of this many tokens with exact gradients (e.g. 64k), 'off' for the "
                   "whole window at once, or 'auto': whole when it fits the device, else the longest chunk that does.")
@click.option("--checkpoint-every", default=_default("checkpoint_every"), show_default=True, type=int,
              help="Save every N steps (0: end only).")
@click.option("--keep", "keep_checkpoints", default=_default("keep_checkpoints"), show_default=True, type=int,
              help="Checkpoints kept.")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in --out.")
@click.option("--device", default=_default("device"), show_default=True, type=click.Choice(DEVICES),
              help="Where to train (auto: CUDA when visible, else CPU).")
@click.option("--dtype", default=_default("dtype"), show_default=True, type=click.Choice(DTYPES),
              help="auto: bfloat16 autocast on CUDA, float32 on CPU.")
@click.option("--progress/--no-progress", default=_default("progress"), show_default=True,
              help="Show a progress bar on stderr.")
@click.option("--threads", default=_default("threads"), type=int, metavar="N",
              help="CPU threads for torch (default: $OMP_NUM_THREADS if set, else 1 with --deterministic, else the "
                   "cores free now: affinity mask and cgroup quota less current load).")
@click.option("--deterministic", is_flag=True,
              help="Bitwise-reproducible training: torch's deterministic algorithms and one CPU thread unless "
                   "--threads is given (runs with the same --threads agree). Kernels that are not deterministic (on "
                   "CUDA: DSA's backward, fla's KDA) are named when training starts; summary.json records the outcome.")
@click.option("--log", "log", multiple=True, type=click.Choice(DASHBOARDS),
              help="Also log each step to a dashboard (repeatable): tensorboard (out/tensorboard/; needs `pip install "
                   "tensorboard`) or wandb (offline, out/wandb/; needs `pip install wandb`). metrics.jsonl is always "
                   "written and stays the record.")
@click.option("--routing-group", "routing_group", default=_default("routing_group", format_length), show_default=True,
              metavar="N",
              help="Tokens per dispatch group for the MoE routing figures logged each step (capacity drop shares).")
def finetune_command(data: Path, seq: str, model: str | None, init: Path | None, seq_warmup: str | None,
                     chunk: str, routing_group: str, **options) -> None:
    """Fine-tune (or train from scratch) a genome language model on a prepared dataset.

    Prints the final checkpoint's directory.

    \b
    Example:
      genolc finetune --data data/hg38 --seq 512k --model small --steps 80 --out runs/hg38-512k
    """
    from genolc.train.loop import finetune
    from genolc.train.schedule import lr_at
    from genolc.train.state import resolve_checkpoint

    if model is not None and init is not None:
        raise ConfigError("--model and --init both given", fix="use --model for a fresh preset or --init CHECKPOINT")
    if init is not None:
        init = resolve_checkpoint(init, "--init")
    config = TrainConfig(data=data, seq_len=parse_length(seq, what="--seq"), model=model or TrainConfig.model,
                         init=init, seq_warmup=_lengths(seq_warmup), chunk=parse_chunk(chunk),
                         routing_group=parse_length(routing_group, what="--routing-group"), **options)
    if config.warmup_steps >= config.steps:
        click.echo(f"genolc: warning: --warmup {config.warmup_steps} >= --steps {config.steps}: every step is a "
                   f"warm-up step, so the learning rate only ramps up (to {lr_at(config.steps - 1, config):.3g} at "
                   f"the last step; --lr {config.lr:g}) and never decays", err=True)
    # --out is written step by step, not replaced whole: it must be new, empty or an earlier run's.
    with output_dir(config.out, RUN_KIND, legacy=LEGACY_RUN):
        final = finetune(config)
    click.echo(str(final))
