"""Writing evaluation outputs: CSV tables, a JSON summary and a PNG, all at once into ``--out``.

Everything is written into a temporary directory beside ``--out`` that replaces it only when complete
(:func:`genolc.fsutil.atomic_dir`: only an absent or empty ``--out``, or an earlier evaluation's, is replaced); the
run record (:func:`genolc.runs.run_record`) lands in ``--out/runs/``
afterwards. Statistics for empty buckets are written as empty CSV cells and JSON ``null``, never NaN.

``eval --by-position`` writes:
  summary.json      configuration, records, windows, estimator, overall bits/base, every bucket and comparison
  buckets.csv       series, subset, bucket, lo, hi, tokens, bases, windows, empty, bits_per_base, ci_low, ci_high
  comparisons.csv   comparison ('model - baseline', 'context:K - model'), subset, bucket, …, delta_bits_per_base, CI
  windows.csv       per window: record, token span, chromosome span (1-based, inclusive), bits/base per series
  blocks.csv        per 16 kb block: chromosome span, targets, bases, bits/base per series
  targets.csv.gz    (--per-target) per target: record, chromosome position of its first base, position, bits/base
  by_position.png   bits/base per bucket with 95% CIs; paired differences below
``eval --needle`` writes summary.json, needle.csv (one row per trial and distance), needle_summary.csv, needle.png.
An evaluation stopped by Ctrl-C writes what it scored: summary.json says ``"status": "interrupted"`` (else "ok") with
the windows (trials) scored and selected, and the plot's title says INTERRUPTED.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from genolc.fsutil import atomic_dir

OUTPUT_KIND = "evaluation output directory"


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
