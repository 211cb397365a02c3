"""How far a profiled training step is from an MFU target, and what would have to vanish for it to get there.

    python benchmarks/mfu_ceiling.py benchmarks/results/X/profile_chunked_base_512k_compiled.json [--target 0.25]

Reads the record `profile_chunked_step.py` writes (its profiled step: window, wall seconds, GPU time by kernel kind
and the longest kernels) and counts the step's model FLOPs as the trainer's MFU does (genolc/train/flops.py, the
device's bf16 peak from its table). It reports:

- the measured MFU, and the wall seconds the step would need for ``--target``;
- the GEMMs' seconds, and the share of the bf16 peak they reach on the dense part's hardware FLOPs (every forward
  the step runs: the chunked step's fill pass, and recompute's, count);
- the MFU if whole kinds of kernels took no time at all, removed one after another, largest first. The DSA sparse
  attention's backward (kernels named ``sparse_latent_bwd``, summed from the record's list of its longest kernels:
  profile with ``--top`` 30 or more so that they are all in it) is taken out of its kind and removed on its own. This
  assumes nothing about how fast any kernel could be made: each row is an upper bound (the wall shrinks by at most
  the removed kernels' time, and copies that overlap compute would shrink it by less; it never falls below the
  GEMMs').

``--peak-tflops P`` divides by ``P`` TFLOP/s instead of the vendor's peak. The issue that set the MFU goals (14)
divided by 798, the dense bf16 rate measured on the H200 on 2026-11-30; genolc's trainer divides by the vendor's
989, so its MFU is 798/989 = 0.81 of the issue's for the same step. ``--json FILE`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from genolc.errors import ConfigError  # noqa: E402
from genolc.model import preset  # noqa: E402
from genolc.train.flops import device_peak_flops, fill_fraction, token_flops  # noqa: E402
from genolc.units import parse_length  # noqa: E402

GEMM_KIND = "gemm (cuBLAS/CUTLASS)"
DSA_KIND = "dsa/indexer (TileLang/Triton)"
DSA_BACKWARD = "DSA sparse backward (sparse_latent_bwd*)"
DSA_REST = "DSA forward and indexer (the rest of its kind)"


class RecordError(Exception):
    """The file is not a profile record this script can read."""


def profiled_step(record: dict, where: str) -> dict:
    """The record's profiled step (its ``phase`` is ``profiled``), with the fields the ceiling needs."""
    if not isinstance(record, dict) or not isinstance(record.get("steps"), list):
        raise RecordError(f"{where}: not a profile record (a JSON object with a list of steps); give a file that "
                          f"profile_chunked_step.py wrote")
    steps = [step for step in record["steps"] if isinstance(step, dict) and step.get("phase") == "profiled"]
    if not steps:
        raise RecordError(f"{where}: no profiled step in this record; profile_chunked_step.py writes one with "
                          f"--profile-chunk (a --rows run has none)")
    step = steps[-1]
    missing = [key for key in ("seq", "seconds", "kernel_kinds", "top_kernels") if key not in step]
    if missing:
        raise RecordError(f"{where}: the profiled step lacks {', '.join(missing)}; rerun profile_chunked_step.py "
                          f"(records before 2026-12-01 did not keep kernel kinds)")
    return step


def ceiling(record: dict, target: float, where: str, peak_flops: float | None = None) -> dict:
    """The numbers of the module docstring for one profile record; ``peak_flops``: the peak MFU divides by (None:
    the device's from genolc/train/flops.py's table)."""
    step = profiled_step(record, where)
    try:
        return _ceiling(record, step, target, where, peak_flops)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise RecordError(f"{where}: a field of its profiled step is missing or malformed ({error!r}); rerun "
                          f"profile_chunked_step.py") from None


def _ceiling(record: dict, step: dict, target: float, where: str, peak_flops: float | None) -> dict:
    peak = peak_flops or device_peak_flops(str(record.get("device") or ""))
    if peak is None:
        raise RecordError(f"{where}: device {record.get('device')!r} is not in genolc/train/flops.py's peak table")
    try:
        config = preset(record["model"])
        tokens = parse_length(str(step["seq"]))
        chunk = parse_length(str(step.get("chunk", step["seq"])))
    except (KeyError, ConfigError) as error:
        raise RecordError(f"{where}: cannot read the model or the window: {error}") from None
    # The last chunk skips the fill pass since ee51290 (session 33); earlier records ran it, counted here as later.
    fill = fill_fraction(tokens, chunk)
    flops = token_flops(config, tokens, recompute=bool(record.get("recompute")), chunk_fill=fill,
                        selections_kept=True, attention_kept=record.get("kept_attention") == "host")
    model_flops = flops.model * tokens
    seconds = float(step["seconds"])
    kinds = {row["kind"]: row["device_ms"] / 1e3 for row in step["kernel_kinds"]}
    backward = sum(row["device_ms"] for row in step["top_kernels"]
                   if row["name"].startswith("sparse_latent_bwd")) / 1e3
    if DSA_KIND in kinds:
        kinds[DSA_BACKWARD] = backward
        kinds[DSA_REST] = kinds.pop(DSA_KIND) - backward
    gemm = kinds.pop(GEMM_KIND, 0.0)
    gemm_flops = flops.dense_forward * (3 + flops.extra_forwards) * tokens

    def mfu(wall: float) -> float:
        return model_flops / wall / peak if wall > 0 else float("inf")

    removed, rows = 0.0, []
    for kind, kind_seconds in sorted(kinds.items(), key=lambda item: -item[1]):
        removed += kind_seconds
        # The wall cannot fall below the GEMMs' own time, whatever else goes.
        wall = max(seconds - removed, gemm)
        rows.append({"without": kind, "kind_seconds": round(kind_seconds, 3), "wall_at_least": round(wall, 3),
                     "mfu_at_most": round(mfu(wall), 4)})
    target_seconds = model_flops / (target * peak)
    return {"profile": where, "git_sha": record.get("git_sha"), "device": record.get("device"),
            "model": record["model"], "seq": step["seq"], "chunk": step.get("chunk"),
            "model_tflops": round(model_flops / 1e12, 1), "peak_tflops": peak / 1e12,
            "seconds": seconds, "kernel_seconds": round(sum(kinds.values()) + gemm, 3), "mfu": round(mfu(seconds), 4),
            "target": target, "target_seconds": round(target_seconds, 3),
            "gemm_seconds": round(gemm, 3), "gemm_peak_share": round(gemm_flops / gemm / peak, 3) if gemm else None,
            "non_gemm_seconds": round(seconds - gemm, 3), "non_gemm_budget": round(target_seconds - gemm, 3),
            "removed_largest_first": rows}


def markdown(result: dict) -> str:
    r = result
    share = "no GEMM kernels, so no share" if r["gemm_peak_share"] is None else f"{r['gemm_peak_share']:.0%}"
    lines = [f"{r['model']} at {r['seq']} ({r['chunk']} chunks), {r['profile']} (git {r['git_sha']}, {r['device']})",
             "",
             f"- step {r['seconds']} s, {r['model_tflops']} TFLOP of model FLOPs: MFU {r['mfu']:.2%} of "
             f"{r['peak_tflops']:.0f} TFLOP/s; {r['target']:.0%} needs {r['target_seconds']} s",
             f"- GEMMs {r['gemm_seconds']} s ({share} of the peak on the dense part's hardware "
             f"FLOPs); everything else {r['non_gemm_seconds']} s, where {r['target']:.0%} leaves "
             f"{r['non_gemm_budget']} s",
             "", "| without (cumulative) | its seconds | wall at least | MFU at most |", "|---|---|---|---|"]
    lines += [f"| {row['without']} | {row['kind_seconds']} | {row['wall_at_least']} | {row['mfu_at_most']:.1%} |"
              for row in r["removed_largest_first"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profiles", nargs="+", help="records written by profile_chunked_step.py")
    parser.add_argument("--target", type=float, default=0.25, help="MFU to measure the distance to (0-1)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="divide by this peak, in TFLOP/s (default: the device's vendor peak; issue 14 used 798)")
    parser.add_argument("--json", default="", help="also write the numbers to this file")
    args = parser.parse_args()
    if not 0 < args.target <= 1:
        parser.error(f"--target {args.target}: give a fraction of the peak, above 0 and at most 1 (e.g. 0.25)")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        parser.error(f"--peak-tflops {args.peak_tflops}: give the peak in TFLOP/s, above 0 (e.g. 798)")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"--json {args.json}: its folder does not exist; create it or write the file elsewhere")
    results = []
    for name in args.profiles:
        try:
            record = json.loads(Path(name).read_text())
            results.append(ceiling(record, args.target, name,
                                   args.peak_tflops * 1e12 if args.peak_tflops is not None else None))
        except OSError as error:
            parser.error(f"{name}: cannot read it ({error.strerror}); give a profile_chunked_step.py record")
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            parser.error(f"{name}: not JSON ({error}); give a profile_chunked_step.py record")
        except RecordError as error:
            parser.error(str(error))
    print("\n\n".join(markdown(result) for result in results))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(results, indent=1))
        except OSError as error:
            parser.error(f"--json {args.json}: cannot write it ({error.strerror})")


if __name__ == "__main__":
    main()
