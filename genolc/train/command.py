"""`genolc finetune`: parse options, build a TrainConfig, call genolc.train.loop.finetune in a claimed run directory."""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path

import click

from genolc.config_defaults import config_default, config_option
from genolc.errors import ConfigError
from genolc.fsutil import output_dir
from genolc.parallel.launch import alike_on_every_rank, writes_outputs
from genolc.train.config import (COMPILE_MODES, CP_KDA_MODES, CP_LAYOUTS, DASHBOARDS, DEVICES, DTYPES, INDEXER_MODES,
                                 STREAM_DTYPES, TrainConfig)
from genolc.units import format_length, parse_length

RUN_KIND = "run directory"
# Run directories written before outputs carried genolc's marker: a training checkpoint or a finetune run record.
LEGACY_RUN = ("checkpoints/step-*/trainer_state.json", "runs/*_finetune.json")
_option = partial(config_option, TrainConfig)


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
              help="Preset to train from scratch: tiny | mini | small | base | glm-5.3-flash "
                   f"(default: {TrainConfig.model}).")
@click.option("--init", "init", default=None, type=click.Path(path_type=Path),
              help="Start from a checkpoint: genolc's or a transformers-layout GLM-5.3-Flash (vocabulary resized), "
                   "or a finetune run directory: its newest checkpoint.")
@click.option("--out", "-o", "out", default=Path("finetune-out"), type=click.Path(path_type=Path), show_default=True,
              help="Run directory (new, empty or an earlier run's): checkpoints/, metrics.jsonl, summary.json, runs/.")
@_option("--steps", help="Optimizer steps.")
@_option("--lr", help="Peak learning rate.")
@_option("--warmup", "warmup_steps", help="Linear LR warm-up steps.")
@_option("--min-lr-ratio", help="Cosine floor as a fraction of --lr.")
@_option("--weight-decay", help="AdamW weight decay.")
@_option("--grad-clip", help="Max gradient norm (0: off).")
@_option("--grad-accum", help="Micro-batches per optimizer step.")
@_option("--micro-batch", help="Windows per micro-batch.")
@_option("--seed", help="Seed for the initial weights (with --model) and the training windows.")
@click.option("--seq-warmup", default=None, help="Shorter window lengths to train first, e.g. 128k,256k.")
@_option("--seq-warmup-steps", help="Steps per --seq-warmup stage.")
@_option("--softmask-weight", help="Loss weight of soft-masked (repeat) targets; Evo 2 uses 0.1.")
@_option("--moe-balance", "moe_balance_coef", help="Weight of the MoE balancing loss.")
@_option("--moe-bias-rate", "moe_bias_rate",
         help="Aux-loss-free MoE balancing: router bias step per optimizer step (DeepSeek-V3: 1e-3; 0: off).")
@_option("--indexer", type=click.Choice(INDEXER_MODES),
         help="DSA indexer KL training (from scratch: dense-then-sparse).")
@_option("--indexer-dense-steps", help="With dense-then-sparse: dense warm-up steps.")
@_option("--indexer-kl-coef", help="Weight of the indexer KL loss (with --indexer).")
@_option("--max-n-fraction", help="Skip windows with more ambiguous (N) tokens than this.")
@_option("--reverse-complement/--no-reverse-complement",
         help="Train on the reverse-complement strand of half the windows.")
@_option("--recompute/--no-recompute", help="Per-layer activation checkpointing.")
@_option("--compile", "compile", type=click.Choice(COMPILE_MODES),
         help="torch.compile the per-token glue (stream mixing, norms): auto = on CUDA. The first step of a new "
              "shape compiles; the result is kept in the user's cache directory (~/.cache/genolc/torchinductor).")
@_option("--chunk", "chunk", default=_chunk_text(config_default(TrainConfig, "chunk")), metavar="auto|off|LENGTH",
         help="Train each window in chunks of this many tokens with exact gradients (e.g. 64k), 'off' for the "
              "whole window at once, or 'auto': whole when it fits the device, else the longest chunk that does "
              "(on a GPU, 32k chunks with per-layer recompute rather than shorter ones, except 16k or longer chunks "
              "that fit with the first pass's DSA pools kept; `genolc plan` shows the choice).")
@_option("--checkpoint-every", help="Save every N steps (0: end only).")
@_option("--keep", "keep_checkpoints", help="Checkpoints kept.")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in --out.")
@_option("--device", type=click.Choice(DEVICES), help="Where to train (auto: CUDA when visible, else CPU).")
@_option("--dtype", type=click.Choice(DTYPES), help="auto: bfloat16 autocast on CUDA, float32 on CPU.")
@_option("--stream-dtype", type=click.Choice(STREAM_DTYPES),
         help="mHC's residual streams: bfloat16 (half the bytes of every pass over them, as a model held in bf16 "
              "runs them; needs bf16 autocast), float32 (the most exact), or auto: bfloat16 under bf16 autocast.")
@_option("--progress/--no-progress", help="Show a progress bar on stderr.")
@_option("--threads", type=int, metavar="N", show_default=False,
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
@click.option("--backend", default="genolc", show_default=True, type=click.Choice(["genolc", "skyrl"]),
              help="genolc: this trainer. skyrl: SkyRL 0.4.0's SFT entry point (Megatron) on a `genolc export "
                   "--format skyrl` directory given as --data; needs SkyRL installed here (Python 3.12).")
@_option("--routing-group", "routing_group", as_text=format_length, metavar="N",
         help="Tokens per dispatch group for the MoE routing figures logged each step (capacity drop shares).")
@_option("--cp", "cp", type=int, metavar="N",
         help="Context parallelism: split each window over N processes started by torchrun (data parallelism "
              "over the rest: world size / N windows at a time). Gradients equal one process's.")
@_option("--cp-layout", "cp_layout", type=click.Choice(CP_LAYOUTS),
         help="Which positions each --cp rank holds: zigzag (one early and one late piece each, balanced DSA "
              "work) or contiguous (one piece each).")
@_option("--cp-kda", "cp_kda", type=click.Choice(CP_KDA_MODES),
         help="How KDA layers run over the --cp ranks: state (each rank runs its own positions and passes boundary "
              "states; any --cp) or heads (an all-to-all gives each rank every position of the window for KDA "
              "heads / N heads; N must divide the heads). Same results; which is faster depends on the model and "
              "window (benchmarks/bench_context_parallel.py --cp-kda state,heads).")
@click.pass_context
def finetune_command(ctx: click.Context, data: Path, seq: str, model: str | None, init: Path | None,
                     seq_warmup: str | None, chunk: str, routing_group: str, backend: str, **options) -> None:
    """Fine-tune (or train from scratch) a genome language model on a prepared dataset.

    Prints the final checkpoint's directory.

    \b
    Example:
      genolc finetune --data data/hg38 --seq 512k --model small --steps 80 --out runs/hg38-512k
      genolc finetune --backend skyrl --data export/hg38-512k --seq 512k --out runs/hg38-skyrl

    \b
    Example (one window over 2 GPUs):
      torchrun --nproc-per-node 2 -m genolc.cli finetune --data data/hg38 --seq 1M --model small --cp 2
    """
    if backend == "skyrl":
        _finetune_with_skyrl(ctx, data, seq, init, options)
        return
    from genolc.train.loop import finetune
    from genolc.train.schedule import lr_at
    from genolc.train.state import resolve_checkpoint

    # Under torchrun every rank checks the options alike: rank 0 alone reports a bad one (genolc.parallel.launch).
    with alike_on_every_rank():
        if model is not None and init is not None:
            raise ConfigError("--model and --init both given",
                              fix="use --model for a fresh preset or --init CHECKPOINT")
        config = TrainConfig(data=data, seq_len=parse_length(seq, what="--seq"), model=model or TrainConfig.model,
                             init=init, seq_warmup=_lengths(seq_warmup), chunk=parse_chunk(chunk),
                             routing_group=parse_length(routing_group, what="--routing-group"), **options)
    if config.init is not None:
        # Outside: a checkpoint can be missing on one node only, and that rank must say so.
        config = config.replace(init=resolve_checkpoint(config.init, "--init"))
    writes = writes_outputs()
    if writes and config.warmup_steps >= config.steps:
        click.echo(f"genolc: warning: --warmup {config.warmup_steps} >= --steps {config.steps}: every step is a "
                   f"warm-up step, so the learning rate only ramps up (to {lr_at(config.steps - 1, config):.3g} at "
                   f"the last step; --lr {config.lr:g}) and never decays", err=True)
    # --out is written step by step, not replaced whole: it must be new, empty or an earlier run's. Under torchrun
    # only rank 0 claims and writes it (genolc.parallel.launch).
    with output_dir(config.out, RUN_KIND, legacy=LEGACY_RUN) if writes else contextlib.nullcontext():
        final = finetune(config)
    if writes:
        click.echo(str(final))


# Options --backend skyrl passes on to SkyRL's config; any other option given explicitly is refused, not ignored.
SKYRL_OPTIONS = ("steps", "lr", "warmup_steps", "weight_decay", "grad_clip", "seed")


def _finetune_with_skyrl(ctx: click.Context, data: Path, seq: str, init: Path | None, options: dict) -> None:
    from genolc.errors import GenolcError
    from genolc.export.skyrl import load_export_manifest
    from genolc.export.skyrl_config import config_for_run, require_skyrl, run_skyrl_sft, to_yaml

    require_skyrl()
    given = {name for name in ctx.params
             if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)}
    unsupported = sorted(given - set(SKYRL_OPTIONS) - {"data", "seq", "init", "out", "backend", "progress"})
    if unsupported:
        names = ", ".join("--" + name.replace("_", "-") for name in unsupported)
        raise ConfigError(f"{names} do(es) not apply to --backend skyrl", where="--backend skyrl",
                          fix="SkyRL takes the window, model and parallel layout from the export; set the rest in "
                              "its skyrl_sft.yaml")
    manifest = load_export_manifest(data)
    if manifest.get("seq_len") != parse_length(seq, what="--seq"):
        raise ConfigError(f"--seq {seq} differs from the export's {manifest.get('seq_len')} tokens", where=str(data),
                          fix="give the export's --seq, or export again at this length")
    overrides = {name: options[name] for name in SKYRL_OPTIONS if name in given}
    overrides["init"] = init
    out = options["out"]
    with output_dir(out, RUN_KIND, legacy=LEGACY_RUN) as run_dir:
        config = config_for_run(data, run_dir.absolute(), overrides)
        (run_dir / "skyrl_sft.yaml").write_text(to_yaml(config, f"SkyRL SFT config run by genolc finetune from {data}"))
        code = run_skyrl_sft(config)
        if code != 0:
            raise GenolcError(f"SkyRL's SFT run failed (exit code {code})", where=str(run_dir),
                              fix="see SkyRL's output above")
    click.echo(str(Path(out) / "hf"))
