"""Does a second process load torch.compile's cache rather than compile again? (issue 14: "the caches persist in the
user's cache directory so the second run starts at once")

    python benchmarks/compile_cache_probe.py --model tiny --seq 256 --chunk 128 --cache /tmp/probe-cache

Runs this script twice, each time in a fresh process with ``TORCHINDUCTOR_CACHE_DIR=--cache`` (a new or empty
folder):
each child builds ``--model``, applies genolc.train.apply.apply_compile (what ``finetune --compile`` does) and
times two chunked training steps on CPU or CUDA (whichever ``--device`` names). The first child's first step
compiles; the second child's should only load. Writes ``$OUT/compile_cache_<model>_<device>.json`` (or
benchmarks/results/) with command, git SHA, device and both children's timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def child(model_name: str, seq: int, chunk: int, device: str) -> dict:
    started = time.monotonic()
    import torch

    from genolc.model import build_model, preset
    from genolc.train.apply import apply_compile
    from genolc.train.chunked import chunked_forward_backward
    from genolc.train.loss import LossTerms

    torch.manual_seed(0)
    model = build_model(preset(model_name)).to(device)
    apply_compile(model)
    ids = torch.randint(0, 4, (1, seq + 1), generator=torch.Generator().manual_seed(1)).to(device)
    weights = torch.ones(1, seq, device=device)
    terms = LossTerms(total_weight=float(seq), grad_accum=1, moe_balance_coef=0.0, indexer_kl_coef=1.0,
                      indexer_mode=None)
    autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device == "cuda"
                else contextlib.nullcontext)
    seconds = []
    for _ in range(2):
        step_start = time.monotonic()
        chunked_forward_backward(model, ids, weights, terms, chunk, autocast)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(round(time.monotonic() - step_start, 2))
    return {"first_step_seconds": seconds[0], "second_step_seconds": seconds[1],
            "process_seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cache", type=Path, required=True, help="torch.compile cache directory: new or empty")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.model, args.seq, args.chunk, args.device)), flush=True)
        return
    from gpu_bench_common import git_sha

    if args.cache.exists() and any(args.cache.iterdir()):
        parser.error(f"--cache {args.cache} is not empty: give a new or empty folder (the first run must compile)")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(args.cache)}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child"], env=env, capture_output=True,
                              text=True, check=True)
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
        runs.append(json.loads(line.removeprefix("RESULT ")))
        print(runs[-1], flush=True)
    size = sum(f.stat().st_size for f in args.cache.rglob("*") if f.is_file())
    record = {"command": "python benchmarks/compile_cache_probe.py " + " ".join(sys.argv[1:]), "git_sha": git_sha(),
              "device": args.device if args.device == "cpu" else __import__("torch").cuda.get_device_name(),
              "cpu_count": os.cpu_count(), "fresh_cache": runs[0], "warm_cache": runs[1],
              "cache_mib": round(size / 2 ** 20, 1)}
    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"compile_cache_{args.model}_{args.device}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
