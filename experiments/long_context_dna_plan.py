"""The long-context experiment's plan (experiments/long_context_dna.py): its configuration, the sizes of its
runs (from ``--time-budget`` through a time model fitted to the H200 runs, or given), and the genolc command each
phase runs. Imported by the experiment's script, which puts the repository root on ``sys.path`` first.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from genolc.errors import ConfigError
from genolc.units import format_length

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
