"""Evaluation outputs: writing them (CSV tables, a JSON summary and a PNG, all at once into ``--out``) and
reading them back as reports (the per-bucket table and the workflow's markdown summary).

Everything is written into a temporary directory beside ``--out`` that replaces it only when complete
(:func:`genolc.fsutil.atomic_dir`: only an absent or empty ``--out``, or an earlier evaluation's, is replaced); the
run record (:func:`genolc.runs.run_record`) lands in ``--out/runs/``
afterwards. Statistics for empty buckets are written as empty CSV cells and JSON ``null``, never NaN.

``eval --by-position`` writes:
  summary.json      configuration, records, windows, estimator, overall bits/base, every bucket and comparison
  buckets.csv       series, subset, bucket, lo, hi, tokens, bases, windows, blocks, empty, bits_per_base, ci_low,
                    ci_high; blocks: the 16 kb bootstrap blocks holding the bucket's targets (fewer than 2: no CI)
  comparisons.csv   comparison ('model - baseline', 'context:K - model'), subset, bucket, …, blocks,
                    delta_bits_per_base, CI
  windows.csv       per window: record, token span, chromosome span (1-based, inclusive), bits/base per series
  blocks.csv        per 16 kb block: chromosome span, targets, bases, bits/base per series
  targets.csv.gz    (--per-target) per target: record, chromosome position of its first base, position, bits/base
  by_position.png   bits/base per bucket with 95% CIs; paired differences below
``eval --needle`` writes summary.json, needle.csv (one row per trial and distance), needle_summary.csv, needle.png.
An evaluation stopped by Ctrl-C writes what it scored: summary.json says ``"status": "interrupted"`` (else "ok") with
the windows (trials) scored and selected, and the plot's title says INTERRUPTED.

Reports: :func:`bucket_report` is the per-bucket table ``genolc eval --by-position`` and ``genolc demo`` print; an
interval resting on fewer than FEW_BLOCKS_FOR_CI (10) blocks is marked ``*`` there, with a footnote
(:func:`few_blocks_note`: the spread of a few windows, not a 95% interval), and drawn dashed in by_position.png;
``python -m genolc.eval.report --out results/report results/eval/NAME/CHROM [...]`` (the workflow's report rule)
makes ``summary.md`` with one section per evaluation directory: its per-bucket table (model, baseline and
context-control bits/base) and its plot, copied beside the summary. It reads every evaluation first (a bad one is
one message, exit code 2, nothing written) and builds ``--out`` whole: a new or empty directory, or an earlier
report's, never one holding files genolc did not write.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from genolc.errors import GenolcError, InputError
from genolc.eval.buckets import BLOCK_BASES, FEW_BLOCKS_FOR_CI
from genolc.fsutil import atomic_dir, atomic_write_bytes, output_kind

OUTPUT_KIND = "evaluation output directory"
REPORT_KIND = "workflow report directory"


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/inf become None, numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(_clean(obj), indent=2, allow_nan=False) + "\n")


def _add_outputs(record: Any, directory: Path, final: Path) -> None:
    if record is None:
        return
    for file in sorted(directory.iterdir()):
        if file.is_file():
            record.outputs[str(final / file.name)] = file.stat().st_size


def write_by_position(out: Path, summary: dict[str, Any], tables: Any, record: Any | None = None) -> None:
    from genolc.eval.plots import plot_by_position

    out = Path(out)
    if record is not None:
        record.add_input(Path(summary["dataset"]["path"]) / "manifest.json")
        for key in ("checkpoint", "baseline"):
            ckpt = summary["config"].get(key)
            if ckpt:
                for file in sorted(Path(ckpt).glob("*.safetensors")) + [Path(ckpt) / "config.json"]:
                    record.add_input(file)
    with atomic_dir(out, OUTPUT_KIND) as tmp:
        buckets = pd.DataFrame(summary["bucket_stats"])
        comparisons = pd.DataFrame(summary["comparisons"])
        buckets.to_csv(tmp / "buckets.csv", index=False)
        comparisons.to_csv(tmp / "comparisons.csv", index=False)
        pd.DataFrame(tables.window_rows).to_csv(tmp / "windows.csv", index=False)
        pd.DataFrame(tables.block_rows).to_csv(tmp / "blocks.csv", index=False)
        if tables.targets is not None:
            columns = {k: np.concatenate(v) if v else np.zeros(0) for k, v in tables.targets.items()}
            frame = pd.DataFrame(columns)
            frame.rename(columns={n: f"{n}_bits_per_base" for n in tables.series}).to_csv(
                tmp / "targets.csv.gz", index=False, float_format="%.5g", compression="gzip")
        records = ",".join(summary["records"])
        windows = summary["windows"]
        shown = (f"{windows['scored']} windows" if summary["status"] == "ok" else
                 f"INTERRUPTED: {windows['scored']} of {windows['selected']} windows")
        plot_by_position(buckets, comparisons, tmp / "by_position.png",
                         f"held-out loss by context position ({records}, {shown})")
        _write_json(tmp / "summary.json", summary)
        _add_outputs(record, tmp, out)


def write_needle(out: Path, summary: dict[str, Any], trials: pd.DataFrame, per_distance: pd.DataFrame,
                 record: Any | None = None) -> None:
    from genolc.eval.plots import plot_needle

    out = Path(out)
    if record is not None:
        record.add_input(Path(summary["dataset"]["path"]) / "manifest.json")
    with atomic_dir(out, OUTPUT_KIND) as tmp:
        trials.to_csv(tmp / "needle.csv", index=False)
        per_distance.to_csv(tmp / "needle_summary.csv", index=False)
        needle = summary["needle"]
        shown = ("" if summary["status"] == "ok" else
                 f" (INTERRUPTED: {needle['trials_done']} of {needle['trials']} trials)")
        plot_needle(per_distance, tmp / "needle.png",
                    f"needle: {needle['segment_tokens']}-token segment inserted twice{shown}")
        _write_json(tmp / "summary.json", summary)
        _add_outputs(record, tmp, out)


def bucket_table(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per bucket, all targets: bits/base of the model and of each context control, with the gap between them."""
    rows: dict[str, dict[str, Any]] = {}
    for stat in summary["bucket_stats"]:
        if stat["subset"] != "all":
            continue
        row = rows.setdefault(stat["bucket"], {"bucket": stat["bucket"], "tokens": stat["tokens"]})
        row[stat["series"]] = stat["bits_per_base"]
        if stat["series"] == "model":
            row["ci"] = (stat["ci_low"], stat["ci_high"])
            # Summaries written before block counts were recorded have none: their intervals go unmarked.
            row["ci_blocks"] = stat.get("blocks")
    return list(rows.values())


def few_blocks_mark(low: float | None, high: float | None, blocks: int | None) -> str:
    """'*' for an interval resting on fewer than FEW_BLOCKS_FOR_CI bootstrap blocks, else ''."""
    shown = low is not None and high is not None
    return "*" if shown and blocks is not None and blocks < FEW_BLOCKS_FOR_CI else ""


def format_table(rows: list[dict[str, Any]]) -> str:
    series = [k for k in rows[0] if k not in ("bucket", "tokens", "ci", "ci_blocks")] if rows else []
    header = ["bucket", "tokens"] + [f"{s} bits/base" for s in series] + ["model 95% CI"]
    lines = [header]
    for row in rows:
        low, high = row.get("ci", (None, None))
        cells = [row["bucket"], str(row["tokens"])]
        cells += ["-" if row.get(s) is None else f"{row[s]:.4f}" for s in series]
        cells.append("-" if low is None or high is None else
                     f"[{low:.4f}, {high:.4f}]{few_blocks_mark(low, high, row.get('ci_blocks'))}")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    return "\n".join([text[0], "  ".join("-" * w for w in widths)] + text[1:])


def _shown_comparisons(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for row in summary.get("comparisons", []) if row.get("subset") == "all"
            and row.get("bucket") == "all" and row.get("delta_bits_per_base") is not None]


def comparison_lines(summary: dict[str, Any]) -> list[str]:
    """One markdown bullet per paired comparison over all targets (e.g. model - baseline), with its 95% CI."""
    lines = []
    for row in _shown_comparisons(summary):
        low, high = row.get("ci_low"), row.get("ci_high")
        # Too few blocks (a window or two) to bootstrap: the estimate without an interval.
        interval = ("no 95% CI: too few blocks to bootstrap" if low is None or high is None
                    else f"95% CI {low:+.4f} to {high:+.4f}{few_blocks_mark(low, high, row.get('blocks'))}")
        lines.append(f"- {row['comparison']}: {row['delta_bits_per_base']:+.4f} bits/base ({interval})")
    return lines


def few_blocks_note(summary: dict[str, Any], markdown: bool = False) -> list[str]:
    """The footnote for the ``*`` of :func:`format_table` and :func:`comparison_lines`; none when nothing is marked.
    As markdown it is a paragraph of its own (a blank line first, so it does not join the comparisons' list)."""
    intervals = [(*row.get("ci", (None, None)), row.get("ci_blocks")) for row in bucket_table(summary)]
    intervals += [(row.get("ci_low"), row.get("ci_high"), row.get("blocks")) for row in _shown_comparisons(summary)]
    if not any(few_blocks_mark(*interval) for interval in intervals):
        return []
    windows = summary.get("windows") or {}
    # Where every tiled window was scored, only more held-out sequence adds blocks.
    remedy = ("evaluate more held-out sequence" if windows.get("scored", 0) >= windows.get("tiled", 1)
              else "score more windows (--max-windows, --max-tokens)")
    note = (("\\*" if markdown else "*") + f" the interval rests on fewer than {FEW_BLOCKS_FOR_CI} "
            f"bootstrap blocks ({BLOCK_BASES // 1024} kb of targets each): it is the spread of a few windows, not a "
            f"95% interval; {remedy} to firm it up")
    return ["", note] if markdown else [note]


def bucket_report(summary: dict[str, Any]) -> str:
    """The per-bucket table and the paired comparisons, as ``genolc eval --by-position`` and ``genolc demo`` print
    them at the end, with the footnote for intervals from few blocks."""
    return "\n".join([format_table(bucket_table(summary)), "", *comparison_lines(summary),
                      *few_blocks_note(summary)]).rstrip()


def write_workflow_report(out: Path, eval_dirs: list[Path]) -> Path:
    """``out/summary.md`` with one section per evaluation, plots copied to ``out/<name>_<chrom>.png``.

    Every evaluation is read before anything is written; ``out`` is built whole under a temporary name and replaces
    an absent or empty directory, or an earlier report's (:func:`genolc.fsutil.atomic_dir`), never a folder holding
    files genolc did not write, such as a summary.md of the user's.
    """
    sections = ["# genolc workflow report", "",
                "Held-out bits per base by preceding-context position (lower is better). `context:K` scores the "
                "same targets with only the last K tokens visible; `baseline` is the baseline run's checkpoint.", ""]
    plots: dict[str, Path] = {}
    labels: dict[str, Path] = {}
    for directory in eval_dirs:
        label = "_".join(directory.parts[-2:])
        if label in labels:
            raise InputError(f"two evaluation directories end in the same two folder names ({labels[label]} and "
                             f"{directory}), so their plots would both be {label}.png", where=str(directory),
                             fix="pass each evaluation once, from folders named <eval>/<chromosome>")
        labels[label] = directory
        sections += _workflow_section(directory, label)
        if (directory / "by_position.png").is_file():
            plots[f"{label}.png"] = directory / "by_position.png"
    legacy = ("summary.md",) if _earlier_workflow_report(Path(out)) else ()
    with atomic_dir(out, REPORT_KIND, legacy=legacy) as tmp:
        for name, plot in plots.items():
            shutil.copy2(plot, tmp / name)
        atomic_write_bytes(tmp / "summary.md", "\n".join(sections).encode())
    return Path(out) / "summary.md"


def _workflow_section(directory: Path, label: str) -> list[str]:
    """One evaluation's section of summary.md; InputError if ``directory`` is not a by-position evaluation."""
    fix = "pass directories written by genolc eval --by-position"
    path = directory / "summary.json"
    if not path.is_file():
        problem = "not an evaluation output directory (no summary.json)" if directory.exists() else "no such directory"
        raise InputError(problem, where=str(directory), fix=fix)
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"the evaluation summary cannot be read ({exc})", where=str(path), fix=fix) from None
    try:
        config = summary.get("config", {})
        return [f"## {' / '.join(directory.parts[-2:])}", "",
                f"checkpoint `{config.get('checkpoint')}`" + (f", baseline `{config['baseline']}`"
                                                               if config.get("baseline") else "")
                + f"; {summary['windows']['scored']} windows of {int(config.get('seq_len', 0)) + 1} tokens "
                f"on {', '.join(summary.get('records', []))}", "",
                "```", format_table(bucket_table(summary)), "```", "",
                *comparison_lines(summary), *few_blocks_note(summary, markdown=True), "",
                f"![by position]({label}.png)", ""]
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        missing = f" (no {exc})" if isinstance(exc, KeyError) else ""
        raise InputError(f"not the summary of a by-position evaluation{missing}", where=str(path),
                         fix=fix + " (a --needle evaluation has no per-position table)") from None


def _earlier_workflow_report(out: Path) -> bool:
    """Whether ``out`` is a report written before outputs carried genolc's marker: only plots and a summary.md
    that starts with the report's own heading."""
    try:
        entries = list(out.iterdir()) if out.is_dir() and output_kind(out) is None else []
        heading = (out / "summary.md").read_text(errors="replace").split("\n", 1)[0] if entries else ""
    except OSError:
        return False
    return heading == "# genolc workflow report" and all(
        e.name == "summary.md" or (e.suffix == ".png" and e.is_file()) for e in entries)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m genolc.eval.report",
        description="One markdown summary (OUT/summary.md, plots beside it) of evaluation output directories. OUT "
                    "must be new, empty or an earlier report's; it is replaced whole.")
    parser.add_argument("--out", required=True, type=Path, help="report directory")
    parser.add_argument("eval_dirs", nargs="+", type=Path, help="directories written by genolc eval --by-position")
    args = parser.parse_args(argv)
    try:
        print(write_workflow_report(args.out, args.eval_dirs))
    except GenolcError as exc:
        print(f"{parser.prog}: error: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
