"""The long-context experiment's results (experiments/long_context_dna.py): each phase's files gathered into the
results folder, the headline numbers (bits/base by position of arm A against the base and against arm B, with
their confidence intervals), the plots, the README and the archive. Imported by the experiment's script.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import statistics
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from genolc.errors import RefusedOutputError
from genolc.eval.buckets import FEW_BLOCKS_FOR_CI
from genolc.fsutil import OUTPUT_MARKER, atomic_write_bytes
from genolc.units import format_length

from long_context_dna_plan import KIND, ExperimentConfig, Phase, Plan

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

    def save(fig, name: str) -> str:
        fig.tight_layout()
        fig.savefig(plots / name, dpi=110)
        plt.close(fig)
        return f"plots/{name}"

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
    written.append(save(fig, "bits_by_position.png"))

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
    written.append(save(fig, "deltas_by_position.png"))

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
    written.append(save(fig, "truncation_control.png"))

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
    written.append(save(fig, "needle.png"))
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
