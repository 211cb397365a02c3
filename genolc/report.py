"""Summaries of ``genolc eval --by-position`` outputs: the per-bucket table and the workflow's markdown report.

    python -m genolc.report --out results/report results/eval/NAME/CHROM [...]

Each evaluation directory (as written by genolc.eval.report) becomes one section of ``summary.md`` with its
per-bucket table (model, baseline and context-control bits/base) and its plot, copied beside the summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from genolc.errors import InputError
from genolc.fsutil import atomic_write_bytes


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
    return list(rows.values())


def format_table(rows: list[dict[str, Any]]) -> str:
    series = [k for k in rows[0] if k not in ("bucket", "tokens", "ci")] if rows else []
    header = ["bucket", "tokens"] + [f"{s} bits/base" for s in series] + ["model 95% CI"]
    lines = [header]
    for row in rows:
        low, high = row.get("ci", (None, None))
        cells = [row["bucket"], str(row["tokens"])]
        cells += ["-" if row.get(s) is None else f"{row[s]:.4f}" for s in series]
        cells.append("-" if low is None else f"[{low:.4f}, {high:.4f}]")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    return "\n".join([text[0], "  ".join("-" * w for w in widths)] + text[1:])


def comparison_lines(summary: dict[str, Any]) -> list[str]:
    """One markdown bullet per paired comparison over all targets (e.g. model - baseline), with its 95% CI."""
    lines = []
    for row in summary.get("comparisons", []):
        if row.get("subset") == "all" and row.get("bucket") == "all" and row.get("delta_bits_per_base") is not None:
            lines.append(f"- {row['comparison']}: {row['delta_bits_per_base']:+.4f} bits/base "
                         f"(95% CI {row['ci_low']:+.4f} to {row['ci_high']:+.4f})")
    return lines


def bucket_report(summary: dict[str, Any]) -> str:
    """The per-bucket table and the paired comparisons, as ``genolc eval --by-position`` and ``genolc demo`` print
    them at the end."""
    return "\n".join([format_table(bucket_table(summary)), "", *comparison_lines(summary)]).rstrip()


def write_workflow_report(out: Path, eval_dirs: list[Path]) -> Path:
    """``out/summary.md`` with one section per evaluation, plots copied to ``out/<name>_<chrom>.png``."""
    out.mkdir(parents=True, exist_ok=True)
    sections = ["# genolc workflow report", "",
                "Held-out bits per base by preceding-context position (lower is better). `context:K` scores the "
                "same targets with only the last K tokens visible; `baseline` is the baseline run's checkpoint.", ""]
    for directory in eval_dirs:
        path = directory / "summary.json"
        if not path.is_file():
            raise InputError("not an evaluation output directory (no summary.json)", where=str(directory),
                             fix="pass directories written by genolc eval --by-position")
        summary = json.loads(path.read_text())
        label = "_".join(directory.parts[-2:])
        plot = directory / "by_position.png"
        if plot.is_file():
            shutil.copy2(plot, out / f"{label}.png")
        config = summary.get("config", {})
        sections += [f"## {' / '.join(directory.parts[-2:])}", "",
                     f"checkpoint `{config.get('checkpoint')}`" + (f", baseline `{config['baseline']}`"
                                                                    if config.get("baseline") else "")
                     + f"; {summary['windows']['scored']} windows of {int(config.get('seq_len', 0)) + 1} tokens "
                     f"on {', '.join(summary.get('records', []))}", "",
                     "```", format_table(bucket_table(summary)), "```", "",
                     *comparison_lines(summary), "", f"![by position]({label}.png)", ""]
    target = out / "summary.md"
    atomic_write_bytes(target, "\n".join(sections).encode())
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m genolc.report", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("eval_dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print(write_workflow_report(args.out, args.eval_dirs))


if __name__ == "__main__":
    main()
