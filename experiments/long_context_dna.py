"""Does genolc's model learn from long context on real human DNA? Pretrain short, finetune long, against a control.

How to run (from the repository root):

    # CPU, on the bundled sample (tiny preset; about 2-3 minutes on 2 shared cores; the test suite runs this):
    python experiments/long_context_dna.py --cpu --out results/cpu_long_context_dna

    # one H200 (<= 9 minutes with compile; see benchmarks/run_flagship.sh, which also unpacks the GPU packages):
    python experiments/long_context_dna.py --preset mini --jobs 2 --time-budget 540 --eval-tokens 1M \
        --train-fasta .gpudata/GRCh37_chrX_1-24000000.fa.gz --train-fasta .gpudata/hg38_chr2_1-2333275.fa.gz \
        --heldout-fasta .gpudata/GRCh37_chr22_20000001-21000000.fa.gz --heldout-fasta ...hg19_chr3/4/5, GRCh38 chr19 \
        --train chrX,chr2 --heldout chr22,chr3,chr4,chr5,chr19 --archive "$OUT/long_context_dna.tar.gz"

    # two H200s (nvidia-h200-x2): add --gpus 0,1 - arm A runs on GPU 0 while arm B runs on GPU 1, and the
    # evaluations are shared between the two.

What it runs, each step as genolc's own command in its own process (``python -m genolc.cli ...``):

1. ``genolc prepare`` of the training and held-out FASTA files into one dataset (``--train`` / ``--heldout`` name
   the records, as prepare takes them; the held-out records are never trained on).
2. pretrain: ``genolc finetune --model PRESET --seq SHORT`` from the preset's random initialisation: the stand-in
   for a pretrained genome LM, which cannot be downloaded here. Its last checkpoint is "base". ``--base CHECKPOINT``
   skips this phase and starts the arms from a model pretrained elsewhere (e.g. for hours with genolc finetune, on
   data without the held-out records, or the comparisons with base mean nothing); ``--preset`` then only names the
   training rates --time-budget plans with, and the summary records the checkpoint (``base_checkpoint``).
3. arm A: ``genolc finetune --init base --seq LONG`` (512k by default): one LONG window per optimizer step.
   arm B, the control: ``genolc finetune --init base --seq SHORT`` with LONG/SHORT windows per step
   (``--micro-batch M --grad-accum LONG/(SHORT*M)``), the same number of steps, learning rate and schedule. So both
   arms see the same tokens per optimizer step and in all; they differ only in how much of it is one window.
   The long-context effect is A's gain minus B's, per position bucket.
4. ``genolc eval --by-position heldout --seq LONG``: A against base (``--baseline``) with the context-truncation
   control on A (``--context K``: does A's gain at position p remain when only the last K tokens are visible?), and
   A against B; ``genolc eval --needle`` of base and A; ``genolc eval --routing`` of A (MoE expert load by context
   length).

Results land in ``--out`` (default ``results/<date>_long_context_dna``), written whole at the end or not at all:
summary.json (headline numbers: held-out loss change of A against base, per-bucket A-base and A-B with 95% block-
bootstrap CIs, truncation control, needle, routing, per-phase wall time and peak memory, git SHA, device), plan.json
(sizes, steps, learning rates and how they were chosen), commands.sh (the exact commands), phases.json, README.md,
plots/ (bits/base by position for base/A/B, the A-base and A-B deltas with CIs, the truncation control, the needle
curve), and per phase its metrics.jsonl / summary.json / eval CSVs and plots / run records and log. Checkpoints and
the dataset stay in a work directory that is removed at the end (``--keep-work`` keeps it). The folder is then
packed into one archive (``--archive``, default ``<out>.tar.gz``; small: no checkpoints, no per-target files).

Sizes. ``--cpu`` is the tiny preset on the bundled sample (hg38 chr2:1-600,000 trains, GRCh37
chr22:20,480,001-20,680,000 is held out) with SHORT 128 and LONG 1k. On a GPU, ``--time-budget SECONDS`` plans the
steps with a time model of the run (:func:`predict_seconds`, fitted to the H200 runs of ``mini``): it takes the
processes' start-ups and first steps, the compile allowance for cold kernel caches and the evaluations off the
budget and splits what is left between pretraining (40%) and the two arms, at the training rates measured on the
H200 (TRAIN_RATES); plan.json shows the arithmetic. ``--jobs 2`` on one GPU runs the arms (and then the
evaluations) side by side: their start-ups overlap, their device work does not. ``--pretrain-steps`` /
``--arm-steps`` set the steps directly.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from genolc.errors import ConfigError, GenolcError, InputError, RefusedOutputError  # noqa: E402
from genolc.eval.buckets import FEW_BLOCKS_FOR_CI  # noqa: E402
from genolc.fsutil import OUTPUT_MARKER, atomic_dir, atomic_write_bytes, atomic_write_json, check_output_dir  # noqa: E402
from genolc.units import format_length, parse_length  # noqa: E402

KIND = "long-context experiment directory"
NAME = "long_context_dna"

@dataclass(frozen=True)
class Rates:
    """Training tokens/s of one `genolc finetune` process alone on the device after its first step: ``short`` at
    SHORT (whole windows, --short-micro-batch of them per micro-batch), ``long`` at LONG (one window, chunked as
    --chunk auto chooses; measured at 512k: a shorter LONG runs faster, a longer one slower)."""

    short: float
    long: float
    source: str


# What --time-budget plans with, by (device, preset).
TRAIN_RATES = {
    ("cuda", "mini"): Rates(93_000.0, 57_000.0, "H200, 2026-12-01 (results/2026-12-01_long_context_dna*): 8k with 4 "
                                                "windows per micro-batch 92-94k, 512k in 128k chunks 57.0k"),
    ("cuda", "small"): Rates(24_000.0, 24_000.0, "H200: 512k in 32k chunks 24.3k (benchmarks/results/"
                                                 "long_context_2026-11-30.json); 8k not measured, taken as no faster"),
    ("cuda", "base"): Rates(6_400.0, 6_400.0, "H200: 1M with --chunk 32k --recompute 6.4k (README); 8k not "
                                              "measured, taken as no faster"),
    ("cpu", "tiny"): Rates(230.0, 230.0, "one thread on this project's 2-core CI machine while it was loaded"),
}
# Scoring (a forward, no autograd) against training (chunked: two forwards and a backward): the H200 runs of `mini`
# scored 11.5M held-out tokens in about 40 s of their evaluations' device time, 5x its 512k training rate.
EVAL_SPEEDUP = 5.0
# Seconds a process spends besides its steps or forwards; cuda from the H200 runs of `mini` on 2026-12-01 (caches
# warm), cpu from this project's CI machine. STARTUP: imports, model build, checkpoint load and save (9-13 s).
# FIRST_STEP: a training process's first step beyond a later one (kernel loading, autotune lookups, allocator
# warm-up: 13-27 s). EVAL: an eval process besides its forwards (start-up, first forward, bootstrap, plots: 26-34 s).
STARTUP_SECONDS = {"cuda": 12.0, "cpu": 15.0}
FIRST_STEP_SECONDS = {"cuda": 27.0, "cpu": 0.0}
EVAL_SECONDS = {"cuda": 28.0, "cpu": 10.0}
PREPARE_SECONDS = 10.0
# New kernel shapes: the first training process compiles and autotunes them. `mini` on a fresh H200 whose carried
# caches held `small`'s kernels: first step 83 s, against 23-27 s once its own were carried too (one TileLang kernel,
# 30 s, and fla autotuning); `small` and `base` compile three TileLang kernels and autotune more (about 2.5 minutes on
# a fresh H200, 2026-11-30). benchmarks/run_flagship.sh carries the TileLang cache and fla's autotune results
# (.gpu/), so --compile-seconds 0 once a run of the preset has filled them.
COMPILE_SECONDS = {("cuda", "mini"): 60.0, ("cuda", "small"): 150.0, ("cuda", "base"): 150.0}
PRETRAIN_SHARE = 0.4          # of the training time left by the budget; the arms share the rest
BUDGET_MARGIN = 0.9           # plan for 90% of --time-budget
EVAL_PROCESSES = 5            # a_vs_base, a_vs_b, needle_a, routing_a, needle_base


@dataclass(frozen=True)
class ExperimentConfig:
    """What the experiment runs. None means: chosen by the plan (:func:`make_plan`)."""

    out: Path
    archive: Path | None = None               # default: <out>.tar.gz
    work: Path | None = None                  # checkpoints and dataset; default: a temporary folder beside out
    keep_work: bool = False
    train_fastas: tuple[Path, ...] = ()
    heldout_fastas: tuple[Path, ...] = ()
    train_records: str = "all"                # genolc prepare --train
    heldout_records: str | None = None        # genolc prepare --heldout
    tokenizer: str = "char"
    preset: str = "small"
    device: str = "cuda"                      # cuda | cpu
    gpus: tuple[str, ...] = ()                # CUDA_VISIBLE_DEVICES per lane; () one lane on the visible GPU
    jobs: int = 1                             # processes at once (with --gpus: one per GPU)
    threads: int | None = None                # finetune/eval --threads
    short_seq: int = 8 * 1024
    long_seq: int = 512 * 1024
    pretrain_windows: int = 8                 # SHORT windows per pretraining step
    short_micro_batch: int = 4                # SHORT windows per micro-batch (arm B and pretraining)
    base: Path | None = None                  # a pretrained checkpoint: no pretraining phase, the arms start here
    pretrain_steps: int | None = None
    arm_steps: int | None = None
    pretrain_lr: float = 1e-3
    # The arms continue at the lr pretraining ends with (pretrain_lr cosine-decayed to a tenth): they start a fresh
    # AdamW, whose first steps move every weight by about lr. At 3e-4 (results/2026-12-01_long_context_dna_run1,
    # 40 pretraining steps) held-out loss rose 2.1% for A and 0.3% for B; at 1e-4 after 155-160 steps, 0.1-0.15%
    # and -0.04 to -0.07% (not a controlled comparison: pretraining differed too).
    arm_lr: float = 1e-4
    time_budget: float | None = None          # seconds for the whole experiment
    compile_seconds: float | None = None      # default COMPILE_SECONDS[(device, preset)]
    eval_tokens: int = 2 * 1024 * 1024        # held-out window tokens per --by-position evaluation
    context: int = 4 * 1024                   # truncation control: only the last K tokens visible
    context_block: int | None = None          # default K (visible K..2K, 2x cost); genolc's own default is K/4
    first_bucket: int = 1024
    bootstrap: int = 1000
    needle_seq: int | None = None             # default min(LONG, 128k)
    needle_trials: int = 2
    needle_bases: int = 256
    routing_lengths: tuple[int, ...] = ()     # default SHORT, LONG
    seed: int = 0
    progress: bool = False
    plan_only: bool = False                   # print the plan and the commands, run nothing

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ConfigError(f"unknown device {self.device!r}", where="--device", fix="choose cuda or cpu")
        for name in ("short_seq", "long_seq", "pretrain_windows", "short_micro_batch", "eval_tokens", "context",
                     "first_bucket", "bootstrap", "needle_trials", "needle_bases", "jobs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be positive, got {getattr(self, name)}",
                                  where=f"--{name.replace('_', '-')}")
        if self.compile_seconds is not None and self.compile_seconds < 0:
            raise ConfigError(f"compile-seconds must be 0 or more, got {self.compile_seconds}",
                              where="--compile-seconds")
        for name in ("pretrain_steps", "arm_steps", "time_budget", "threads", "needle_seq", "context_block"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name.replace('_', '-')} must be positive, got {value}",
                                  where=f"--{name.replace('_', '-')}")
        if self.long_seq <= self.short_seq or self.long_seq % self.short_seq:
            raise ConfigError(f"--long-seq {format_length(self.long_seq)} must be a multiple of --short-seq "
                              f"{format_length(self.short_seq)} and longer",
                              fix="e.g. --short-seq 8k --long-seq 512k: arm B then takes 64 short windows a step")
        ratio = self.long_seq // self.short_seq
        if ratio % self.short_micro_batch:
            raise ConfigError(f"--short-micro-batch {self.short_micro_batch} does not divide the "
                              f"{ratio} short windows arm B takes per step", where="--short-micro-batch",
                              fix=f"use a divisor of {ratio}")
        if self.pretrain_windows % self.short_micro_batch and self.short_micro_batch % self.pretrain_windows:
            raise ConfigError(f"--pretrain-windows {self.pretrain_windows} and --short-micro-batch "
                              f"{self.short_micro_batch}: one must divide the other", where="--pretrain-windows")
        if not self.context < self.long_seq:
            raise ConfigError(f"--context {format_length(self.context)} must be shorter than --long-seq",
                              where="--context")
        if not self.train_fastas:
            raise ConfigError("no training FASTA given", where="--train-fasta",
                              fix="name at least one --train-fasta, or use --sample (the bundled sample)")
        if not self.heldout_records:
            raise ConfigError("no held-out records named", where="--heldout",
                              fix="name the held-out records, e.g. --heldout chr22,chr19 (genolc prepare --heldout)")
        if self.gpus and self.device != "cuda":
            raise ConfigError("--gpus needs --device cuda", where="--gpus")
        if self.base is not None and self.pretrain_steps is not None:
            raise ConfigError("--pretrain-steps with --base: a given base checkpoint is not pretrained again",
                              where="--pretrain-steps", fix="drop --pretrain-steps, or drop --base to pretrain one")

    @property
    def lanes(self) -> int:
        return len(self.gpus) if self.gpus else self.jobs


@dataclass(frozen=True)
class RunSize:
    """One finetune: window length, windows per micro-batch, micro-batches per step, steps, peak lr, warm-up."""

    seq: int
    micro_batch: int
    grad_accum: int
    steps: int
    lr: float
    warmup: int

    @property
    def tokens_per_step(self) -> int:
        return self.seq * self.micro_batch * self.grad_accum


@dataclass(frozen=True)
class Plan:
    pretrain: RunSize | None              # None: --base gave the pretrained checkpoint
    arm_a: RunSize
    arm_b: RunSize
    eval_seq: int
    eval_max_windows: int
    context: int
    context_block: int
    needle_seq: int
    needle_distances: tuple[int, ...]     # () : genolc's default (1k, 2k, ... up to the window)
    routing_lengths: tuple[int, ...]
    how: tuple[str, ...]                  # how the sizes were chosen, in words and numbers


def genolc_presets() -> list[str]:
    """The model presets genolc knows (genolc/model/presets.py)."""
    from genolc.model.presets import PRESETS

    return list(PRESETS)


def warmup_steps(steps: int) -> int:
    return max(1, steps // 10)


def predict_seconds(config: ExperimentConfig, rates: Rates, *, eval_windows: int, needle_seq: int,
                    needle_distances: tuple[int, ...], routing_lengths: tuple[int, ...], pretrain_steps: int,
                    arm_steps: int) -> dict[str, Any]:
    """The experiment's wall time on its lanes (the time model --time-budget plans with): prepare, pretraining alone,
    the two arms, then five evaluations. Lanes with their own GPUs (--gpus) run side by side; lanes sharing one
    device (--jobs) overlap their processes' start-ups and first steps but not their device work (on the H200 two
    `mini` arms side by side each ran at half their alone rate). Returns the total and its parts."""
    device = config.device
    short, long_ = config.short_seq, config.long_seq
    lanes = max(1, config.lanes)
    own_devices = bool(config.gpus) and lanes > 1
    compile_s = (COMPILE_SECONDS.get((device, config.preset), 150.0 if device == "cuda" else 0.0)
                 if config.compile_seconds is None else config.compile_seconds)
    process = STARTUP_SECONDS[device] + FIRST_STEP_SECONDS[device]
    # With --base no pretraining runs, and the first arm meets the kernels first.
    pretrain = (0.0 if config.base is not None
                else process + compile_s + pretrain_steps * config.pretrain_windows * short / rates.short)
    arm_a = arm_steps * long_ / rates.long
    arm_b = arm_steps * long_ / rates.short
    if lanes == 1:
        arms, arms_how = 2 * process + arm_a + arm_b, "one after the other"
    elif own_devices:
        arms, arms_how = process + max(arm_a, arm_b), "side by side on their own GPUs"
    else:
        arms, arms_how = process + arm_a + arm_b, "side by side sharing one device"
    if config.base is not None:
        arms += compile_s
    context_block = config.context_block or config.context
    # A with base and the truncated A (visible K..K+block: (K + block) / block forwards), then A with B.
    by_position = eval_windows * (long_ + 1) * (2 + 2 + (context_block + config.context) / context_block)
    needle_count = len(needle_distances) or int(math.log2(max(2, needle_seq // 1024))) + 1
    needle = 2 * config.needle_trials * needle_seq * needle_count
    routing = len(routing_lengths) * routing_lengths[-1]
    forward = (by_position + needle + routing) / (rates.long * EVAL_SPEEDUP) / (lanes if own_devices else 1)
    evals = math.ceil(EVAL_PROCESSES / lanes) * EVAL_SECONDS[device] + forward
    total = PREPARE_SECONDS + pretrain + arms + evals
    why = (f"prepare {PREPARE_SECONDS:.0f} s, compile {compile_s:.0f} s, start-up and first step {process:.0f} s a "
           f"training process, evaluations {evals:.0f} s ({(by_position + needle + routing) / 1e6:.1f}M forward "
           f"tokens at {rates.long * EVAL_SPEEDUP:,.0f} tokens/s, {EVAL_SECONDS[device]:.0f} s a process, "
           f"{lanes} lane(s))")
    return {"total": total, "pretrain": pretrain, "arms": arms, "evals": evals, "why": why, "arms_how": arms_how}


def _fit_steps(config: ExperimentConfig, rates: Rates, how: list[str], pretrain_steps: int | None,
               arm_steps: int | None, seconds) -> tuple[int, int]:
    """Steps for --time-budget: the time model is linear in both step counts, so what is left of 90% of the budget
    besides the steps goes 40/60 to pretraining and the arms, or wholly to the count not given; given counts are
    kept, and refused when the model says they overrun the budget."""
    short, long_ = config.short_seq, config.long_seq
    fixed = seconds(0, 0)
    per_pretrain_step = seconds(1, 0)["total"] - fixed["total"]
    per_arm_step = seconds(0, 1)["total"] - fixed["total"]
    train_s = config.time_budget * BUDGET_MARGIN - fixed["total"]
    how.append(f"--time-budget {config.time_budget:.0f} s x {BUDGET_MARGIN} margin - {fixed['total']:.0f} s "
               f"besides training steps ({fixed['why']}) = {train_s:.0f} s of training at {rates.short:,.0f} "
               f"tokens/s at {format_length(short)} and {rates.long:,.0f} at {format_length(long_)} "
               f"({config.device}/{config.preset}, TRAIN_RATES: {rates.source})")
    pretrain_what = f"steps of {config.pretrain_windows} x {format_length(short)} at {per_pretrain_step:.2f} s"
    arm_what = f"steps at {per_arm_step:.1f} s a step of both arms ({fixed['arms_how']})"
    if config.base is not None:
        pretrain_steps = 0
        if arm_steps is None:
            arm_steps = math.floor(train_s / per_arm_step)
            how.append(f"no pretraining (--base); the arms get it all: {arm_steps} {arm_what}")
        else:
            how.append(f"no pretraining (--base); the arms' {arm_steps} {arm_what} (--arm-steps)")
    elif pretrain_steps is None and arm_steps is None:
        pretrain_steps = math.floor(train_s * PRETRAIN_SHARE / per_pretrain_step)
        arm_steps = math.floor(train_s * (1 - PRETRAIN_SHARE) / per_arm_step)
        how.append(f"pretraining gets {PRETRAIN_SHARE:.0%}: {pretrain_steps} {pretrain_what}; the arms "
                   f"{1 - PRETRAIN_SHARE:.0%}: {arm_steps} {arm_what}")
    elif pretrain_steps is None:
        pretrain_steps = math.floor((train_s - arm_steps * per_arm_step) / per_pretrain_step)
        how.append(f"the arms' {arm_steps} {arm_what} (--arm-steps); pretraining gets the rest: {pretrain_steps} "
                   f"{pretrain_what}")
    elif arm_steps is None:
        arm_steps = math.floor((train_s - pretrain_steps * per_pretrain_step) / per_arm_step)
        how.append(f"pretraining's {pretrain_steps} {pretrain_what} (--pretrain-steps); the arms get the rest: "
                   f"{arm_steps} {arm_what}")
    if (pretrain_steps < 1 and config.base is None) or arm_steps < 1:
        raise ConfigError(f"--time-budget {config.time_budget:.0f} s leaves {max(train_s, 0):.0f} s to train: "
                          f"{max(pretrain_steps, 0)} pretraining and {max(arm_steps, 0)} arm steps (besides the "
                          f"steps: {fixed['why']})", where="--time-budget",
                          fix="raise --time-budget, or make the run cheaper: --jobs 2 (or --gpus 0,1), a faster "
                              "--preset (mini), a shorter --long-seq, a lower --eval-tokens, --compile-seconds 0 "
                              "when the kernel caches are warm")
    predicted = seconds(pretrain_steps, arm_steps)["total"]
    if predicted > config.time_budget:
        raise ConfigError(f"{pretrain_steps} pretraining and {arm_steps} arm steps are predicted to take "
                          f"{predicted:.0f} s, over the --time-budget of {config.time_budget:.0f} s",
                          where="--pretrain-steps / --arm-steps",
                          fix="give fewer steps, leave one count to the plan, or raise --time-budget")
    how.append(f"predicted wall time {predicted:.0f} s of the {config.time_budget:.0f} s budget")
    return pretrain_steps, arm_steps


def make_plan(config: ExperimentConfig) -> Plan:
    """Sizes, steps and learning rates: given ones kept, the rest fitted to --time-budget (module docstring)."""
    if config.preset not in genolc_presets():
        raise ConfigError(f"unknown model preset {config.preset!r}", where="--preset",
                          fix=f"use one of {', '.join(genolc_presets())}")
    short, long_ = config.short_seq, config.long_seq
    ratio = long_ // short
    how = [f"arm A: one {format_length(long_)} window per step; arm B: {ratio} windows of {format_length(short)} "
           f"per step ({config.short_micro_batch} per micro-batch x {ratio // config.short_micro_batch} "
           f"accumulated), so both see {format_length(long_)} tokens a step and the same steps"]
    context_block = config.context_block or config.context
    eval_windows = max(1, config.eval_tokens // long_)
    needle_seq = config.needle_seq or min(long_, 128 * 1024)
    if needle_seq >= 2 * 1024:
        distances: tuple[int, ...] = ()
    else:
        segment = config.needle_bases  # char-level upper bound on the segment's tokens
        largest = needle_seq - segment - 1
        if largest < segment:
            raise ConfigError(f"a {needle_seq}-token needle window cannot hold two {segment}-base copies",
                              where="--needle-bases", fix="use a shorter --needle-bases or a longer --needle-seq")
        distances = tuple(sorted({d for d in (2 * segment * 4 ** i for i in range(8)) if d < largest} | {largest}))
    routing = tuple(sorted(set(config.routing_lengths or (short, long_))))
    pretrain_steps, arm_steps = config.pretrain_steps, config.arm_steps
    if ((pretrain_steps is None and config.base is None) or arm_steps is None) and config.time_budget is None:
        raise ConfigError("no steps and no time budget given", where="--time-budget",
                          fix="give --time-budget SECONDS, or --pretrain-steps (none with --base) and --arm-steps")
    if config.time_budget is not None:
        rates = TRAIN_RATES.get((config.device, config.preset))
        if rates is None:
            raise ConfigError(f"no measured training rate for preset {config.preset!r} on {config.device}, so "
                              "--time-budget cannot plan or check the steps", where="--time-budget",
                              fix="give --pretrain-steps and --arm-steps without --time-budget")
        pretrain_steps, arm_steps = _fit_steps(config, rates, how, pretrain_steps, arm_steps, seconds=lambda pre, arm:
                                               predict_seconds(config, rates, eval_windows=eval_windows,
                                                               needle_seq=needle_seq, needle_distances=distances,
                                                               routing_lengths=routing, pretrain_steps=pre,
                                                               arm_steps=arm))
    micro = min(config.short_micro_batch, config.pretrain_windows)
    pretrain = None if config.base is not None else RunSize(
        seq=short, micro_batch=micro, grad_accum=config.pretrain_windows // micro, steps=pretrain_steps,
        lr=config.pretrain_lr, warmup=warmup_steps(pretrain_steps))
    arm_a = RunSize(seq=long_, micro_batch=1, grad_accum=1, steps=arm_steps, lr=config.arm_lr,
                    warmup=warmup_steps(arm_steps))
    arm_b = replace(arm_a, seq=short, micro_batch=config.short_micro_batch,
                    grad_accum=ratio // config.short_micro_batch)
    start = (f"learning rates: pretraining {config.pretrain_lr:g} (from scratch), arms" if config.base is None
             else f"base: {config.base} (--base, not pretrained here); learning rate of the arms")
    how.append(f"{start} {config.arm_lr:g} (continuing), linear warm-up over a tenth of the steps, cosine to a tenth")
    return Plan(pretrain=pretrain, arm_a=arm_a, arm_b=arm_b, eval_seq=long_, eval_max_windows=eval_windows,
                context=config.context, context_block=context_block, needle_seq=needle_seq,
                needle_distances=distances, routing_lengths=routing, how=tuple(how))


# Runs genolc's CLI and, at exit, prints the CUDA allocator's peak (eval reports none of its own).
PROBE = ("import atexit, runpy, sys\n"
         "def _peak():\n"
         "    torch = sys.modules.get('torch')\n"
         "    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():\n"
         "        print('PEAK_GPU_GIB', torch.cuda.max_memory_allocated() / 2**30, flush=True)\n"
         "atexit.register(_peak)\n"
         "sys.argv = ['genolc', *sys.argv[1:]]\n"
         "runpy.run_module('genolc.cli', run_name='__main__')\n")


@dataclass
class Phase:
    name: str
    args: list[str]                      # genolc's arguments, after "genolc"
    out: Path                            # the command's output directory
    after: tuple[str, ...] = ()
    uses_torch: bool = True
    work: Path | None = None             # the temporary work folder, written "$WORK" in shown commands
    result: dict[str, Any] = field(default_factory=dict)

    def command(self) -> str:
        """The command as a shell line, paths in the work folder written "$WORK/..." (it is temporary)."""
        words = ["genolc", *(shlex.quote(a) for a in self.args)]
        if self.work is not None:
            work = str(self.work)
            words = [w.replace(work, "$WORK", 1) if w.startswith(work) else w for w in words]
            words = [f'"{w}"' if w.startswith("$WORK") else w for w in words]
        return " ".join(words)


def run_phase(phase: Phase, log: Path, gpu: str | None, stop: threading.Event,
              children: dict[str, subprocess.Popen]) -> None:
    """Run one phase to completion, recording exit code, wall time, peak host RSS and peak GPU memory."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    argv = ([sys.executable, "-c", PROBE, *phase.args] if phase.uses_torch
            else [sys.executable, "-m", "genolc.cli", *phase.args])
    start = time.monotonic()
    with open(log, "w") as sink:
        sink.write(f"$ {phase.command()}\n")
        sink.flush()
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=os.getcwd())
        children[phase.name] = proc
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if stop.is_set():
                # Its output is discarded with the work folder: no need to let it save a checkpoint first.
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        children.pop(phase.name, None)
    text = log.read_text(errors="replace")
    peaks = [line.split()[1] for line in text.splitlines() if line.startswith("PEAK_GPU_GIB ")]
    phase.result = {"exit_code": proc.returncode, "wall_seconds": round(time.monotonic() - start, 1),
                    "peak_host_rss_gib": round(usage.ru_maxrss * 1024 / 2 ** 30, 3),
                    "peak_gpu_gib": round(float(peaks[-1]), 3) if peaks else None,
                    "gpu": gpu, "command": phase.command()}


def run_phases(phases: list[Phase], logs: Path, config: ExperimentConfig) -> None:
    """Run phases on config.lanes lanes, each as soon as the phases it needs have finished, in list order (the
    list puts the longest chain first). The first failure stops the others and raises with its command's message."""
    lanes: list[str | None] = list(config.gpus) if config.gpus else [None] * config.lanes
    free = list(range(len(lanes)))
    pending = {p.name: p for p in phases}
    done: set[str] = set()
    running: dict[str, tuple[threading.Thread, int]] = {}
    stop = threading.Event()
    children: dict[str, subprocess.Popen] = {}
    failed: Phase | None = None
    try:
        while pending or running:
            for name, (thread, lane) in list(running.items()):
                if not thread.is_alive():
                    running.pop(name)
                    free.append(lane)
                    phase = next(p for p in phases if p.name == name)
                    if phase.result.get("exit_code") != 0 and failed is None:
                        failed = phase
                        stop.set()
                    done.add(name)
                    _say(f"{name} finished in {phase.result.get('wall_seconds')} s "
                         f"(exit {phase.result.get('exit_code')})")
            if failed is not None:
                if not running:
                    break
                time.sleep(0.2)
                continue
            ready = [p for p in pending.values() if set(p.after) <= done]
            while ready and free:
                phase = ready.pop(0)
                lane = free.pop(0)
                pending.pop(phase.name)
                gpu = lanes[lane]
                _say(f"{phase.name} starts{f' on GPU {gpu}' if gpu is not None else ''}: {phase.command()}")
                thread = threading.Thread(target=run_phase, args=(phase, logs / f"{phase.name}.log", gpu, stop,
                                                                   children), daemon=True)
                thread.start()
                running[phase.name] = (thread, lane)
            time.sleep(0.2)
    except BaseException:
        stop.set()
        for thread, _ in running.values():
            thread.join()
        raise
    if failed is not None:
        raise PhaseFailed(failed, logs / f"{failed.name}.log")


class PhaseFailed(Exception):
    def __init__(self, phase: Phase, log: Path):
        self.phase = phase
        text = log.read_text(errors="replace") if log.exists() else ""
        errors = [line for line in text.splitlines() if line.startswith("genolc: error:")]
        self.user_error = bool(errors)
        self.message = (f"the {phase.name} phase failed (exit {phase.result.get('exit_code')}): "
                        + (errors[-1].removeprefix("genolc: error: ") if errors else "see its output above")
                        + f"\n  command: {phase.command()}")
        super().__init__(self.message)


def build_phases(config: ExperimentConfig, plan: Plan, work: Path) -> list[Phase]:
    data, checkpoints = work / "data", work / "runs"
    how_to_run = ["--device", config.device]
    if not config.progress:
        how_to_run.append("--no-progress")
    if config.threads is not None:
        how_to_run += ["--threads", str(config.threads)]
    # eval --routing draws nothing at random, so it takes no --seed (and refuses one).
    common = ["--seed", str(config.seed), *how_to_run]

    def finetune(size: RunSize, out: Path, start: list[str]) -> list[str]:
        # Eager: the time model (TRAIN_RATES, FIRST_STEP_SECONDS) was fitted to eager runs, and torch.compile's
        # 20-30 s a process on an empty cache (its cache is not carried between device calls) is not in it.
        return ["finetune", "--data", str(data), "--seq", str(size.seq), *start, "--steps", str(size.steps),
                "--lr", f"{size.lr:g}", "--warmup", str(size.warmup), "--micro-batch", str(size.micro_batch),
                "--grad-accum", str(size.grad_accum), "--compile", "off", "--out", str(out), *common]

    base = config.base.absolute() if config.base is not None else checkpoints / "pretrain"
    pretrained = "prepare" if config.base is not None else "pretrain"
    arm_a, arm_b = checkpoints / "arm_a", checkpoints / "arm_b"
    evals = work / "evals"
    by_position = ["--seq", str(plan.eval_seq), "--max-windows", str(plan.eval_max_windows), "--first-bucket",
                   str(config.first_bucket), "--bootstrap", str(config.bootstrap), *common]
    needle = ["--seq", str(plan.needle_seq), "--needle-trials", str(config.needle_trials), "--needle-bases",
              str(config.needle_bases), *[a for d in plan.needle_distances for a in ("--needle-distance", str(d))],
              *common]
    fasta = [str(p) for p in (*config.train_fastas, *config.heldout_fastas)]
    phases = [
        Phase("prepare", ["prepare", *fasta, "--out", str(data), "--train", config.train_records, "--heldout",
                          config.heldout_records, "--tokenizer", config.tokenizer, "--no-progress"],
              data, uses_torch=False),
        *([] if plan.pretrain is None else
          [Phase("pretrain", finetune(plan.pretrain, base, ["--model", config.preset]), base, ("prepare",))]),
        Phase("arm_a", finetune(plan.arm_a, arm_a, ["--init", str(base)]), arm_a, (pretrained,)),
        Phase("arm_b", finetune(plan.arm_b, arm_b, ["--init", str(base)]), arm_b, (pretrained,)),
        Phase("eval_a_vs_base", ["eval", "--by-position", "heldout", "--data", str(data), "--checkpoint", str(arm_a),
                                 "--baseline", str(base), "--context", str(plan.context), "--context-block",
                                 str(plan.context_block), "--out", str(evals / "a_vs_base"), *by_position],
              evals / "a_vs_base", ("arm_a",)),
        Phase("eval_a_vs_b", ["eval", "--by-position", "heldout", "--data", str(data), "--checkpoint", str(arm_a),
                              "--baseline", str(arm_b), "--out", str(evals / "a_vs_b"), *by_position],
              evals / "a_vs_b", ("arm_a", "arm_b")),
        Phase("needle_a", ["eval", "--needle", "heldout", "--data", str(data), "--checkpoint", str(arm_a),
                           "--out", str(evals / "needle_a"), *needle], evals / "needle_a", ("arm_a",)),
        Phase("routing_a", ["eval", "--routing", "heldout", "--data", str(data), "--checkpoint", str(arm_a),
                            "--seq", ",".join(str(n) for n in plan.routing_lengths), "--max-tokens",
                            str(plan.routing_lengths[-1]), *how_to_run, "--out", str(evals / "routing_a")],
              evals / "routing_a", ("arm_a",)),
        Phase("needle_base", ["eval", "--needle", "heldout", "--data", str(data), "--checkpoint", str(base),
                              "--out", str(evals / "needle_base"), *needle], evals / "needle_base", (pretrained,)),
    ]
    for phase in phases:
        phase.work = work
    return phases


EVAL_FILES = ("summary.json", "buckets.csv", "comparisons.csv", "windows.csv", "blocks.csv", "by_position.png",
              "needle.csv", "needle_summary.csv", "needle.png", "routing.json", "routing.csv", "routing_load.png")
TRAIN_FILES = ("metrics.jsonl", "summary.json")
LOG_BYTES = 200_000


def collect(phases: list[Phase], results: Path, logs: Path) -> None:
    for phase in phases:
        target = results / phase.name
        target.mkdir(parents=True, exist_ok=True)
        names = TRAIN_FILES if phase.args[0] == "finetune" else EVAL_FILES if phase.args[0] == "eval" else ()
        for name in names:
            if (phase.out / name).is_file():
                shutil.copy2(phase.out / name, target / name)
        if phase.args[0] == "prepare":
            shutil.copy2(phase.out / "manifest.json", target / "manifest.json")
        for record in sorted((phase.out / "runs").glob("*.json")):
            shutil.copy2(record, target / f"run_record_{record.name}")
        text = (logs / f"{phase.name}.log").read_bytes()
        (target / "log.txt").write_bytes(text if len(text) <= LOG_BYTES else
                                         b"[first part cut]\n" + text[-LOG_BYTES:])


def _rows(summary: dict, key: str, name: str, field_name: str) -> dict[str, dict]:
    return {row["bucket"]: row for row in summary[key] if row[field_name] == name and row["subset"] == "all"}


def _delta(row: dict | None) -> dict | None:
    if row is None:
        return None
    return {"delta_bits_per_base": row["delta_bits_per_base"], "ci_low": row["ci_low"], "ci_high": row["ci_high"]}


def headline(results: Path, plan: Plan) -> dict[str, Any]:
    """The numbers the experiment is for, read from the evaluations' own summary.json files."""
    a_base = json.loads((results / "eval_a_vs_base" / "summary.json").read_text())
    a_b = json.loads((results / "eval_a_vs_b" / "summary.json").read_text())
    context = f"context:{plan.context}"
    model_rows = _rows(a_base, "bucket_stats", "model", "series")
    base_rows = _rows(a_base, "bucket_stats", "baseline", "series")
    b_rows = _rows(a_b, "bucket_stats", "baseline", "series")
    trunc_rows = _rows(a_base, "bucket_stats", context, "series")
    d_base = _rows(a_base, "comparisons", "model - baseline", "comparison")
    d_trunc = _rows(a_base, "comparisons", f"{context} - model", "comparison")
    d_b = _rows(a_b, "comparisons", "model - baseline", "comparison")
    with open(results / "eval_a_vs_base" / "windows.csv", newline="") as table:
        windows = list(csv.DictReader(table))
    buckets = []
    for label, row in model_rows.items():
        a = row["bits_per_base"]
        base = base_rows[label]["bits_per_base"]
        b = b_rows[label]["bits_per_base"]
        buckets.append({"bucket": label, "lo": row["lo"], "hi": row["hi"], "tokens": row["tokens"],
                        "base_bits_per_base": base, "a_bits_per_base": a, "b_bits_per_base": b,
                        "a_truncated_bits_per_base": trunc_rows[label]["bits_per_base"] if label in trunc_rows
                        else None,
                        "a_minus_base": _delta(d_base.get(label)), "a_minus_b": _delta(d_b.get(label)),
                        "truncated_minus_a": _delta(d_trunc.get(label)),
                        "b_minus_base": (b - base if b is not None and base is not None else None),
                        "ci_blocks": row["blocks"]})
    overall_a, overall_base = a_base["overall"]["model/all"], a_base["overall"]["baseline/all"]
    overall_b = a_b["overall"]["baseline/all"]
    loss = {
        "unit": "bits per base on the held-out records (eval --by-position, all positions)",
        "base": overall_base, "a": overall_a, "b": overall_b,
        "a_minus_base": d_base["all"]["delta_bits_per_base"],
        "a_minus_base_ci": [d_base["all"]["ci_low"], d_base["all"]["ci_high"]],
        "a_change_percent": 100.0 * (overall_a - overall_base) / overall_base,
        "b_change_percent": 100.0 * (overall_b - overall_base) / overall_base,
        "a_minus_b": d_b["all"]["delta_bits_per_base"],
        "a_minus_b_ci": [d_b["all"]["ci_low"], d_b["all"]["ci_high"]],
        "public_figure": "-4.8% held-out chr22 loss after 80 steps at 512k (no control)",
    }
    needle = {}
    for name in ("needle_base", "needle_a"):
        summary = json.loads((results / name / "summary.json").read_text())
        needle[name.removeprefix("needle_")] = [
            {k: row[k] for k in ("distance", "trials", "first_bits_per_base", "second_bits_per_base",
                                 "delta_bits_per_base", "delta_ci_low", "delta_ci_high")}
            for row in summary["per_distance"]]
    routing = json.loads((results / "routing_a" / "routing.json").read_text())["routing"]
    busiest = {length: max(layer["busiest_over_mean"] for layer in layers.values())
               for length, layers in routing.items()}
    return {"heldout_loss": loss, "buckets": buckets, "needle": needle,
            "routing_busiest_over_mean_by_length": busiest,
            "eval_windows": {"a_vs_base": a_base["windows"], "a_vs_b": a_b["windows"]},
            "scored_windows": [f"{w['chrom']}:{int(w['chrom_start']):,}-{int(w['chrom_end']):,}" for w in windows],
            "records": a_base["records"]}


def make_plots(results: Path, head: dict[str, Any], plan: Plan) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = results / "plots"
    plots.mkdir(exist_ok=True)
    rows = [r for r in head["buckets"] if r["bucket"] != "all"]
    # Each bucket at its geometric middle; the first, [0, e), at that of [e/2, e).
    x = [math.sqrt(max(r["lo"], r["hi"] / 2) * r["hi"]) for r in rows]
    labels = [r["bucket"] for r in rows]

    def axis(ax, ylabel: str) -> None:
        ax.set_xscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("position in the window (tokens before the target)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)

    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    base_name = "base (pretrained at short context)" if plan.pretrain is not None else "base (the --base checkpoint)"
    for key, name, style in (("base_bits_per_base", base_name, "o-"),
                             ("a_bits_per_base", "A (continued at long context)", "s-"),
                             ("b_bits_per_base", "B (continued at short context)", "^--")):
        ax.plot(x, [r[key] for r in rows], style, label=name, markersize=4)
    axis(ax, "held-out bits per base")
    ax.set_title("Held-out loss by context position")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plots / "bits_by_position.png", dpi=110)
    plt.close(fig)
    written.append("plots/bits_by_position.png")

    def delta_series(ax, key: str, name: str, style: str, shift: float) -> None:
        points = [(xi * shift, r[key]) for xi, r in zip(x, rows) if r[key] is not None]
        xs = [p[0] for p in points]
        ys = [p[1]["delta_bits_per_base"] for p in points]
        low = [y - (p[1]["ci_low"] if p[1]["ci_low"] is not None else y) for y, p in zip(ys, points)]
        high = [(p[1]["ci_high"] if p[1]["ci_high"] is not None else y) - y for y, p in zip(ys, points)]
        ax.errorbar(xs, ys, yerr=[low, high], fmt=style, capsize=3, markersize=4, label=name)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    delta_series(ax, "a_minus_base", "A - base", "s-", 0.97)
    delta_series(ax, "a_minus_b", "A - B (the long-context effect)", "o-", 1.03)
    ax.axhline(0, color="grey", lw=0.8)
    axis(ax, "difference in bits per base (95% block-bootstrap CI)")
    ax.set_title("Paired differences by context position (below 0: A better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plots / "deltas_by_position.png", dpi=110)
    plt.close(fig)
    written.append("plots/deltas_by_position.png")

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    top.plot(x, [r["a_bits_per_base"] for r in rows], "s-", markersize=4, label="A, whole window visible")
    top.plot(x, [r["a_truncated_bits_per_base"] for r in rows], "x--", markersize=5,
             label=f"A, only the last {format_length(plan.context)} tokens visible")
    top.plot(x, [r["base_bits_per_base"] for r in rows], "o:", markersize=3, label="base, whole window", alpha=0.7)
    top.set_ylabel("held-out bits per base")
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    top.set_title("Context-truncation control on A")
    delta_series(bottom, "truncated_minus_a", f"A truncated to {format_length(plan.context)} - A", "x-", 1.0)
    bottom.axhline(0, color="grey", lw=0.8)
    axis(bottom, "difference (95% CI)")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plots / "truncation_control.png", dpi=110)
    plt.close(fig)
    written.append("plots/truncation_control.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, style in (("base", "o-"), ("a", "s-")):
        rows_n = head["needle"][name]
        ax.plot([r["distance"] for r in rows_n], [r["second_bits_per_base"] for r in rows_n], style, markersize=4,
                label=f"{'base' if name == 'base' else 'A'}: second copy")
        ax.plot([r["distance"] for r in rows_n], [r["first_bits_per_base"] for r in rows_n], style[0] + ":",
                markersize=3, alpha=0.6, label=f"{'base' if name == 'base' else 'A'}: first copy")
    ax.axhline(2.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("distance between the copies (tokens)")
    ax.set_ylabel("bits per base of the copy (2 = no copying)")
    ax.set_title("Needle: a random segment planted twice")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plots / "needle.png", dpi=110)
    plt.close(fig)
    written.append("plots/needle.png")
    return written


def provenance(results: Path, config: ExperimentConfig) -> dict[str, Any]:
    """git SHA and device from the run records genolc wrote (the same for every phase of one run)."""
    record = {}
    for path in sorted((results / "arm_a").glob("run_record_*.json")):
        record = json.loads(path.read_text())
    host = record.get("host", {})
    gpus = host.get("gpus")
    if gpus:
        device = ", ".join(dict.fromkeys(gpus)) + (f" x {len(config.gpus)} (one lane each)" if config.gpus else "")
    else:
        device = f"CPU ({host.get('cpus')} cores, {host.get('platform')})"
    return {"git_sha": os.environ.get("GENOLC_GIT_SHA") or record.get("git_sha"),
            "genolc_version": record.get("genolc_version"), "device": device,
            "torch": host.get("torch"), "hostname": host.get("hostname")}


def phase_table(phases: list[Phase], results: Path) -> list[dict[str, Any]]:
    rows = []
    for phase in phases:
        row = {"phase": phase.name, **phase.result}
        summary = results / phase.name / "summary.json"
        if phase.args[0] == "finetune" and summary.is_file():
            train = json.loads(summary.read_text())
            row.update(peak_device_memory_gib=train.get("peak_memory_gib"), steps=train.get("steps_done"),
                       tokens=train.get("tokens_seen"), final_loss=train.get("final_loss"),
                       mean_loss_last_10=train.get("mean_loss_last_10"), tokens_per_s=train.get("tokens_per_s"),
                       train_seconds=train.get("seconds"), step_strategies=train.get("step_strategies"),
                       **first_and_steady_steps(results / phase.name / "metrics.jsonl"))
        rows.append(row)
    return rows


def first_and_steady_steps(metrics: Path) -> dict[str, Any]:
    """The first step's seconds (compilation, autotuning and allocator warm-up fall in it) and the median tokens/s of
    the later steps: what a fresh process pays once, and its rate after that (alone on the device, what the plan's
    TRAIN_RATES stand for; with --jobs 2, the rate while sharing it)."""
    if not metrics.is_file():
        return {}
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [s for s in steps if "step_seconds" in s]
    if not steps:
        return {}
    later = [s["tokens_per_s"] for s in steps[1:]]
    return {"first_step_seconds": round(steps[0]["step_seconds"], 2),
            "steady_tokens_per_s": round(statistics.median(later), 1) if later else None}


def write_readme(results: Path, head: dict, plan: Plan, config: ExperimentConfig, prov: dict,
                 phases_rows: list[dict], wall: float) -> None:
    loss = head["heldout_loss"]

    def fmt(d: dict | None, blocks: int) -> str:
        if d is None:
            return "-"
        ci = ("" if d["ci_low"] is None else f" [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"
              + ("*" if blocks < FEW_BLOCKS_FOR_CI else ""))
        return f"{d['delta_bits_per_base']:+.4f}{ci}"

    lines = [
        "# Long-range learning on real DNA: pretrain short, finetune long, against a control", "",
        f"- {'preset `' + config.preset + '`' if config.base is None else 'model: the --base checkpoint'}, device "
        f"{prov['device']}, genolc {prov['genolc_version']} at "
        f"{prov['git_sha']}, {wall:.0f} s in all",
        f"- training FASTA: {', '.join(p.name for p in config.train_fastas)} (records {config.train_records}); "
        f"held out: {', '.join(p.name for p in config.heldout_fastas)} (records {config.heldout_records})",
        (f"- base: {config.base} (given with --base); " if plan.pretrain is None else
         f"- pretrain: {plan.pretrain.steps} steps of {plan.pretrain.micro_batch * plan.pretrain.grad_accum} x "
         f"{format_length(plan.pretrain.seq)} windows at lr {plan.pretrain.lr:g}; ")
        + f"arm A: {plan.arm_a.steps} steps of "
        f"one {format_length(plan.arm_a.seq)} window; arm B: {plan.arm_b.steps} steps of "
        f"{plan.arm_b.micro_batch * plan.arm_b.grad_accum} x {format_length(plan.arm_b.seq)} windows; arms at lr "
        f"{plan.arm_a.lr:g}",
        *(f"- {line}" for line in plan.how), "",
        f"Held-out bits/base over {head['eval_windows']['a_vs_base']['scored']} windows of "
        f"{format_length(plan.eval_seq)} ({', '.join(head['scored_windows'])}, spread over the "
        f"{head['eval_windows']['a_vs_base']['tiled']} windows of {', '.join(head['records'])}): "
        f"base {loss['base']:.4f}, "
        f"A {loss['a']:.4f} ({loss['a_change_percent']:+.2f}%), B {loss['b']:.4f} ({loss['b_change_percent']:+.2f}%); "
        f"A - base {loss['a_minus_base']:+.4f} [{loss['a_minus_base_ci'][0]:+.4f}, {loss['a_minus_base_ci'][1]:+.4f}]"
        f", A - B {loss['a_minus_b']:+.4f} [{loss['a_minus_b_ci'][0]:+.4f}, {loss['a_minus_b_ci'][1]:+.4f}] "
        f"(public figure: {loss['public_figure']}).", "",
        f"| bucket | base | A | B | A - base [95% CI] | A - B [95% CI] | A truncated to "
        f"{format_length(plan.context)} - A |", "|---|---|---|---|---|---|---|",
    ]
    for r in head["buckets"]:
        lines.append(f"| {r['bucket']} | {r['base_bits_per_base']:.4f} | {r['a_bits_per_base']:.4f} | "
                     f"{r['b_bits_per_base']:.4f} | {fmt(r['a_minus_base'], r['ci_blocks'])} | "
                     f"{fmt(r['a_minus_b'], r['ci_blocks'])} | {fmt(r['truncated_minus_a'], r['ci_blocks'])} |")
    if any(r["ci_blocks"] < FEW_BLOCKS_FOR_CI for r in head["buckets"]):
        lines += ["", f"\\* the interval rests on fewer than {FEW_BLOCKS_FOR_CI} bootstrap blocks (the bucket spans "
                  "that many 16k-target blocks over the scored windows): too few to read as a 95% interval."]
    lines += ["", "| phase | wall s | first step s | later steps tokens/s | peak host RSS GiB | peak GPU GiB | "
              "command |", "|---|---|---|---|---|---|---|"]

    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:,.0f}" if isinstance(value, float) and value > 1000 else str(value)

    for row in phases_rows:
        lines.append(f"| {row['phase']} | {row['wall_seconds']} | {cell(row.get('first_step_seconds'))} | "
                     f"{cell(row.get('steady_tokens_per_s'))} | {row['peak_host_rss_gib']} | "
                     f"{cell(row.get('peak_gpu_gib'))} | `{row['command']}` |")
    lines += ["", "Files: summary.json (these numbers), plan.json, phases.json, commands.sh, plots/, and one folder "
              "per phase with what its command wrote (metrics.jsonl, summary.json, eval CSVs and plots, run "
              "records, log.txt).", ""]
    atomic_write_bytes(results / "README.md", "\n".join(lines).encode())


def pack(results: Path, archive: Path) -> None:
    """tar.gz of the results folder (named as the folder) written atomically."""
    fd, tmp = tempfile.mkstemp(prefix=f".{archive.name}.tmp-", dir=archive.parent)
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(results, arcname=results.name)
        os.chmod(tmp, 0o644)
        os.replace(tmp, archive)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_archive(archive: Path) -> None:
    """Refuse to replace a file that is not an archive this script wrote (one holding the experiment's marker)."""
    if not archive.exists():
        return
    if archive.is_file():
        try:
            with tarfile.open(archive, "r:gz") as tar:
                for member in tar:
                    if member.name.endswith("/" + OUTPUT_MARKER):
                        marker = json.load(tar.extractfile(member))
                        if marker.get("kind") == KIND:
                            return
        except (tarfile.TarError, OSError, ValueError, EOFError):
            pass
    raise RefusedOutputError("the archive path holds a file this experiment did not write; refusing to replace it",
                             where=str(archive), fix="choose another --archive or move that file")


def run_experiment(config: ExperimentConfig, argv: list[str]) -> Path:
    """Validate, run every phase, write the results folder and the archive; returns the results folder."""
    started = time.monotonic()
    for path in (*config.train_fastas, *config.heldout_fastas):
        if not path.is_file():
            raise InputError("FASTA file not found", where=str(path), fix="check the path (--train-fasta / "
                                                                          "--heldout-fasta)")
    if config.base is not None:
        if not config.base.exists():
            raise InputError("base checkpoint not found", where=str(config.base),
                             fix="give a genolc checkpoint or finetune run directory to --base (genolc finetune "
                                 "--init takes the same)")
        from genolc.train.state import resolve_checkpoint

        # Once, here: every phase then starts from the same checkpoint even if the run directory gains a newer one.
        config = replace(config, base=resolve_checkpoint(config.base, "--base").absolute())
        if not (config.base / "config.json").is_file():
            raise InputError("--base is neither a model checkpoint (no config.json) nor a finetune run directory",
                             where=str(config.base),
                             fix="give a checkpoint directory (checkpoints/step-N of a finetune run) or the run "
                                 "directory itself")
    plan = make_plan(config)
    if config.plan_only:
        print(json.dumps(asdict(plan), indent=1))
        for phase in build_phases(config, plan, Path("WORK")):
            print(phase.command())
        return config.out
    out = check_output_dir(config.out, KIND)
    archive = (config.archive or out.parent / f"{out.name}.tar.gz").absolute()
    check_archive(archive)
    if config.work is not None:
        check_output_dir(config.work, "experiment work directory")
    with atomic_dir(out, KIND) as results:
        work_parent = config.work.parent if config.work else out.parent
        work_parent.mkdir(parents=True, exist_ok=True)
        work = config.work.absolute() if config.work else Path(tempfile.mkdtemp(prefix=f".{out.name}.work-",
                                                                                dir=work_parent))
        work.mkdir(parents=True, exist_ok=True)
        logs = work / "logs"
        logs.mkdir(exist_ok=True)
        trained = False
        try:
            phases = build_phases(config, plan, work)
            _say(f"plan: {plan.pretrain.steps if plan.pretrain else 'no'} pretraining steps, {plan.arm_a.steps} "
                 "steps per arm; "
                 + "; ".join(plan.how[1:-1]))
            try:
                run_phases(phases, logs, config)
            except BaseException:
                _print_log_tails(logs)
                raise
            trained = True
            collect(phases, results, logs)
            head = headline(results, plan)
            plots = make_plots(results, head, plan)
            prov = provenance(results, config)
            rows = phase_table(phases, results)
            wall = time.monotonic() - started
            command = ["python", "experiments/long_context_dna.py", *argv]
            summary = {"experiment": NAME, "status": "ok", "command": shlex.join(command), "work": str(work), **prov,
                       "base_checkpoint": str(config.base) if config.base is not None else None,
                       "wall_seconds": round(wall, 1), "plan": asdict(plan),
                       "config": {k: (str(v) if isinstance(v, Path) else [str(x) for x in v]
                                      if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
                       **head, "phases": rows, "plots": plots}
            atomic_write_json(results / "summary.json", summary)
            atomic_write_json(results / "plan.json", {"plan": asdict(plan), "how": list(plan.how),
                                                      "train_rates": {f"{d}/{p}": r for (d, p), r in
                                                                      TRAIN_RATES.items()}})
            atomic_write_json(results / "phases.json", rows)
            script = ["#!/bin/sh", "# The experiment as run, then each phase's genolc command in order, writing the",
                      f"# dataset, checkpoints and evaluations under $1 (the run used {work}).",
                      f"# {shlex.join(command)}", "set -e", 'WORK="${1:-long_context_dna-work}"',
                      *(p.command() for p in phases)]
            atomic_write_bytes(results / "commands.sh", ("\n".join(script) + "\n").encode())
            write_readme(results, head, plan, config, prov, rows, wall)
        except BaseException:
            if trained and not config.keep_work:
                # Every phase ran but the results could not be gathered: the checkpoints and full logs are the
                # run's only copy, so they stay.
                _say(f"kept the work folder with every phase's checkpoints and logs: {work}")
            elif not config.keep_work:
                shutil.rmtree(work, ignore_errors=True)
            raise
        if not config.keep_work:
            shutil.rmtree(work, ignore_errors=True)
        # The archive holds the folder under its final name, marker included (atomic_dir writes it on success).
        staged = results.parent / f".{out.name}.pack-{os.getpid()}" / out.name
        staged.parent.mkdir()
        try:
            shutil.copytree(results, staged)
            atomic_write_json(staged / OUTPUT_MARKER, {"written_by": "genolc", "kind": KIND})
            pack(staged, archive)
        finally:
            shutil.rmtree(staged.parent, ignore_errors=True)
    _say(f"wrote {out} and {archive} ({archive.stat().st_size / 2**20:.2f} MiB) in {time.monotonic() - started:.0f} s")
    return out


def _print_log_tails(logs: Path, lines: int = 12) -> None:
    """The last lines of every phase's output: the work folder goes, and on a device this is what comes back."""
    for log in sorted(logs.glob("*.log"), key=lambda path: path.stat().st_mtime):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.stem}, last {len(tail)} lines:", *tail, sep="\n", file=sys.stderr)


def _say(message: str) -> None:
    print(f"long_context_dna: {message}", file=sys.stderr, flush=True)


CPU_SIZES = dict(preset="tiny", device="cpu", short_seq=128, long_seq=1024, pretrain_windows=4, short_micro_batch=8,
                 pretrain_steps=6, arm_steps=2, pretrain_lr=1e-2, arm_lr=1e-3, eval_tokens=2 * 1024, context=128,
                 first_bucket=64, bootstrap=200, needle_seq=1024, needle_trials=2, needle_bases=64, jobs=2,
                 threads=1)


def parse_args(argv: list[str]) -> ExperimentConfig:
    parser = argparse.ArgumentParser(prog="python experiments/long_context_dna.py",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="The module docstring has the whole story (how to run, what it runs).")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results folder (new, empty or an earlier one of this experiment; default "
                             f"results/<date>_{NAME})")
    parser.add_argument("--archive", type=Path, help="the tar.gz to write (default: <out>.tar.gz)")
    parser.add_argument("--work", type=Path, help="dataset and checkpoints (default: a temporary folder beside out)")
    parser.add_argument("--keep-work", action="store_true", help="keep the work folder (checkpoints) at the end")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU form on the bundled sample: tiny preset, SHORT 128, LONG 1k (2-3 minutes)")
    parser.add_argument("--sample", action="store_true", help="use genolc's bundled sample as the data")
    parser.add_argument("--train-fasta", type=Path, action="append", default=[], help="training FASTA (repeat)")
    parser.add_argument("--heldout-fasta", type=Path, action="append", default=[], help="held-out FASTA (repeat)")
    parser.add_argument("--train", help="records to train on, as genolc prepare --train (default: all)")
    parser.add_argument("--heldout", help="held-out records, as genolc prepare --heldout (required with FASTAs)")
    parser.add_argument("--preset", help="model preset (default small; tiny with --cpu)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default cuda (cpu with --cpu)")
    parser.add_argument("--gpus", help="comma-separated CUDA device indices, one process lane each (e.g. 0,1)")
    parser.add_argument("--jobs", type=int, help="processes at once without --gpus (default 1; 2 with --cpu)")
    parser.add_argument("--threads", type=int, help="torch CPU threads per process (finetune/eval --threads)")
    parser.add_argument("--short-seq", help="short context (default 8k; 128 with --cpu)")
    parser.add_argument("--long-seq", help="long context (default 512k; 1k with --cpu)")
    parser.add_argument("--pretrain-windows", type=int, help="short windows per pretraining step (default 8)")
    parser.add_argument("--short-micro-batch", type=int,
                        help="short windows per micro-batch in arm B and pretraining (default 4: 32k tokens, whole-"
                             "window steps of `small` on an H200)")
    parser.add_argument("--base", type=Path,
                        help="a pretrained checkpoint (or finetune run directory) for the arms to start from, "
                             "instead of pretraining one; its tokenizer must be --tokenizer's, and it must not have "
                             "trained on the held-out records")
    parser.add_argument("--pretrain-steps", type=int, help="pretraining steps (default: from --time-budget)")
    parser.add_argument("--arm-steps", type=int, help="steps of each arm (default: from --time-budget)")
    parser.add_argument("--pretrain-lr", type=float, help="peak lr of pretraining (default 1e-3; 1e-2 with --cpu)")
    parser.add_argument("--arm-lr", type=float,
                        help="peak lr of both arms (default 1e-4, pretraining's final lr; 1e-3 with --cpu)")
    parser.add_argument("--time-budget", type=float, help="seconds for the whole run; plans the steps")
    parser.add_argument("--compile-seconds", type=float,
                        help="compile allowance in the plan (default 60 for mini, 150 for small/base on cuda; 0 when "
                             "the carried kernel caches hold the preset's kernels)")
    parser.add_argument("--eval-tokens", help="held-out window tokens per --by-position evaluation (default 2M)")
    parser.add_argument("--context", help="truncation control: visible tokens (default 4k; 128 with --cpu)")
    parser.add_argument("--context-block", help="eval --context-block (default: the --context value)")
    parser.add_argument("--first-bucket", help="eval --first-bucket (default 1k; 64 with --cpu)")
    parser.add_argument("--bootstrap", type=int, help="bootstrap replicates (default 1000; 200 with --cpu)")
    parser.add_argument("--needle-seq", help="needle window (default min(LONG, 128k))")
    parser.add_argument("--needle-trials", type=int, help="needle trials (default 2)")
    parser.add_argument("--needle-bases", type=int, help="needle segment bases (default 256; 64 with --cpu)")
    parser.add_argument("--routing-lengths", help="eval --routing lengths (default SHORT,LONG)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", action="store_true", help="show genolc's progress bars in the logs")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the plan (steps, sizes, the budget's arithmetic) and the commands; run nothing")
    args = parser.parse_args(argv)

    values: dict[str, Any] = dict(CPU_SIZES) if args.cpu else {}
    if args.cpu or args.sample:
        from genolc.sample import HELDOUT_CHROMS, HELDOUT_FILE, TRAIN_CHROMS, TRAIN_FILE

        if args.train_fasta or args.heldout_fasta:
            raise ConfigError("--cpu/--sample use the bundled sample; --train-fasta/--heldout-fasta cannot be added",
                              fix="drop --cpu/--sample to use your own FASTA files")
        values.update(train_fastas=(TRAIN_FILE,), heldout_fastas=(HELDOUT_FILE,), train_records=",".join(TRAIN_CHROMS),
                      heldout_records=",".join(HELDOUT_CHROMS))
    else:
        values.update(train_fastas=tuple(args.train_fasta), heldout_fastas=tuple(args.heldout_fasta))
    lengths = {"short_seq": args.short_seq, "long_seq": args.long_seq, "eval_tokens": args.eval_tokens,
               "context": args.context, "context_block": args.context_block, "first_bucket": args.first_bucket,
               "needle_seq": args.needle_seq}
    for name, text in lengths.items():
        if text is not None:
            values[name] = parse_length(text, f"--{name.replace('_', '-')}")
    for name in ("preset", "device", "jobs", "threads", "pretrain_windows", "short_micro_batch", "pretrain_steps",
                 "arm_steps", "pretrain_lr", "arm_lr", "time_budget", "compile_seconds", "bootstrap",
                 "needle_trials", "needle_bases"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    if args.base is not None:
        values["base"] = args.base
        if args.pretrain_steps is None:
            values.pop("pretrain_steps", None)  # --cpu's sizes pretrain; a given base is not pretrained again
    if args.train is not None:
        values["train_records"] = args.train
    if args.heldout is not None:
        values["heldout_records"] = args.heldout
    if args.gpus:
        values["gpus"] = tuple(g.strip() for g in args.gpus.split(",") if g.strip())
    if args.routing_lengths:
        values["routing_lengths"] = tuple(parse_length(x, "--routing-lengths") for x in args.routing_lengths.split(","))
    out = args.out or ROOT / "results" / f"{dt.date.today().isoformat()}_{NAME}"
    return ExperimentConfig(out=out, archive=args.archive, work=args.work, keep_work=args.keep_work,
                            seed=args.seed, progress=args.progress, plan_only=args.plan_only, **values)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = parse_args(argv)
        run_experiment(config, argv)
    except PhaseFailed as failure:
        print(f"long_context_dna: error: {failure.message}\n  nothing was written (the results folder and the "
              "archive appear only when every phase succeeds)", file=sys.stderr)
        return 2 if failure.user_error else 1
    except GenolcError as error:
        print(f"long_context_dna: error: {error.message}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("long_context_dna: stopped (interrupt or timeout); nothing was written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
