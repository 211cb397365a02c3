"""`genolc demo`: prepare -> finetune -> eval -> report on the real human sample bundled with genolc.

The sample (genolc/sample/, see PROVENANCE.md there) is hg38 chr2:1-600,000 for training and GRCh37
chr22:20,480,001-20,680,000 held out. The demo calls each stage's Python entry point, the same functions the
``genolc prepare/finetune/eval`` commands call, and writes::

    OUT/data/     prepared dataset (re-running the demo reuses it: prepare is a no-op on unchanged input)
    OUT/init/     the preset's seeded random initialisation: where fine-tuning starts, and the evaluation's baseline
    OUT/run/      fine-tuning run: checkpoints/, metrics.jsonl, summary.json, runs/
    OUT/eval/     evaluation by position: buckets.csv, comparisons.csv, summary.json, by_position.png, runs/
    OUT/report/   what to look at: by_position.png, buckets.csv, comparisons.csv, eval_summary.json,
                  train_metrics.jsonl, train_summary.json, runs/ (the demo's and every stage's run record),
                  commands.sh (the equivalent commands), README.md (the per-bucket table and where it came from)
    OUT/runs/     the demo's own run record (``genolc runs show OUT``)
    OUT/genolc-demo.json   the plan, the seed and every file each stage folder holds from the demo's last run

A re-run rebuilds init/, run/, eval/ and report/ without losing anything that is not the demo's: it refuses if they
hold files genolc-demo.json does not list, sets the earlier run's folders aside (OUT/.demo-previous) and removes them
only when it succeeds; a failure puts them back.

The evaluation scores the fine-tuned model against its own untrained initialisation (``--baseline``), so the table
shows what training gained, per position bucket, beside a context-truncation control.

Sizes (:func:`demo_plan`): on CPU the tiny preset trains 40 steps on 2k-token windows and is evaluated on six
2k-token windows (buckets [0,256), [256,512), [512,1k), [1k,2k]) with a 128-token context control, a few minutes on
2 cores; ``smoke`` is the smallest end-to-end form, for CI; with CUDA the small preset trains and evaluates on 16k
windows.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from genolc.demo.config import DemoConfig
from genolc.errors import ConfigError, GenolcError, RefusedOutputError
from genolc.fsutil import RUNS_DIRNAME, atomic_write_bytes, atomic_write_json, check_output_dir, output_dir
from genolc.eval.report import bucket_table, comparison_lines, few_blocks_note, format_table
from genolc.runs import copy_record, run_record
from genolc.sample import HELDOUT_CHROMS, TRAIN_CHROMS, sample_files

DEMO_MARKER = "genolc-demo.json"
DEMO_KIND = "demo directory"
STAGE_DIRS = ("init", "run", "eval", "report")   # rebuilt by every run; data/ is prepare's (a no-op when unchanged)
PREVIOUS_DIRNAME = ".demo-previous"             # an earlier run's stage folders while a new run is under way
REPORT_FILES = {"by_position.png": "by_position.png", "buckets.csv": "buckets.csv",
                "comparisons.csv": "comparisons.csv", "summary.json": "eval_summary.json"}


@dataclass(frozen=True)
class DemoPlan:
    """What the demo runs: model, lengths, steps and how much held-out sequence to score."""

    model: str
    train_seq: int
    steps: int
    eval_seq: int
    contexts: tuple[int, ...]
    first_bucket: int                 # upper edge of the first position bucket (then doubling)
    max_windows: int
    lr: float
    warmup_steps: int
    n_boot: int
    device: str


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def demo_plan(config: DemoConfig) -> DemoPlan:
    """The preset and sizes for this machine (CUDA or not), with --steps/--seq applied."""
    device = config.device
    if device == "auto":
        device = "cuda" if _cuda_available() else "cpu"
    if config.smoke:
        plan = DemoPlan(model="tiny", train_seq=256, steps=2, eval_seq=256, contexts=(32,), first_bucket=64,
                        max_windows=2, lr=3e-3, warmup_steps=1, n_boot=50, device=device)
    elif device == "cuda":
        plan = DemoPlan(model="small", train_seq=16 * 1024, steps=60, eval_seq=16 * 1024, contexts=(1024,),
                        first_bucket=1024, max_windows=6, lr=3e-4, warmup_steps=6, n_boot=1000, device=device)
    else:
        # Measured on held-out chr22: at lr 3e-3, 20 steps leave the tiny model at ~2.04 bits/base (worse than a
        # uniform ACGT guess); at lr 1e-2 it learns base composition and dinucleotide bias in a few dozen steps.
        plan = DemoPlan(model="tiny", train_seq=2048, steps=40, eval_seq=2048, contexts=(128,), first_bucket=256,
                        max_windows=6, lr=1e-2, warmup_steps=4, n_boot=1000, device=device)
    if config.steps is not None:
        plan = replace(plan, steps=config.steps, warmup_steps=min(plan.warmup_steps, max(1, config.steps // 10)))
    if config.seq is not None:
        contexts = tuple(k for k in plan.contexts if k < config.seq) or (max(1, config.seq // 4),)
        plan = replace(plan, train_seq=config.seq, eval_seq=config.seq, contexts=contexts,
                       first_bucket=min(plan.first_bucket, max(1, config.seq // 8)))
    return plan


def equivalent_commands(out: Path | str, plan: DemoPlan, seed: int) -> list[str]:
    """The genolc commands that do what the demo did, writing under ``out`` (a path, or a shell word like "$OUT")."""
    def q(path: Path | str) -> str:
        text = str(path)
        return f'"{text}"' if text.startswith("$") else shlex.quote(text)

    root = str(out)
    data, init, run, ev = f"{root}/data", f"{root}/init", f"{root}/run", f"{root}/eval"
    final = f"{run}/checkpoints/step-{plan.steps:06d}"
    contexts = " ".join(f"--context {k}" for k in plan.contexts)
    return [
        f"genolc prepare {' '.join(q(p) for p in sample_files())} --out {q(data)} "
        f"--train {','.join(TRAIN_CHROMS)} --heldout {','.join(HELDOUT_CHROMS)} --tokenizer char",
        f"{shlex.quote(sys.executable)} -m genolc.demo init --data {q(data)} --model {plan.model} --seed {seed} "
        f"--out {q(init)}",
        f"genolc finetune --data {q(data)} --seq {plan.train_seq} --init {q(init)} --steps {plan.steps} "
        f"--lr {plan.lr} --warmup {plan.warmup_steps} --seed {seed} --device {plan.device} --out {q(run)}",
        f"genolc eval --by-position {','.join(HELDOUT_CHROMS)} --data {q(data)} --checkpoint {q(final)} "
        f"--baseline {q(init)} --seq {plan.eval_seq} {contexts} --first-bucket {plan.first_bucket} "
        f"--max-windows {plan.max_windows} --bootstrap {plan.n_boot} --seed {seed} --device {plan.device} "
        f"--out {q(ev)}",
    ]


def write_initial_checkpoint(data: Path, model: str, seed: int, out: Path) -> Path:
    """Write ``model``'s preset, randomly initialised under ``seed``, with ``data``'s tokenizer, to ``out``."""
    import torch

    from genolc.data.dataset import PreparedDataset
    from genolc.model import build_model, preset, save_pretrained

    tokenizer = PreparedDataset(data).tokenizer
    torch.manual_seed(seed)
    save_pretrained(build_model(preset(model, vocab_size=tokenizer.vocab_size)), out, tokenizer)
    return out


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Run the whole pipeline into ``config.out``; returns where the report is, the plan and the evaluation's
    summary."""
    out = config.out.absolute()
    plan = demo_plan(config)
    if plan.device == "cuda" and not _cuda_available():
        raise ConfigError("--device cuda was asked for but no CUDA device is visible", fix="use --device cpu or auto")
    # A new or empty directory, or an earlier demo's (genolc-demo.json marked those before the shared marker).
    check_output_dir(out, DEMO_KIND, legacy=(DEMO_MARKER,), replaces=False)
    if _read_state(out).get("status") == "running":
        _say(f"an earlier run into {out} stopped before it finished: removing its stage folders and putting back "
             "the run's before it")
        _roll_back(out)
    _refuse_foreign_stage_files(out)
    with output_dir(out, DEMO_KIND, legacy=(DEMO_MARKER,)):
        set_aside = _set_aside(out, plan, config.seed)
        try:
            result = _run_stages(config, plan, out)
        except BaseException:
            if set_aside is None:
                _keep_first_attempt(out, plan, config.seed)
            else:
                _put_back(out, set_aside)
            raise
        _write_state(out, plan, config.seed, "ok")
        shutil.rmtree(out / PREVIOUS_DIRNAME, ignore_errors=True)
        return result


def _read_state(out: Path) -> dict[str, Any]:
    """The demo's own record in ``out`` (genolc-demo.json): plan, seed, status and the files of each stage folder."""
    try:
        state = json.loads((out / DEMO_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(out: Path, plan: DemoPlan, seed: int, status: str, set_aside: list[str] | None = None) -> None:
    stages = {} if status == "running" else {stage: _files(out / stage) for stage in STAGE_DIRS
                                              if (out / stage).is_dir()}
    atomic_write_json(out / DEMO_MARKER, {"plan": asdict(plan), "seed": seed, "status": status,
                                          "set_aside": set_aside or [], "stages": stages})


def _files(folder: Path) -> list[str]:
    """Every file (and link) under ``folder``, as paths relative to it."""
    found = []
    for root, dirs, names in os.walk(folder):
        here = Path(root)
        names = names + [d for d in dirs if (here / d).is_symlink()]
        found += [(here / name).relative_to(folder).as_posix() for name in names]
    return sorted(found)


def _refuse_foreign_stage_files(out: Path) -> None:
    """RefusedOutputError, before anything is touched, if a stage folder the demo rebuilds holds a file the demo did
    not write (its state lists what each of its runs wrote), or was written by a demo that did not list its files."""
    stages = _read_state(out).get("stages")
    foreign, unlisted = [], []
    for stage in STAGE_DIRS:
        folder = out / stage
        if not (folder.exists() or folder.is_symlink()):
            continue
        if folder.is_symlink() or not folder.is_dir():
            foreign.append(stage)
        elif not isinstance(stages, dict) or not isinstance(stages.get(stage), list):
            unlisted.append(f"{stage}/")
        else:
            written = set(stages[stage])
            foreign += [f"{stage}/{name}" for name in _files(folder) if name not in written]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise RefusedOutputError(
            f"the demo directory holds files the demo did not write ({shown}) where it rebuilds "
            f"{', '.join(f'{s}/' for s in STAGE_DIRS)} on every run; refusing to run", where=str(out),
            fix="move those files out of the demo directory, or choose another --out")
    if unlisted:
        raise RefusedOutputError(
            f"the demo directory's {', '.join(unlisted)} come from an earlier genolc demo that did not list the files "
            "it wrote, so genolc cannot tell them from files of yours; refusing to rebuild them", where=str(out),
            fix="move any files of yours out of them and delete those folders, or choose another --out")


def _set_aside(out: Path, plan: DemoPlan, seed: int) -> list[str] | None:
    """Move the earlier run's stage folders (and its state) into ``out/.demo-previous``, to be removed once this run
    succeeds or put back if it fails; None when there was no earlier run."""
    previous = out / PREVIOUS_DIRNAME
    # Left behind by a run whose clean-up after success failed: what it holds was replaced already.
    shutil.rmtree(previous, ignore_errors=True)
    existing = [stage for stage in STAGE_DIRS if (out / stage).is_dir()]
    if not existing:
        _write_state(out, plan, seed, "running")
        return None
    previous.mkdir()
    if (out / DEMO_MARKER).is_file():
        shutil.copy2(out / DEMO_MARKER, previous / DEMO_MARKER)
    # The state says which folders go aside before any moves, so that a run killed halfway is rolled back by the
    # next one (_roll_back).
    _write_state(out, plan, seed, "running", set_aside=existing)
    for stage in existing:
        os.replace(out / stage, previous / stage)
    return existing


def _roll_back(out: Path) -> None:
    """Remove the stage folders of a run that did not finish and put the earlier run's back (``out/.demo-previous``)."""
    previous = out / PREVIOUS_DIRNAME
    set_aside = _read_state(out).get("set_aside") or []
    for stage in STAGE_DIRS:
        if (previous / stage).is_dir():
            shutil.rmtree(out / stage, ignore_errors=True)
            os.replace(previous / stage, out / stage)
        elif stage not in set_aside:
            shutil.rmtree(out / stage, ignore_errors=True)
    if (previous / DEMO_MARKER).is_file():
        os.replace(previous / DEMO_MARKER, out / DEMO_MARKER)
    else:
        (out / DEMO_MARKER).unlink(missing_ok=True)
    shutil.rmtree(previous, ignore_errors=True)


def _put_back(out: Path, set_aside: list[str]) -> None:
    """After a failed run: the earlier run's stage folders replace this run's, without hiding the run's error."""
    try:
        _roll_back(out)
    except OSError as exc:
        _say(f"could not put the earlier demo's output back ({exc}); it is in {out / PREVIOUS_DIRNAME}, and the next "
             f"run into {out} puts it back first")
        return
    _say(f"this run's stage folders were removed; the earlier demo's {', '.join(f'{s}/' for s in set_aside)} are "
         f"back in {out}")


def _keep_first_attempt(out: Path, plan: DemoPlan, seed: int) -> None:
    """A first run that failed keeps what it wrote (logs, checkpoints), listed as the demo's for the next run to
    rebuild; one that wrote no stage folder leaves no state either."""
    if any((out / stage).is_dir() for stage in STAGE_DIRS):
        _write_state(out, plan, seed, "failed")
    else:
        (out / DEMO_MARKER).unlink(missing_ok=True)


def _run_stages(config: DemoConfig, plan: DemoPlan, out: Path) -> dict[str, Any]:
    from genolc.data.prepare import PrepareConfig, prepare
    from genolc.eval.by_position import run_by_position
    from genolc.eval.config import ByPositionConfig
    from genolc.train.config import TrainConfig
    from genolc.train.loop import finetune

    report = out / "report"
    # The demo's own record goes beside its stages, in out/runs/; the report gathers a copy with theirs.
    with run_record("demo", out, {"out": out, "smoke": config.smoke, "plan": asdict(plan),
                                  "seed": config.seed}) as record:
        record.outputs.update({stage: str(out / stage) for stage in ("data", *STAGE_DIRS)})
        for path in sample_files():
            record.add_input(path)
        _say(f"1/4 prepare: {', '.join(p.name for p in sample_files())} -> {out / 'data'}")
        data = prepare(PrepareConfig(genomes=tuple(sample_files()), out=out / "data", train=TRAIN_CHROMS,
                                     heldout=HELDOUT_CHROMS, tokenizer="char", progress=config.progress))
        _say(f"2/4 finetune: {plan.model} preset from its seeded initialisation ({out / 'init'}), {plan.steps} "
             f"steps of {plan.train_seq}-token windows on {plan.device}")
        initial = write_initial_checkpoint(data, plan.model, config.seed, out / "init")
        train = TrainConfig(data=data, out=out / "run", seq_len=plan.train_seq, model=plan.model, init=initial,
                            steps=plan.steps, lr=plan.lr, warmup_steps=plan.warmup_steps, seed=config.seed,
                            device=plan.device, progress=config.progress)
        checkpoint = finetune(train)
        _say(f"3/4 eval: {','.join(HELDOUT_CHROMS)} by position, {plan.eval_seq}-token windows, against the "
             f"untrained initialisation, context control {', '.join(map(str, plan.contexts))}")
        evaluation = ByPositionConfig(data=data, checkpoint=checkpoint, records=",".join(HELDOUT_CHROMS),
                                      seq_len=plan.eval_seq, out=out / "eval", baseline=initial,
                                      contexts=plan.contexts,
                                      first_bucket=plan.first_bucket,
                                      max_windows=plan.max_windows, n_boot=plan.n_boot, seed=config.seed,
                                      device=plan.device, progress=config.progress)
        with run_record("eval", evaluation.out, evaluation.to_dict()) as eval_record:
            summary = run_by_position(evaluation, eval_record)
        _say("4/4 report")
        write_report(out, plan, config.seed, summary)
    if record.path is not None:
        copy_record(record.path, report / RUNS_DIRNAME / record.path.name)
    return {"report": report, "summary": summary, "plan": plan}


def write_report(out: Path, plan: DemoPlan, seed: int, summary: dict[str, Any]) -> Path:
    """Gather plot, tables, metrics, run records and commands into ``out/report``."""
    report = out / "report"
    (report / RUNS_DIRNAME).mkdir(parents=True, exist_ok=True)
    for source, target in REPORT_FILES.items():
        shutil.copy2(out / "eval" / source, report / target)
    shutil.copy2(out / "run" / "metrics.jsonl", report / "train_metrics.jsonl")
    shutil.copy2(out / "run" / "summary.json", report / "train_summary.json")
    for stage in ("data", "run", "eval"):
        for record in sorted((out / stage / RUNS_DIRNAME).glob("*.json")):
            copy_record(record, report / RUNS_DIRNAME / f"{stage}_{record.name}")
    commands = equivalent_commands(out, plan, seed)
    script = ["#!/bin/sh", "# What `genolc demo` ran, as commands, writing under $1",
              f"# (default ./genolc-demo-rerun; the demo itself wrote under {out}).", "set -e",
              'OUT="${1:-genolc-demo-rerun}"',
              *equivalent_commands("$OUT", plan, seed)]
    atomic_write_bytes(report / "commands.sh", ("\n".join(script) + "\n").encode())
    train = json.loads((out / "run" / "summary.json").read_text())
    table = format_table(bucket_table(summary))
    readme = [
        "# genolc demo report", "",
        "Held-out loss of a model fine-tuned on hg38 chr2:1-600,000 (bundled sample), evaluated on GRCh37 "
        "chr22:20,480,001-20,680,000 by preceding-context position. Bits per base; lower is better; a uniform "
        "guess over A, C, G, T scores 2. `baseline` is the same model before training (its seeded random "
        "initialisation); `context:K` scores the fine-tuned model on the same targets with only the last K tokens "
        "visible (the context control). In `by_position.png` the model is the thin solid line drawn over the "
        "controls (each in its own dashed or dotted style, shifted slightly sideways, so a control equal to the "
        "model stays visible); the dotted grey line marks the uniform guess, 2 bits.", "",
        f"- model: {plan.model} preset, {train.get('parameters')} parameters, {plan.steps} steps of "
        f"{plan.train_seq}-token windows on {plan.device}; final training loss "
        f"{train.get('final_loss'):.4f} nats/token",
        f"- evaluation: {summary['windows']['scored']} of {summary['windows']['tiled']} windows of "
        f"{plan.eval_seq + 1} tokens, {summary['windows']['tokens']} tokens; 95% CIs from a block bootstrap "
        f"({plan.n_boot} replicates)", "",
        "```", table, "```", "",
        *comparison_lines(summary), *few_blocks_note(summary, markdown=True), "",
        "Files: `by_position.png` (plot), `buckets.csv` and `comparisons.csv` (per bucket, per subset), "
        "`eval_summary.json`, `train_metrics.jsonl`, `train_summary.json`, `runs/` (run records of the demo and "
        "of every stage), `commands.sh` (the equivalent commands).", "",
        "```sh", *commands, "```", "",
    ]
    atomic_write_bytes(report / "README.md", "\n".join(readme).encode())
    return report


def _say(message: str) -> None:
    import click

    click.echo(f"genolc demo: {message}", err=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m genolc.demo init``: the demo's first checkpoint, for replaying the demo command by command."""
    parser = argparse.ArgumentParser(prog="python -m genolc.demo", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser("init", help="write a preset's seeded random initialisation as a checkpoint")
    init.add_argument("--data", required=True, type=Path, help="prepared dataset (its tokenizer)")
    init.add_argument("--model", default="tiny", help="preset name")
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        print(write_initial_checkpoint(args.data, args.model, args.seed, args.out))
    except GenolcError as exc:
        # Exit code 2 like every genolc command's user error (sys.exit with a message would give 1).
        print(f"python -m genolc.demo: error: {exc.message}", file=sys.stderr)
        sys.exit(2)

