"""Where a chunk-recurrent training step spends its time, on the GPU.

    python benchmarks/profile_chunked_step.py --model base --seq 256k --chunks 8k,32k --profile-chunk 8k

One chunked forward+backward (genolc.train.chunked, bf16 autocast, fast kernels; the indexer KL and the MoE balance
loss off, as `genolc finetune` runs by default, or on with ``--indexer sparse --moe-balance 0.01``) per entry of
``--chunks`` (or per ``--rows`` pair of window and chunk: ``--rows 512k:16k,1M:32k --profile-chunk ''``
measures the peaks that genolc/train/plan.py is fitted to, in one process), timed wall to wall after a warm-up
step at ``--warmup-seq`` that compiles the kernels (each timed row also gives AdamW's state, which ``finetune`` adds
to the peak, and genolc/train/plan.py's estimate for the step);
optionally one step at ``--memory-chunk`` with the CUDA allocator's history recorded (the peak and what was alive
then, by the genolc source line that allocated it); then one step at ``--profile-chunk`` under torch.profiler, whose
table (top ops by device time, and the forward time of each layer class, fill and backward passes together) goes
into the result. Results (JSON with command, git SHA, device) are written to $OUT (or benchmarks/results/) after
every phase, so a run stopped at its time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_bench_common import git_sha  # noqa: E402
from profile_attribution import MODULE_RANGE, attribute_device_time, label_modules  # noqa: E402

from genolc.errors import ConfigError  # noqa: E402
from genolc.model import build_model, parameter_counts, preset  # noqa: E402
from genolc.model.ops.indexer import triton as indexer_triton  # noqa: E402
from genolc.train.apply import apply_compile, apply_recompute, apply_stream_dtype  # noqa: E402
from genolc.train.chunked import chunked_forward_backward  # noqa: E402
from genolc.train.kept_attention import KeptAttention  # noqa: E402
from genolc.train.loss import LossTerms  # noqa: E402
from genolc.train.plan import (PLAN_MARGIN, estimate_chunked_memory, kda_intermediates_device_bytes,  # noqa: E402
                               kept_attention_device_bytes)
from genolc.units import format_length, parse_length  # noqa: E402

PROFILED_CLASSES = ("KimiDeltaAttention", "DSAAttention", "DSAIndexer", "MoE", "HyperConnection", "DecoderLayer")

# Device kernels by what they are, matched in order against the kernel's name (first match wins).
KERNEL_KINDS = (
    ("compiled glue (inductor Triton)", r"^triton_"),
    ("gemm (cuBLAS/CUTLASS)", r"gemm|nvjet|cutlass|xmma|cublas|wgmma|sm90_|splitK"),
    ("mhc (Triton)", r"^comb_|^mixing_logits|^merge_(forward|backward)_kernel$"),
    # fla's TileLang KDA backward is named `kernel` (its launch `kernel_kernel`, one call per KDA layer and chunk).
    ("kda (fla Triton and TileLang, depthwise conv)",
     r"kda|delta|chunk_|solve_tril|merge_16x16|recompute_w_u|l2norm|cumsum|causal_conv|conv1d|conv_depthwise|conv_silu"
     r"|^kernel_kernel$"),
    ("dsa/indexer (TileLang/Triton)",
     r"tilelang|main_kernel|dsa|sparse|indexer|topk_|pool|candidates_kernel|select_kernel|group_tops|floors_kernel"),
    ("sort/top-k/scan (torch)", r"sort|topk|radix|scan|bitonic|gather_topk|histogram"),
    ("copy/cast/cat", r"copy|memcpy|memset|cat_|CatArray|fill|contiguous"),
    ("reduction (torch)", r"reduce|norm_kernel|softmax|sum_"),
    ("elementwise (torch)", r"elementwise|vectorized|unrolled|index|scatter|gather|where"),
)


def _window(length: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (1, length + 1), generator=generator).to(device)
    return ids, torch.ones(1, length, device=device)


def timed_step(model, length: int, chunk: int, indexer: str | None = None, moe_balance: float = 0.0,
               kept_attention: KeptAttention | None = None, keep_kda_intermediates: bool = False) -> dict:
    ids, weights = _window(length, "cuda")
    terms = LossTerms(total_weight=float(length), grad_accum=1, moe_balance_coef=moe_balance, indexer_kl_coef=1.0,
                      indexer_mode=indexer)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = chunked_forward_backward(model, ids, weights, terms, chunk,
                                      lambda: torch.autocast("cuda", dtype=torch.bfloat16),
                                      kept_attention=kept_attention, keep_kda_intermediates=keep_kda_intermediates)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    passes = {name: round(value, 3) for name, value in result.pass_seconds().items()}
    return {"seq": format_length(length), "chunk": format_length(chunk), "seconds": round(seconds, 2),
            "tokens_per_s": round(length / seconds, 1), "lm": float(result.lm), **passes,
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)}


def plan_columns(config, length: int, chunk: int, recompute: bool, fp32_streams: bool, kept: bool = False,
                 kda_kept: bool = False) -> dict:
    """Beside a timed step's peak: AdamW's state, which ``finetune`` holds and this script does not (8 bytes a
    parameter), their sum, and what genolc/train/plan.py estimates for that step (margin included), so that each run
    measures the plan against the code it runs."""
    adamw = 8 * parameter_counts(config).total / 2 ** 30
    plan = estimate_chunked_memory(config, seq_len=length, chunk=chunk, recompute=recompute, fast_kernels=True,
                                   fp32_streams=fp32_streams)
    # Keeping the DSA forwards adds what the step strategy plans for them (genolc/train/strategy.py).
    extra = kept_attention_device_bytes(config, chunk=chunk, recompute=recompute) * PLAN_MARGIN if kept else 0
    if kda_kept:
        extra += kda_intermediates_device_bytes(config, chunk=chunk, recompute=recompute) * PLAN_MARGIN
    return {"adamw_state_gib": round(adamw, 2), "plan_gib": round((plan.total + extra) / 2 ** 30, 2)}


def peak_allocations(snapshot: dict, top: int) -> dict:
    """From a CUDA memory snapshot with history (torch.cuda.memory._snapshot()), the moment the most bytes were
    allocated and what was alive then, summed by the innermost genolc source line that allocated it."""
    trace = [event for events in snapshot.get("device_traces", []) for event in events]
    live, total, peak, peak_at = {}, 0, 0, -1
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event["size"]
            total += event["size"]
            if total > peak:
                peak, peak_at = total, index
        elif event["action"] in ("free_completed",) and event["addr"] in live:
            total -= live.pop(event["addr"])
    alive: dict[int, dict] = {}
    for event in trace[: peak_at + 1]:
        if event["action"] == "alloc":
            alive[event["addr"]] = event
        elif event["action"] == "free_completed":
            alive.pop(event["addr"], None)
    by_line: dict[str, list[int]] = {}
    for event in alive.values():
        frames = event.get("frames") or []
        ours = [f for f in frames if "/genolc/" in f.get("filename", "") or "benchmarks/" in f.get("filename", "")]
        where = ours[0] if ours else (frames[0] if frames else {"filename": "?", "line": 0, "name": "?"})
        key = f"{where['filename'].split('/genolc/')[-1]}:{where['line']} {where['name']}"
        entry = by_line.setdefault(key, [0, 0])
        entry[0] += event["size"]
        entry[1] += 1
    ranked = sorted(by_line.items(), key=lambda item: -item[1][0])[:top]
    # Bytes allocated before recording started are not in the trace: the result is what the recorded step added.
    return {"peak_recorded_gib": round(peak / 2 ** 30, 2),
            "alive_at_peak": [{"where": k, "gib": round(v[0] / 2 ** 30, 3), "blocks": v[1]} for k, v in ranked]}


def _memory_step(model, length: int, chunk: int, top: int, **loss) -> dict:
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
    try:
        row = timed_step(model, length, chunk, **loss)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    row.update(peak_allocations(snapshot, top))
    return row


def _label_forwards(model) -> list:
    """record_function ranges around every forward of the PROFILED_CLASSES modules (fill and backward passes)."""
    return label_modules(model, lambda path, module: f"forward:{type(module).__name__}"
                         if type(module).__name__ in PROFILED_CLASSES else None)


def _profiled_step(model, length: int, chunk: int, top: int, kernels_only: bool = False, attribute: bool = False,
                   **loss) -> dict:
    # Kernels only: no host-side op events (each aten call is one), so a 512k step's trace stays small enough to
    # record and sum within a device call; the per-layer ranges are then empty and the op tables list kernels.
    # attribute: every submodule's forward in a range of its own and Python calls recorded (with_stack), so each
    # kernel is charged to the module and genolc function that launched it (profile_attribution.py); the trace
    # grows by every call, so use it on short windows.
    handles = [] if kernels_only else _label_forwards(model)
    if attribute and not kernels_only:
        handles += label_modules(model)
    activities = ([torch.profiler.ProfilerActivity.CUDA] if kernels_only
                  else [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
    try:
        with torch.profiler.profile(activities=activities, with_stack=attribute and not kernels_only) as profiler:
            row = timed_step(model, length, chunk, **loss)
    finally:
        for handle in handles:
            handle.remove()
    if attribute and not kernels_only:
        by_source, charged_us = attribute_device_time(profiler.events())
        row.update(by_source=by_source[:3 * top], by_source_charged_ms=round(charged_us / 1e3, 1))
    events = profiler.key_averages()

    def device_us(event) -> float:
        return float(getattr(event, "device_time_total", 0.0) or getattr(event, "cuda_time_total", 0.0))

    def entry(event) -> dict:
        return {"name": event.key[:120], "calls": event.count, "device_ms": round(device_us(event) / 1e3, 1),
                "cpu_ms": round(event.cpu_time_total / 1e3, 1),
                "self_cpu_ms": round(event.self_cpu_time_total / 1e3, 1)}

    # The record_function ranges also appear as device-side spans (CUDA annotations): not kernels.
    def labelled(event) -> bool:
        return event.key.startswith(("forward:", MODULE_RANGE))

    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA") and not labelled(e)]
    kernel_us = sum(float(e.self_device_time_total) for e in kernels)
    kinds: dict[str, list[float]] = {}
    for event in kernels:
        kind = next((name for name, pattern in KERNEL_KINDS if re.search(pattern, event.key, re.IGNORECASE)),
                    "other")
        kinds.setdefault(kind, [0.0, 0])
        kinds[kind][0] += float(event.self_device_time_total)
        kinds[kind][1] += event.count
    row.update(kernel_seconds=round(kernel_us / 1e6, 3),
               gpu_busy_fraction=round(kernel_us / 1e6 / row["seconds"], 3),
               kernel_kinds=[{"kind": k, "device_ms": round(v[0] / 1e3, 1), "kernels": v[1],
                              "share": round(v[0] / max(kernel_us, 1e-9), 3)}
                             for k, v in sorted(kinds.items(), key=lambda item: -item[1][0])],
               top_kernels=[{"name": e.key[:120], "calls": e.count,
                             "device_ms": round(float(e.self_device_time_total) / 1e3, 1)}
                            for e in sorted(kernels, key=lambda e: -float(e.self_device_time_total))[:top]])
    ranges = [entry(e) for e in events if e.key.startswith("forward:")]
    ops = sorted((e for e in events if not labelled(e)), key=device_us, reverse=True)
    by_cpu = sorted((e for e in events if not labelled(e)),
                    key=lambda e: e.self_cpu_time_total, reverse=True)
    row.update(forward_ranges=sorted(ranges, key=lambda r: -r["device_ms"]),
               top_device_ops=[entry(e) for e in ops[:top]], top_self_cpu_ops=[entry(e) for e in by_cpu[:top]])
    return row


def _torch_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return found is not None and (int(found[1]), int(found[2])) >= (major, minor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="base")
    parser.add_argument("--seq", default="256k")
    parser.add_argument("--chunks", default="8k,32k", help="one timed step per chunk length")
    parser.add_argument("--rows", default="", help="timed steps as SEQ:CHUNK pairs (e.g. 512k:16k,1M:32k) instead of "
                        "--seq with each of --chunks: the peaks a refit of genolc/train/plan.py needs, one process")
    parser.add_argument("--profile-chunk", default="8k", help="chunk length of the profiled step ('' for none)")
    parser.add_argument("--profile-seq", default="", help="window of the profiled step (default: --seq)")
    parser.add_argument("--warmup-seq", default="32k")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--recompute", action="store_true", help="per-layer recompute inside the chunks")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the per-token glue (genolc.train.apply.apply_compile, finetune's default "
                             "on CUDA); the warm-up step then includes compiling")
    parser.add_argument("--indexer", default="off", choices=("off", "dense", "sparse"),
                        help="the indexer KL's mode (finetune's --indexer; default off, as finetune)")
    parser.add_argument("--moe-balance", type=float, default=0.0, help="weight of the MoE balance loss")
    parser.add_argument("--stream-dtype", default="bfloat16", choices=("float32", "bfloat16"),
                        help="mHC's residual streams (finetune's --stream-dtype; bfloat16 as its default on CUDA)")
    parser.add_argument("--profile-kernels-only", action="store_true",
                        help="record device kernels only (no host ops or layer ranges): for 512k and longer, whose "
                             "full traces take minutes to record and sum")
    parser.add_argument("--attribute", action="store_true",
                        help="also charge each kernel of the profiled step to the module whose forward launched it "
                             "(and the genolc function, where the profiler records Python calls), forward and "
                             "backward apart: short windows only")
    parser.add_argument("--init", default="device", choices=("device", "cpu"),
                        help="where the model is initialised: on the GPU from the meta device, as finetune does "
                             "(default), or on the CPU and then moved")
    parser.add_argument("--memory-chunk", default="", help="chunk length of a step whose CUDA allocations are "
                        "recorded: what was alive at its peak, by allocating source line ('' for none)")
    parser.add_argument("--kept-attention", default="host",
                        help="the DSA forwards of the first pass kept in host memory for the second ('host', what "
                             "finetune does where its plan allows) or computed again ('off'); 'off,host' times each "
                             "--rows step both ways and profiles the last")
    parser.add_argument("--kda-intermediates", default="recompute",
                        help="fla's KDA intermediates computed again in the chunks' backward ('recompute') or kept "
                             "from the second pass's forward ('keep', what finetune does where its plan allows); "
                             "'recompute,keep' times each --rows step (and --kept-attention mode) both ways and "
                             "profiles the last")
    parser.add_argument("--score-group-tops", action="store_true",
                        help="the indexer's selection scores with the kernel that also writes the top-k's first read "
                             "(genolc.model.ops.indexer.triton.SCORE_GROUP_TOPS; off in finetune until timed here)")
    args = parser.parse_args()
    kept_modes = args.kept_attention.split(",")
    if not kept_modes or any(mode not in ("off", "host") for mode in kept_modes):
        parser.error(f"--kept-attention takes off, host or both separated by a comma, got {args.kept_attention!r}")
    kda_modes = args.kda_intermediates.split(",")
    if not kda_modes or any(mode not in ("recompute", "keep") for mode in kda_modes):
        parser.error(f"--kda-intermediates takes recompute, keep or both separated by a comma, got "
                     f"{args.kda_intermediates!r}")
    try:
        seq = parse_length(args.seq)
        chunks = [parse_length(c) for c in args.chunks.split(",") if c]
        rows = [(seq, chunk) for chunk in chunks]
        if args.rows:
            pairs = [pair.split(":") for pair in args.rows.split(",") if pair]
            if not pairs or any(len(pair) != 2 for pair in pairs):
                parser.error(f"--rows takes SEQ:CHUNK pairs separated by commas, got {args.rows!r}")
            rows = [(parse_length(length), parse_length(chunk)) for length, chunk in pairs]
            chunks = [chunk for _, chunk in rows]
    except ConfigError as error:
        parser.error(f"a length in --seq, --chunks or --rows: {error.message}")
    if args.attribute and not args.profile_chunk:
        parser.error("--attribute charges the profiled step's kernels: give it one with --profile-chunk")
    if args.attribute and args.profile_kernels_only:
        parser.error("--attribute needs the host-side events that --profile-kernels-only leaves out: pass one of them")
    if args.memory_chunk and args.compile and args.recompute and _torch_at_least(2, 11):
        # Seen on the H200 2026-12-02: the recorded step died with "SystemError: <built-in method apply of
        # FunctionMeta object> returned NULL without setting an exception", a regression in torch 2.11.
        parser.error("--memory-chunk cannot record a compiled, recomputed step on torch >= 2.11 (the allocator's "
                     "history breaks checkpointed compiled regions: pytorch/pytorch#179536); record it in an eager run "
                     "(without --compile) or without --recompute")
    out_dir = Path(os.environ.get("OUT", Path(__file__).resolve().parent / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"command": "python benchmarks/profile_chunked_step.py " + " ".join(sys.argv[1:]), "git_sha": git_sha(),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
              "recompute": args.recompute, "compile": args.compile, "init": args.init, "indexer": args.indexer,
              "moe_balance": args.moe_balance, "stream_dtype": args.stream_dtype,
              "kept_attention": args.kept_attention, "kda_intermediates": args.kda_intermediates,
              "score_group_tops": args.score_group_tops or indexer_triton.SCORE_GROUP_TOPS, "steps": []}
    stem = (f"peaks_{args.model}{'_recompute' if args.recompute else ''}" if args.rows
            else f"profile_chunked_{args.model}_{args.seq}")
    path = out_dir / (f"{stem}{'_compiled' if args.compile else ''}"
                      f"{'_cpu_init' if args.init == 'cpu' else ''}{'_attributed' if args.attribute else ''}"
                      f"{'_fp32_streams' if args.stream_dtype == 'float32' else ''}"
                      f"{'_score_group_tops' if args.score_group_tops else ''}.json")

    def save(row: dict) -> None:
        record["steps"].append(row)
        path.write_text(json.dumps(record, indent=1))
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}), flush=True)

    if args.score_group_tops:      # without the flag the module's default stands, whatever it is
        indexer_triton.SCORE_GROUP_TOPS = True
    torch.manual_seed(0)
    model = (build_model(preset(args.model), device="cuda") if args.init == "device"
             else build_model(preset(args.model)).cuda())
    if args.recompute:
        apply_recompute(model)
    if args.stream_dtype != "float32":
        apply_stream_dtype(model, torch.bfloat16)
    if args.compile:
        apply_compile(model)
    store = KeptAttention()
    kept = {"off": None, "host": store}
    loss = dict(indexer=None if args.indexer == "off" else args.indexer, moe_balance=args.moe_balance,
                kept_attention=kept[kept_modes[-1]], keep_kda_intermediates=kda_modes[-1] == "keep")
    # One warm-up step per KDA mode: each mode's first step compiles fla kernels the other does not run.
    for kda in dict.fromkeys(kda_modes):
        warmup = timed_step(model, parse_length(args.warmup_seq), min(chunks or [8192]),
                            **{**loss, "keep_kda_intermediates": kda == "keep"})
        save({"phase": "warm-up (compiles)", "kda_intermediates": kda, **warmup})
    for (length, chunk), mode, kda in ((row, mode, kda) for row in rows for mode in kept_modes for kda in kda_modes):
        try:
            save({"phase": "timed", "kept_attention": mode, "kda_intermediates": kda,
                  **timed_step(model, length, chunk, **{**loss, "kept_attention": kept[mode],
                                                        "keep_kda_intermediates": kda == "keep"}),
                  **plan_columns(model.config, length, chunk, args.recompute, args.stream_dtype == "float32",
                                 kept=mode == "host", kda_kept=kda == "keep")})
            continue
        except torch.OutOfMemoryError as error:
            # A chunk length tried for its memory: record that it does not fit and go on to the next phases.
            failure = str(error).splitlines()[0][:300]
        # Outside the handler, whose traceback holds the failed step's tensors.
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        save({"phase": "timed", "seq": format_length(length), "chunk": format_length(chunk),
              "out_of_memory": failure})
    if args.memory_chunk:
        save({"phase": "memory", **_memory_step(model, seq, parse_length(args.memory_chunk), args.top, **loss)})
    if args.profile_chunk:
        profile_seq = parse_length(args.profile_seq or args.seq)
        row = _profiled_step(model, profile_seq, parse_length(args.profile_chunk), args.top,
                             kernels_only=args.profile_kernels_only, attribute=args.attribute, **loss)
        timed = [r for r in record["steps"]
                 if r["phase"] == "timed" and "seconds" in r and (r["seq"], r["chunk"]) == (row["seq"], row["chunk"])]
        if timed:
            # The profiler slows the host side; the unprofiled step's wall time is the fair denominator.
            row["gpu_busy_fraction_of_timed_step"] = round(row["kernel_seconds"] / timed[-1]["seconds"], 3)
        save({"phase": "profiled", **row})
        for kind in row["kernel_kinds"]:
            print(f"  {kind['kind']:32s} {kind['device_ms']:10.1f} ms  {kind['share']:.1%}", flush=True)
        for r in row["forward_ranges"]:
            print(f"  {r['name']:32s} {r['device_ms']:10.1f} ms device (forwards)", flush=True)
        for r in row.get("by_source", [])[:args.top]:
            print(f"  {r['device_ms']:10.1f} ms {r['pass']:8s} {r['module']:20s} {r['where']}", flush=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
