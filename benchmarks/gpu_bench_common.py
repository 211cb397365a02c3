"""Shared helpers of the GPU op benchmarks (bench_kda/dsa/indexer/moe.py): timing, memory, result JSON."""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path

import torch

from genolc.fsutil import atomic_write_json

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"64k": 65536, "256k": 262144, "1M": 1048576}


def parse_bench_args(doc: str | None, presets: bool = True) -> argparse.Namespace:
    """The op benchmarks' shared options: --sizes (keys of SIZES) and, for per-preset ops, --presets."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64k,256k,1M", help=f"comma-separated, from {', '.join(SIZES)}")
    if presets:
        parser.add_argument("--presets", default="small,base", help="comma-separated genolc presets")
    args = parser.parse_args()
    unknown = [size for size in args.sizes.split(",") if size not in SIZES]
    if unknown:
        parser.error(f"unknown --sizes {', '.join(unknown)}; use {', '.join(SIZES)}")
    return args


def git_sha() -> str:
    if os.environ.get("GENOLC_GIT_SHA"):
        return os.environ["GENOLC_GIT_SHA"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        return sha + ("-dirty" if dirty.strip() else "")
    except OSError:
        return "unknown"


def measure(step, repeats: int) -> dict:
    """Run ``step()`` once to warm up, then ``repeats`` times; median ms and peak memory above the start (GiB)."""
    torch.cuda.synchronize()
    step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return {"ms": times[len(times) // 2], "ms_all": times,
            "peak_above_inputs_gib": (torch.cuda.max_memory_allocated() - base) / 2 ** 30,
            "peak_total_gib": torch.cuda.max_memory_allocated() / 2 ** 30}


def profiled_kernels(run) -> list[dict]:
    """The CUDA kernels one call of ``run`` launches: name, calls, device ms (torch.profiler), longest first."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        run()
        torch.cuda.synchronize()
    kernels = [e for e in profiler.key_averages() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    return [{"name": e.key[:100], "calls": e.count, "device_ms": round(float(e.self_device_time_total) / 1e3, 3)}
            for e in sorted(kernels, key=lambda e: -float(e.self_device_time_total))]


def try_measure(step, repeats: int) -> dict:
    try:
        return measure(step, repeats)
    except torch.cuda.OutOfMemoryError as error:
        torch.cuda.empty_cache()
        return {"error": f"OOM: {str(error)[:160]}"}


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||``, accumulated in float64 over chunks (1M-token outputs are ~5G
    elements); any NaN or inf in ``actual`` gives inf."""
    actual, expected = actual.reshape(-1), expected.reshape(-1)
    diff_sq, ref_sq = 0.0, 0.0
    for i in range(0, actual.numel(), 1 << 26):
        a, e = actual[i:i + (1 << 26)].double(), expected[i:i + (1 << 26)].double()
        if not torch.isfinite(a).all():
            return float("inf")
        diff_sq += float(((a - e) ** 2).sum())
        ref_sq += float((e ** 2).sum())
    return (diff_sq / max(ref_sq, 1e-60)) ** 0.5


def write_results(name: str, rows: list[dict], notes: dict) -> Path:
    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = os.environ.get("BENCH_TAG", "")
    path = out_dir / f"{name}_{datetime.date.today().isoformat()}{tag}.json"
    record = {"command": "python " + " ".join(sys.argv), "git_sha": git_sha(),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "notes": notes, "rows": rows}
    atomic_write_json(path, record)
    return path


def print_table(rows: list[dict], columns: list[str]) -> None:
    print(" | ".join(columns))
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column, "")
            cells.append(f"{value:.3g}" if isinstance(value, float) else str(value))
        print(" | ".join(cells))
