"""Where a chunk-recurrent training step makes the host wait for the GPU, on the GPU.

    python benchmarks/host_syncs.py --model small --seq 128k --chunk 32k --compile

A host sync (``.item()``, a device-to-host copy, an op that sizes its output from device data such as CUDA's
``bincount`` or ``nonzero``) drains the launch queue: the GPU then idles while the host launches the next kernels
one by one, and at 512k the profiled steps were busy only 53 % (`small`) and 71 % (`base`) of their wall time
(benchmarks/results/profile_chunked_*_512k_2026-12-02*.json). After a warm-up step (compiles), one step runs under
``torch.cuda.set_sync_debug_mode("warn")``; every sync's Python stack is kept and counted by the innermost frame in
genolc (and by the innermost frame overall). Syncs inside autograd's backward surface at the ``backward`` call.
Steps without the debug mode (``--timed``) give the wall time. ``--routing`` runs the recorded step as `finetune`
runs its steps, with every MoE layer's routing tallied for the metrics (genolc.routing.capture_routing, read after
the step), and the timed steps alternate without and with it, in one process. JSON (command, git SHA, device) goes
to $OUT or benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_bench_common import git_sha  # noqa: E402
from profile_chunked_step import timed_step  # noqa: E402

from genolc.model import build_model, preset  # noqa: E402
from genolc.train.apply import apply_compile, apply_recompute, apply_stream_dtype  # noqa: E402
from genolc.errors import ConfigError  # noqa: E402
from genolc.routing import capture_routing, routing_summary  # noqa: E402
from genolc.units import parse_length  # noqa: E402

SYNC_WARNING = "synchronizing CUDA operation"


def _frame_label(frame: traceback.FrameSummary) -> str:
    path = frame.filename
    for marker in ("/genolc/", "/site-packages/", "/site/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{frame.lineno} ({frame.name}): {(frame.line or '').strip()[:100]}"


def sync_sites(stacks: list[list[traceback.FrameSummary]]) -> dict:
    """Counts of the recorded syncs by their innermost genolc frame and by their innermost frame of all."""
    by_genolc: Counter = Counter()
    by_innermost: Counter = Counter()
    for stack in stacks:
        frames = [f for f in stack if "warnings.py" not in f.filename and "host_syncs.py" not in f.filename]
        ours = [f for f in frames if "/genolc/" in f.filename and "/benchmarks/" not in f.filename]
        by_genolc[_frame_label(ours[-1]) if ours else "(outside genolc)"] += 1
        by_innermost[_frame_label(frames[-1]) if frames else "(no frame)"] += 1
    return {"syncs": len(stacks),
            "by_genolc_line": [{"site": k, "count": v} for k, v in by_genolc.most_common()],
            "by_innermost_line": [{"site": k, "count": v} for k, v in by_innermost.most_common(40)]}


def _step(model, length: int, chunk: int, routing: bool) -> dict:
    """One timed step; with ``routing`` under finetune's routing tallies, their figures read after it."""
    if not routing:
        return {**timed_step(model, length, chunk), "routing": False}
    with capture_routing(model, training=True) as tallies:
        row = timed_step(model, length, chunk)
    summary = routing_summary(tallies)
    return {**row, "routing": True, "routed_layers": len(summary)}


def _recorded_step(model, length: int, chunk: int, routing: bool) -> tuple[dict, list]:
    stacks: list[list[traceback.FrameSummary]] = []
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message):
            stacks.append(traceback.extract_stack())
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            row = _step(model, length, chunk, routing)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = shown
    return row, stacks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq", default="128k")
    parser.add_argument("--chunk", default="32k")
    parser.add_argument("--warmup-seq", default="64k")
    parser.add_argument("--recompute", action="store_true", help="per-layer recompute inside the chunks")
    parser.add_argument("--compile", action="store_true", help="torch.compile the glue, as finetune does on CUDA")
    parser.add_argument("--timed", type=int, default=2, help="steps timed without the debug mode")
    parser.add_argument("--stream-dtype", default="bfloat16", choices=("float32", "bfloat16"),
                        help="mHC's residual streams (finetune's --stream-dtype; bfloat16 as its default on CUDA)")
    parser.add_argument("--no-record", action="store_true", help="time the steps only (no step in the debug mode)")
    parser.add_argument("--routing", action="store_true", help="tally the MoE routing as finetune does: the "
                        "recorded step with it, the timed steps alternately without and with it")
    parser.add_argument("--name", default="", help="suffix of the result file")
    args = parser.parse_args()
    try:
        seq, chunk, warmup_seq = (parse_length(args.seq, "--seq"), parse_length(args.chunk, "--chunk"),
                                  parse_length(args.warmup_seq, "--warmup-seq"))
    except ConfigError as error:
        parser.error(str(error))
    if not torch.cuda.is_available():
        parser.error("needs CUDA: this counts the GPU step's host syncs")
    out_dir = Path(os.environ.get("OUT", Path(__file__).resolve().parent / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"host_syncs_{args.model}_{args.seq}{'_' + args.name if args.name else ''}.json"
    record = {"command": "python benchmarks/host_syncs.py " + " ".join(sys.argv[1:]), "git_sha": git_sha(),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
              "compile": args.compile, "recompute": args.recompute, "stream_dtype": args.stream_dtype,
              "routing": args.routing, "steps": []}
    torch.manual_seed(0)
    model = build_model(preset(args.model), device="cuda")
    if args.recompute:
        apply_recompute(model)
    if args.stream_dtype != "float32":
        apply_stream_dtype(model, torch.bfloat16)
    if args.compile:
        apply_compile(model)
    record["steps"].append({"phase": "warm-up", **_step(model, warmup_seq, chunk, args.routing)})
    stacks: list = []
    if not args.no_record:
        row, stacks = _recorded_step(model, seq, chunk, args.routing)
        record["steps"].append({"phase": "recorded (sync debug mode)", **row})
    for index in range(args.timed):
        record["steps"].append({"phase": "timed", **_step(model, seq, chunk, args.routing and index % 2 == 1)})
    if not args.no_record:
        record.update(sync_sites(stacks))
    record["chunks"] = -(-seq // chunk)
    path.write_text(json.dumps(record, indent=1))
    for step in record["steps"]:
        print(json.dumps(step), flush=True)
    if args.no_record:
        print(f"wrote {path}")
        return
    print(f"{record['syncs']} syncs in one step of {record['chunks']} chunks, by genolc line:")
    for site in record["by_genolc_line"][:25]:
        print(f"  {site['count']:6d}  {site['site']}")
    print("by innermost line:")
    for site in record["by_innermost_line"][:25]:
        print(f"  {site['count']:6d}  {site['site']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
