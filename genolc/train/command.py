"""`genolc finetune`: parse options, build a TrainConfig, call genolc.train.loop.finetune in a claimed run directory."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click

from genolc.errors import ConfigError
from genolc.fsutil import output_dir
from genolc.units import parse_length

RUN_KIND = "run directory"
# Run directories written before outputs carried genolc's marker: a training checkpoint or a finetune run record.
LEGACY_RUN = ("checkpoints/step-*/trainer_state.json", "runs/*_finetune.json")


def parse_chunk(text: str) -> int | None:
    """``--chunk``: 'auto' -> None, 'off' -> 0, else a length such as 64k."""
    word = text.strip().lower()
    if word == "auto":
        return None
    if word in ("off", "0"):
        return 0
    return parse_length(text, what="--chunk")


def _lengths(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    return tuple(parse_length(part, what="--seq-warmup length") for part in text.split(",") if part.strip())


@click.command("finetune")
@click.option("--data", "data", required=True, type=click.Path(path_type=Path), help="Prepared dataset (genolc prepare).")
@click.option("--seq", "seq", required=True, metavar="LENGTH",
              help="Input tokens per window, e.g. 512k (k = 1024).")
@click.option("--model", "model", default=None, help="Preset to train from scratch: tiny | small | base | glm-5.3-flash (default: tiny).")
@click.option("--init", "init", default=None, type=click.Path(path_type=Path),
              help="Start from a checkpoint: genolc's or a transformers-layout GLM-5.3-Flash (vocabulary resized), "
                   "or a finetune run directory: its newest checkpoint.")
@click.option("--out", "-o", "out", default=Path("finetune-out"), type=click.Path(path_type=Path), show_default=True,
              help="Run directory (new, empty or an earlier run's): checkpoints/, metrics.jsonl, summary.json, runs/.")
@click.option("--steps", default=80, show_default=True, type=int, help="Optimizer steps.")
@click.option("--lr", default=3e-4, show_default=True, type=float, help="Peak learning rate.")
@click.option("--warmup", "warmup_steps", default=10, show_default=True, type=int, help="Linear LR warm-up steps.")
@click.option("--min-lr-ratio", default=0.1, show_default=True, type=float, help="Cosine floor as a fraction of --lr.")
@click.option("--weight-decay", default=0.1, show_default=True, type=float, help="AdamW weight decay.")
@click.option("--grad-clip", default=1.0, show_default=True, type=float, help="Max gradient norm (0: off).")
@click.option("--grad-accum", default=1, show_default=True, type=int, help="Micro-batches per optimizer step.")
@click.option("--micro-batch", default=1, show_default=True, type=int, help="Windows per micro-batch.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed for the initial weights (with --model) and the training windows.")
@click.option("--seq-warmup", default=None, help="Shorter window lengths to train first, e.g. 128k,256k.")
@click.option("--seq-warmup-steps", default=0, show_default=True, type=int, help="Steps per --seq-warmup stage.")
@click.option("--softmask-weight", default=1.0, show_default=True, type=float,
              help="Loss weight of soft-masked (repeat) targets; Evo 2 uses 0.1.")
@click.option("--moe-balance", "moe_balance_coef", default=0.0, show_default=True, type=float,
              help="Weight of the MoE balancing loss.")
@click.option("--moe-bias-rate", "moe_bias_rate", default=1e-3, show_default=True, type=float,
              help="Aux-loss-free MoE balancing: router bias step per optimizer step (DeepSeek-V3: 1e-3; 0: off).")
@click.option("--indexer", default="off", show_default=True,
              type=click.Choice(["off", "dense", "sparse", "dense-then-sparse"]),
              help="DSA indexer KL training (from scratch: dense-then-sparse).")
@click.option("--indexer-dense-steps", default=0, show_default=True, type=int,
              help="With dense-then-sparse: dense warm-up steps.")
@click.option("--indexer-kl-coef", default=1.0, show_default=True, type=float,
              help="Weight of the indexer KL loss (with --indexer).")
@click.option("--max-n-fraction", default=0.1, show_default=True, type=float,
              help="Skip windows with more ambiguous (N) tokens than this.")
@click.option("--reverse-complement/--no-reverse-complement", default=False, show_default=True,
              help="Train on the reverse-complement strand of half the windows.")
@click.option("--recompute/--no-recompute", default=False, show_default=True, help="Per-layer activation checkpointing.")
@click.option("--chunk", "chunk", default="auto", show_default=True, metavar="auto|off|LENGTH",
              help="Train each window in chunks of this many tokens with exact gradients (e.g. 64k), 'off' for the "
                   "whole window at once, or 'auto': whole when it fits the device, else the longest chunk that does.")
@click.option("--checkpoint-every", default=0, show_default=True, type=int, help="Save every N steps (0: end only).")
@click.option("--keep", "keep_checkpoints", default=2, show_default=True, type=int, help="Checkpoints kept.")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in --out.")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]),
              help="Where to train (auto: CUDA when visible, else CPU).")
@click.option("--dtype", default="auto", show_default=True, type=click.Choice(["auto", "float32", "bfloat16"]),
              help="auto: bfloat16 autocast on CUDA, float32 on CPU.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar on stderr.")
@click.option("--threads", default=None, type=int, metavar="N",
              help="CPU threads for torch (default: $OMP_NUM_THREADS if set, else 1 with --deterministic, else the "
                   "cores free now: affinity mask and cgroup quota less current load).")
@click.option("--deterministic", is_flag=True,
              help="Bitwise-reproducible training: torch's deterministic algorithms and one CPU thread unless "
                   "--threads is given (runs with the same --threads agree). Kernels that are not deterministic (on "
                   "CUDA: DSA's backward, fla's KDA) are named when training starts; summary.json records the outcome.")
@click.option("--log", "log", multiple=True, type=click.Choice(["tensorboard", "wandb"]),
              help="Also log each step to a dashboard (repeatable): tensorboard (out/tensorboard/; needs `pip install "
                   "tensorboard`) or wandb (offline, out/wandb/; needs `pip install wandb`). metrics.jsonl is always "
                   "written and stays the record.")
@click.option("--routing-group", "routing_group", default="64k", show_default=True, metavar="N",
              help="Tokens per dispatch group for the MoE routing figures logged each step (capacity drop shares).")
@click.option("--cp", "cp", default=1, show_default=True, type=int, metavar="N",
              help="Context parallelism: split each window over N processes started by torchrun (data parallelism "
                   "over the rest: world size / N windows at a time). Gradients equal one process's.")
@click.option("--cp-layout", "cp_layout", default="zigzag", show_default=True,
              type=click.Choice(["zigzag", "contiguous"]),
              help="Which positions each --cp rank holds: zigzag (one early and one late piece each, balanced DSA "
                   "work) or contiguous (one piece each).")
def finetune_command(data: Path, seq: str, model: str | None, init: Path | None, seq_warmup: str | None,
                     chunk: str, routing_group: str, **options) -> None:
    """Fine-tune (or train from scratch) a genome language model on a prepared dataset.

    Prints the final checkpoint's directory.

    \b
    Example:
      genolc finetune --data data/hg38 --seq 512k --model small --steps 80 --out runs/hg38-512k
    \b
    Example (one window over 2 GPUs):
      torchrun --nproc-per-node 2 -m genolc.cli finetune --data data/hg38 --seq 1M --model small --cp 2
    """
    from genolc.train.config import TrainConfig
    from genolc.train.loop import finetune
    from genolc.train.schedule import lr_at
    from genolc.train.state import resolve_checkpoint

    if model is not None and init is not None:
        raise ConfigError("--model and --init both given", fix="use --model for a fresh preset or --init CHECKPOINT")
    if init is not None:
        init = resolve_checkpoint(init, "--init")
    config = TrainConfig(data=data, seq_len=parse_length(seq, what="--seq"), model=model or "tiny", init=init,
                         seq_warmup=_lengths(seq_warmup), chunk=parse_chunk(chunk),
                         routing_group=parse_length(routing_group, what="--routing-group"), **options)
    if config.warmup_steps >= config.steps:
        click.echo(f"genolc: warning: --warmup {config.warmup_steps} >= --steps {config.steps}: every step is a "
                   f"warm-up step, so the learning rate only ramps up (to {lr_at(config.steps - 1, config):.3g} at "
                   f"the last step; --lr {config.lr:g}) and never decays", err=True)
    # --out is written step by step, not replaced whole: it must be new, empty or an earlier run's. Under torchrun
    # only rank 0 claims and writes it (genolc.parallel.mesh).
    writes = os.environ.get("RANK", "0") == "0"
    with output_dir(config.out, RUN_KIND, legacy=LEGACY_RUN) if writes else contextlib.nullcontext():
        final = finetune(config)
    if writes:
        click.echo(str(final))
