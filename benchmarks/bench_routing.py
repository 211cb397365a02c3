"""The MoE routing report of a `small` checkpoint on real held-out DNA at 4k/64k/512k (`genolc eval --routing`).

    python benchmarks/bench_routing.py --fasta .gpudata/GRCh37_chrX_1-24000000.fa.gz --heldout X:1-8000000 \
        --model small --lengths 4k,64k,512k [--max-tokens 512k] [--checkpoint CKPT] [--timeout 300]

Prepares ``--fasta`` once (char tokenizer, ``--heldout`` held out) into a temporary directory, writes a freshly
initialised ``--model`` checkpoint with the dataset's tokenizer unless ``--checkpoint`` is given (a trained one
shows trained routing; a fresh init shows the routing of random router weights, a reference point), then runs the
real command ``genolc eval --routing heldout --seq LENGTHS --max-tokens N`` in its own process: the same held-out
bases cut into windows of each length, every MoE layer's routing tallied in dispatch groups of 64k tokens.

A result holds the command's wall seconds and peak GPU memory (``torch.cuda.max_memory_allocated``), seconds and
tokens/s per length (the first length's seconds include compiling any kernel not compiled before), and per length
the mean and worst over layers of busiest/mean, router entropy and the drop share at each capacity factor; the
report's routing.json, routing.csv and routing_load.png are copied beside it.
Results: ``$OUT/routing_<date><BENCH_TAG>.json`` (benchmarks/results by default) with command, git SHA, device.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_long_context import EVAL_CHECKPOINT_SCRIPT, run_child  # noqa: E402
from genolc.units import format_length, parse_length  # noqa: E402
from prepared import add_dataset_options, dataset_for  # noqa: E402

PROBE = ("import torch, runpy, sys; sys.argv = sys.argv[1:]; import atexit; "
         "atexit.register(lambda: print('PEAK_GPU_GIB', torch.cuda.max_memory_allocated() / 2**30 "
         "if torch.cuda.is_available() else 0.0)); runpy.run_module('genolc.cli', run_name='__main__')")


def length_figures(layers: dict, tokens: int, seconds: float | None) -> dict:
    """Mean and worst over MoE layers of one context length's routing figures."""
    busiest = [f["busiest_over_mean"] for f in layers.values()]
    entropy = [f["router_entropy"] for f in layers.values()]
    factors = next(iter(layers.values()))["drop_share"]
    out = {"moe_layers": len(layers), "busiest_over_mean_mean": round(sum(busiest) / len(busiest), 4),
           "busiest_over_mean_max": round(max(busiest), 4),
           "router_entropy_mean": round(sum(entropy) / len(entropy), 4),
           "drop_share_mean": {c: round(sum(f["drop_share"][c] for f in layers.values()) / len(layers), 4)
                               for c in factors},
           "drop_share_max": {c: round(max(f["drop_share"][c] for f in layers.values()), 4) for c in factors}}
    if seconds:
        out.update(seconds=seconds, tokens_per_s=round(tokens / seconds, 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_options(parser, data_help="a prepared dataset with held-out records")
    parser.add_argument("--heldout", default="X:1-8000000", help="prepare's --heldout (with --fasta)")
    parser.add_argument("--model", default="small")
    parser.add_argument("--checkpoint", type=Path, default=None, help="report this checkpoint's routing instead")
    parser.add_argument("--lengths", default="4k,64k,512k")
    parser.add_argument("--max-tokens", default="512k", help="tokens routed per length (eval's --max-tokens)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the eval command")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    row: dict = {"model": args.model, "lengths": args.lengths}
    with tempfile.TemporaryDirectory(prefix="genolc-routing-") as tmp:
        work = Path(tmp)
        data = dataset_for(args.data, args.fasta, args.heldout, work, env)
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = work / f"{args.model}-init"
            made = subprocess.run([sys.executable, "-c", EVAL_CHECKPOINT_SCRIPT, str(data), args.model,
                                   str(checkpoint)], env=env, cwd=ROOT, capture_output=True, text=True)
            if made.returncode:
                sys.exit(f"could not write the {args.model} checkpoint: {made.stderr[-2000:]}")
        report = work / "routing"
        argv = [sys.executable, "-c", PROBE, "genolc", "eval", "--routing", "heldout", "--data", str(data),
                "--checkpoint", str(checkpoint), "--seq", args.lengths, "--max-tokens", args.max_tokens,
                "--out", str(report), "--no-progress"]
        code, tail, wall, rss = run_child(argv, env, args.timeout)
        row.update(exit_code=code, ok=code == 0, wall_seconds=round(wall, 1), host_peak_rss_gib=round(rss, 2))
        peaks = [line for line in tail.splitlines() if line.startswith("PEAK_GPU_GIB ")]
        if peaks:
            row["peak_gpu_gib"] = round(float(peaks[-1].split()[1]), 2)
        if code == 0:
            summary = json.loads((report / "routing.json").read_text())
            tokens = summary["tokens_per_length"]
            seconds = summary.get("seconds_by_length", {})
            row["tokens_per_length"] = tokens
            row["by_length"] = {length: length_figures(layers, tokens, seconds.get(length))
                                for length, layers in summary["routing"].items()}
            tag = os.environ.get("BENCH_TAG", "")
            for name in ("routing.json", "routing.csv", "routing_load.png"):
                shutil.copy(report / name, out_dir / f"routing_{args.model}{tag}_{name}")
        else:
            row["error"] = tail[-2000:]
        print(json.dumps({k: v for k, v in row.items() if k != "error"}, indent=1), flush=True)
        if "error" in row:
            print(row["error"], flush=True)
    write(out_dir, row, args, time.monotonic() - started)


def write(out_dir: Path, row: dict, args, seconds: float) -> None:
    import datetime

    import torch

    from gpu_bench_common import git_sha

    path = out_dir / f"routing_{datetime.date.today().isoformat()}{os.environ.get('BENCH_TAG', '')}.json"
    record = {"command": "python " + " ".join(sys.argv), "git_sha": git_sha(),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "seconds": round(seconds, 1),
              "notes": {"checkpoint": str(args.checkpoint) if args.checkpoint else
                        f"fresh {args.model} init (random router weights), char tokenizer",
                        "lengths": [format_length(parse_length(x)) for x in args.lengths.split(",")]},
              "rows": [row]}
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
