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
steps with a time model of the run (``predict_seconds`` in long_context_dna_plan.py, fitted to the H200 runs of
``mini``): it takes the processes' start-ups and first steps, the compile allowance for cold kernel caches and the
evaluations off the budget and splits what is left between pretraining (40%) and the two arms, at the training rates
measured on the H200 (TRAIN_RATES); plan.json shows the arithmetic. ``--jobs 2`` on one GPU runs the arms (and then
the evaluations) side by side: their start-ups overlap, their device work does not. ``--pretrain-steps`` /
``--arm-steps`` set the steps directly.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from genolc.errors import ConfigError, GenolcError, InputError  # noqa: E402
from genolc.fsutil import (OUTPUT_MARKER, atomic_dir, atomic_write_bytes, atomic_write_json,  # noqa: E402
                           check_output_dir)
from genolc.units import parse_length  # noqa: E402

# The plan and the report live beside this script (run as a script, its folder is on sys.path already; loaded as a
# file, as the tests do, it is not).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from long_context_dna_plan import (KIND, NAME, TRAIN_RATES, ExperimentConfig, Phase, build_phases,  # noqa: E402
                                   make_plan)
from long_context_dna_report import (check_archive, collect, headline, make_plots, pack, phase_table,  # noqa: E402
                                     provenance, write_readme)

# Runs genolc's CLI and, at exit, prints the CUDA allocator's peak (eval reports none of its own).
PROBE = ("import atexit, runpy, sys\n"
         "def _peak():\n"
         "    torch = sys.modules.get('torch')\n"
         "    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():\n"
         "        print('PEAK_GPU_GIB', torch.cuda.max_memory_allocated() / 2**30, flush=True)\n"
         "atexit.register(_peak)\n"
         "sys.argv = ['genolc', *sys.argv[1:]]\n"
         "runpy.run_module('genolc.cli', run_name='__main__')\n")


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
