"""Throughput of `genolc score` and `genolc embed` on one GPU: variants/s and regions/s, peak GPU memory, by window.

    python benchmarks/bench_score.py --genome .gpudata/GRCh37_chr22_20000001-21000000.fa.gz --model small \
        --windows 8k,64k [--variants 8k:256,64k:32] [--regions 8k:64,64k:16] [--checkpoint CKPT] [--budget 240]

Each measurement runs the real command (``genolc score --vcf V --genome G --checkpoint C --window W`` and
``genolc embed --bed B --genome G --checkpoint C --out X.npy``) in its own process, after a warm-up run of the same
command on a few variants/regions, so kernel compilation and autotuning (cached on disk) are not timed. A row holds
the command's wall seconds, the seconds spent scoring (``score_variants``) or embedding (``embed_regions``) alone,
variants/s or regions/s on the latter, the peak GPU memory (``torch.cuda.max_memory_allocated``), and for score the
forward tokens run and saved by shared windows (the run record's ``outputs.forwards``).

Inputs: the reference is written as a plain FASTA (``>chr22``, the bases of ``--genome``) so pyfaidx can index it;
the VCF holds SNVs at random positions (seed 0) whose REF is an A/C/G/T of the genome, ALT another base; BED
regions of exactly the window length at random positions. The checkpoint is a freshly initialised ``--model``
(char tokenizer) unless ``--checkpoint`` is given: what is measured is speed and memory, not scores.
Results: ``$OUT/score_<date><BENCH_TAG>.json`` (benchmarks/results by default) with command, git SHA, device.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_long_context import run_child  # noqa: E402
from genolc.units import format_length, parse_length  # noqa: E402

CHECKPOINT_SCRIPT = r"""
import sys, torch
from genolc.model import build_model, preset, save_pretrained
from genolc.tokenize import CharTokenizer
name, out = sys.argv[1:3]
tokenizer = CharTokenizer()
torch.manual_seed(0)
save_pretrained(build_model(preset(name, vocab_size=tokenizer.vocab_size)), out, tokenizer=tokenizer)
"""

# Runs the genolc CLI in this child, timing the scoring/embedding function alone and printing the peak GPU memory.
PROBE = r"""
import atexit, runpy, sys, time, torch
import genolc.score.embed as embed, genolc.score.variants as variants
spent = [0.0]
def timed(function):
    def wrapper(*args, **kwargs):
        start = time.monotonic()
        try:
            return function(*args, **kwargs)
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            spent[0] += time.monotonic() - start
    return wrapper
variants.score_variants = timed(variants.score_variants)
embed.embed_regions = timed(embed.embed_regions)
atexit.register(lambda: print("PROBE", spent[0],
                              torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0))
sys.argv = sys.argv[1:]
runpy.run_module("genolc.cli", run_name="__main__")
"""


def read_bases(path: Path) -> bytes:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as fh:
        return b"".join(line.strip() for line in fh if not line.startswith(b">")).upper()


def write_inputs(bases: bytes, work: Path, window: int, n_variants: int, n_regions: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    acgt = np.isin(np.frombuffer(bases, dtype=np.uint8), np.frombuffer(b"ACGT", dtype=np.uint8))
    margin = window // 2 + 1
    candidates = np.flatnonzero(acgt[margin:len(bases) - margin]) + margin
    other = {"A": "C", "C": "G", "G": "T", "T": "A"}
    label = format_length(window)
    files = {}
    for kind, n in (("warmup", 4), ("measured", n_variants)):
        positions = np.sort(rng.choice(candidates, size=n, replace=False))
        lines = ["##fileformat=VCFv4.2", "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO"]
        lines += [f"chr22\t{p + 1}\tv{i}\t{chr(bases[p])}\t{other[chr(bases[p])]}\t.\tPASS\t."
                  for i, p in enumerate(positions)]
        files[f"vcf_{kind}"] = work / f"variants_{label}_{kind}.vcf"
        files[f"vcf_{kind}"].write_text("\n".join(lines) + "\n")
    for kind, n in (("warmup", 2), ("measured", n_regions)):
        starts = np.sort(rng.integers(0, len(bases) - window, size=n))
        files[f"bed_{kind}"] = work / f"regions_{label}_{kind}.bed"
        files[f"bed_{kind}"].write_text("".join(f"chr22\t{s}\t{s + window}\tr{i}\n" for i, s in enumerate(starts)))
    return files


def measure(argv: list[str], env: dict, timeout: float) -> dict:
    code, tail, wall, rss = run_child([sys.executable, "-c", PROBE, "genolc", *argv], env, timeout)
    row = {"exit_code": code, "wall_seconds": round(wall, 2), "host_peak_rss_gib": round(rss, 2), "ok": code == 0}
    probes = [line for line in tail.splitlines() if line.startswith("PROBE ")]
    if probes:
        seconds, peak = map(float, probes[-1].split()[1:])
        row.update(work_seconds=round(seconds, 3), peak_gpu_gib=round(peak, 2))
    if code != 0:
        row["error"] = tail[-1500:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--genome", type=Path, required=True, help="FASTA (plain or gzip) of one record")
    parser.add_argument("--model", default="small")
    parser.add_argument("--checkpoint", type=Path, default=None, help="score with this checkpoint instead")
    parser.add_argument("--windows", default="8k,64k")
    parser.add_argument("--variants", default="8k:256,64k:32", help="variants scored per window (WINDOW:N,…)")
    parser.add_argument("--regions", default="8k:64,64k:16", help="regions embedded per window (WINDOW:N,…)")
    parser.add_argument("--rc-average", action="store_true", help="pass --rc-average to score")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per command")
    parser.add_argument("--budget", type=float, default=0,
                        help="stop starting commands after this many seconds, and end any by 60 s later")
    args = parser.parse_args()

    windows = [parse_length(w, "--windows") for w in args.windows.split(",")]
    n_variants = {parse_length(k, "--variants"): int(v) for k, v in (p.split(":") for p in args.variants.split(","))}
    n_regions = {parse_length(k, "--regions"): int(v) for k, v in (p.split(":") for p in args.regions.split(","))}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="genolc-score-") as tmp:
        work = Path(tmp)
        bases = read_bases(args.genome)
        genome = work / "chr22.fa"
        genome.write_bytes(b">chr22\n" + b"\n".join(bases[i:i + 80] for i in range(0, len(bases), 80)) + b"\n")
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = work / f"{args.model}-init"
            made = run_child([sys.executable, "-c", CHECKPOINT_SCRIPT, args.model, str(checkpoint)], env, 300)
            if made[0]:
                raise SystemExit(f"could not write the {args.model} checkpoint:\n{made[1]}")
        for window in windows:
            files = write_inputs(bases, work, window, n_variants.get(window, 32), n_regions.get(window, 16), 0)
            label = format_length(window)
            for command in ("score", "embed"):
                if args.budget and time.monotonic() - started > args.budget:
                    rows.append({"command": command, "window": label, "skipped": "time budget"})
                    continue
                runs = {}
                for kind in ("warmup", "measured"):
                    out = work / f"{command}_{label}_{kind}"
                    if command == "score":
                        argv = ["score", "--vcf", str(files[f"vcf_{kind}"]), "--window", str(window),
                                "--out", str(out) + ".tsv"] + (["--rc-average"] if args.rc_average else [])
                    else:
                        argv = ["embed", "--bed", str(files[f"bed_{kind}"]), "--out", str(out) + ".npy"]
                    argv += ["--genome", str(genome), "--checkpoint", str(checkpoint), "--no-progress"]
                    # A command started inside the budget may run up to --timeout, but not past budget + 60 s.
                    left = started + args.budget + 60 - time.monotonic() if args.budget else args.timeout
                    runs[kind] = measure(argv, env, max(5.0, min(args.timeout, left)))
                    if not runs[kind]["ok"]:
                        break
                row = {"command": command, "model": args.model, "window": label, "window_bases": window,
                       **runs.get("measured", runs["warmup"]), "warmup_wall_seconds": runs["warmup"]["wall_seconds"]}
                if "measured" in runs and runs["measured"]["ok"]:
                    n = n_variants.get(window, 32) if command == "score" else n_regions.get(window, 16)
                    unit = "variants" if command == "score" else "regions"
                    row[unit] = n
                    row[f"{unit}_per_s"] = round(n / max(row["work_seconds"], 1e-9), 2)
                    row[f"{unit}_per_s_whole_command"] = round(n / row["wall_seconds"], 2)
                    if command == "score":
                        row["forwards"] = _newest_record(work, "score").get("outputs", {}).get("forwards")
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
                if "error" in row:
                    print(row["error"], flush=True)
                write(rows, args, time.monotonic() - started)   # after every row: a killed run keeps the rest
    print(f"wrote {write(rows, args, time.monotonic() - started)}")


def _newest_record(work: Path, command: str) -> dict:
    records = sorted((work / "runs").glob(f"*_{command}.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(records[-1].read_text()) if records else {}


def write(rows: list[dict], args, seconds: float) -> Path:
    import datetime

    from gpu_bench_common import git_sha

    import torch

    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"score_{datetime.date.today().isoformat()}{os.environ.get('BENCH_TAG', '')}.json"
    record = {"command": "python " + " ".join(sys.argv), "git_sha": git_sha(),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "seconds": round(seconds, 1),
              "notes": {"checkpoint": str(args.checkpoint) if args.checkpoint else f"fresh {args.model} init, char "
                        "tokenizer", "variants": "SNVs at random A/C/G/T positions of the genome (seed 0)",
                        "rates": "*_per_s: on the scoring/embedding function's seconds (model loaded, kernels "
                                 "warm); *_per_s_whole_command: on the command's wall time"},
              "rows": rows}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


if __name__ == "__main__":
    main()
