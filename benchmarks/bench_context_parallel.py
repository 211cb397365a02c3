"""Context parallelism on several GPUs against one: tokens/s, MFU, scaling efficiency, peak GPU and host memory per
rank, first-step loss.

    python benchmarks/bench_context_parallel.py --fasta .gpudata/GRCh37_chrX_1-24000000.fa.gz \
        --models small,base --lengths 1M,2M --steps 3 [--cp 2] [--layouts zigzag,contiguous] [--recompute] \
        [--cp-kda state,heads] [--dp 2]

For each (model, length) two real commands run on the same prepared data with the same seed, so they train on the
same windows from the same weights:

    one GPU   CUDA_VISIBLE_DEVICES=0 genolc finetune --seq L --model M --steps N           (--chunk auto)
    CP        torchrun --standalone --nproc-per-node CP -m genolc.cli finetune ... --cp CP --cp-layout LAYOUT \
                  --cp-kda MODE

With ``--dp D`` the CP run is D data-parallel groups of CP ranks (D x CP processes) and the reference is D processes
without CP, one GPU per window, since each data-parallel rank samples its own windows. ``--reference-cp R`` makes the
reference R GPUs per window (where one GPU cannot hold the window or finish its steps within a device call), and the
ideal speed-up CP / R. Rows also carry the runs'
MFU and peak host memory per rank (summary.json's ``peak_host_memory_gib_ranks``).

A CP run the plan refuses (or that runs out of memory) is tried once more with ``--recompute``. A row holds both
runs' tokens/s (the last step's: the first includes kernel compilation), every step's seconds and loss, peak GPU
memory (per rank for CP, from summary.json's ``peak_memory_gib_ranks``), the scaling efficiency
``tokens/s(CP) / (CP x tokens/s(reference))`` and the first-step losses with their relative difference (bf16 autocast
in both; equal means within ``--loss-rtol``). Each run is its own process tree with a timeout; results are written
after every row to ``$OUT/context_parallel_<date><BENCH_TAG>.json`` (benchmarks/results by default) with the
command, git SHA (``GENOLC_GIT_SHA`` on the device) and device. With ``--cp-kda state,heads`` each layout runs once
per KDA mode (boundary-state passing against the heads all-to-all, genolc/parallel/kda_heads.py), and a
``kda_modes`` entry per (model, length, layout) sets the modes' tokens/s and peak memory side by side with the
faster one named.

A one-GPU reference that does not fit one device call beside its CP runs (``base`` at 2M: two steps take over ten
minutes on one H200) is split over calls: ``--runs one`` measures only the one-GPU runs and writes their record;
a later call with ``--runs cp --one-gpu-from THAT_RECORD`` takes each (model, length)'s one-GPU run from it instead
of running it again. The record must have been made from the same dataset (``--fasta`` / ``--data``) and with
the same ``--steps`` and ``--recompute``, so both sides trained on the same windows from the same weights; anything
else is refused. Where even the one-GPU runs' two steps overrun a call, ``--one-gpu-steps 1`` runs one: the first
losses still compare, and the rows mark the one-GPU rate as a first step's (``one_gpu_rate_is_first_step``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_long_context import run_child  # noqa: E402
from genolc.units import format_length, parse_length  # noqa: E402
from prepared import add_dataset_options, dataset_for  # noqa: E402


def _finetune_args(data: Path, model: str, length: int, out: Path, args, steps: int | None = None) -> list[str]:
    steps = steps or args.steps
    return ["finetune", "--data", str(data), "--seq", str(length), "--model", model, "--steps", str(steps),
            "--warmup", "1", "--lr", "1e-4", "--seed", "0", "--out", str(out), "--no-progress"]


def _read_run(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"tokens_per_s": round(steps[-1]["tokens_per_s"], 1), "mfu": steps[-1].get("mfu"),
            "step_seconds": [round(s["step_seconds"], 2) for s in steps], "losses": [s["loss"] for s in steps],
            "peak_gpu_gib": round(summary["peak_memory_gib"], 2),
            "peak_gpu_gib_ranks": [round(x, 2) for x in summary.get("peak_memory_gib_ranks") or []],
            "peak_host_gib": round(summary.get("peak_host_memory_gib") or 0.0, 2),
            "peak_host_gib_ranks": [round(x, 2) for x in summary.get("peak_host_memory_gib_ranks") or []],
            "strategy": steps[-1].get("step_strategy"), "chunk": steps[-1].get("chunk"),
            "plan": summary.get("step_strategies"), "transforms": summary.get("transforms")}


def one_gpu(data: Path, model: str, length: int, args, env: dict, work: Path) -> dict:
    """The reference: one GPU per window (or --reference-cp GPUs), one process or with --dp N, N data-parallel groups
    (the sampler gives each data-parallel rank its own windows, so only such a run trains on the windows a --dp N
    --cp M run trains on)."""
    out = work / f"one-{model}-{format_length(length)}"
    finetune = _finetune_args(data, model, length, out, args, args.one_gpu_steps)
    processes = args.dp * args.reference_cp
    if processes > 1:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
                "-m", "genolc.cli", *finetune, "--cp", str(args.reference_cp)]
        visible = ",".join(str(i) for i in range(processes))
    else:
        argv, visible = [sys.executable, "-m", "genolc.cli", *finetune], "0"
    if args.recompute:
        argv.append("--recompute")
    code, tail, wall, rss = run_child(argv, {**env, "CUDA_VISIBLE_DEVICES": visible}, args.timeout)
    run = {"command": " ".join(argv[1:]), "exit_code": code, "wall_seconds": round(wall, 1)}
    if code == 0:
        run.update(ok=True, **_read_run(out))
    else:
        run.update(ok=False, error=tail[-1200:])
    return run


def context_parallel(data: Path, model: str, length: int, layout: str, kda: str, args, env: dict,
                     work: Path) -> dict:
    attempts = [args.recompute] if args.recompute else [False, True]
    run: dict = {}
    for recompute in attempts:
        out = work / (f"dp{args.dp}-cp{args.cp}-{layout}-kda-{kda}-{model}-{format_length(length)}"
                      f"{'-recompute' if recompute else ''}")
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(args.dp * args.cp),
                "-m", "genolc.cli", *_finetune_args(data, model, length, out, args), "--cp", str(args.cp),
                "--cp-layout", layout, "--cp-kda", kda]
        if recompute:
            argv.append("--recompute")
        code, tail, wall, rss = run_child(argv, env, args.timeout)
        run = {"command": " ".join(argv[1:]), "exit_code": code, "wall_seconds": round(wall, 1),
               "recompute": recompute}
        if code == 0:
            run.update(ok=True, **_read_run(out))
            return run
        run.update(ok=False, error=tail[-1200:])
    return run


def load_one_gpu_runs(path: Path, args) -> dict[tuple[str, int], dict]:
    """The one-GPU runs of an earlier ``--runs one`` record, by (model, length); refuses a record made from other
    data or with other --steps / --recompute (its first losses and rates would not be comparable)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        sys.exit(f"--one-gpu-from {path}: cannot read it as a benchmark record ({error}); give the "
                 f"context_parallel_*.json that a --runs one call wrote")
    setup = record.get("setup")
    if setup != _setup(args):
        sys.exit(f"--one-gpu-from {path}: made with {setup}, this run is {_setup(args)}; the one-GPU runs must come "
                 f"from the same dataset, --steps and --recompute (run --runs one again with this call's options)")
    runs = {(row["model"], row["seq_len"]): row["one_gpu"] for row in record.get("rows", [])
            if row.get("one_gpu", {}).get("ok")}
    return {key: {**run, "from_record": str(path), "from_git_sha": record.get("git_sha")} for key, run in runs.items()}


def _setup(args) -> dict:
    """What makes two calls' runs comparable: the dataset, the reference's shape, the steps and recompute."""
    source = {"fasta": Path(args.fasta).name} if args.fasta else {"data": str(args.data)}
    return {**source, "dp": args.dp, "reference_cp": args.reference_cp, "steps": args.steps,
            "one_gpu_steps": args.one_gpu_steps or args.steps, "recompute": bool(args.recompute)}


def compare(one: dict, cp: dict, cp_size: float, rtol: float) -> dict:
    """``cp_size``: how many times the reference's GPUs per window the CP run has (ideal speed-up)."""
    if not (one.get("ok") and cp.get("ok")):
        return {}
    first_one, first_cp = one["losses"][0], cp["losses"][0]
    rel = abs(first_cp - first_one) / abs(first_one)
    # One step only: its rate includes the first step's kernel loading and allocator warm-up, so the one-GPU rate is
    # low and the efficiency high by that much.
    first_step_only = {"one_gpu_rate_is_first_step": True} if len(one["losses"]) == 1 else {}
    return {**first_step_only, "scaling_efficiency": round(cp["tokens_per_s"] / (cp_size * one["tokens_per_s"]), 3),
            "speedup": round(cp["tokens_per_s"] / one["tokens_per_s"], 3),
            "first_loss_one_gpu": first_one, "first_loss_cp": first_cp, "first_loss_rel_diff": rel,
            "first_loss_equal": rel <= rtol,
            "loss_rel_diffs": [abs(a - b) / abs(a) for a, b in zip(one["losses"], cp["losses"])]}


def compare_kda_modes(rows: list[dict]) -> dict:
    """Tokens/s and peak GPU memory (the largest rank's) of each KDA mode that ran, and the faster mode."""
    runs = {row["cp_kda"]: row["context_parallel"] for row in rows if row["context_parallel"].get("ok")}
    modes = {kda: {"tokens_per_s": run["tokens_per_s"], "recompute": run["recompute"],
                   "peak_gpu_gib": max(run["peak_gpu_gib_ranks"] or [run["peak_gpu_gib"]])}
             for kda, run in runs.items()}
    if not modes:
        return {}
    return {"modes": modes, "faster": max(modes, key=lambda kda: modes[kda]["tokens_per_s"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_options(parser, fasta_help="genome to prepare (char tokenizer, every record trains)")
    parser.add_argument("--models", default="small,base")
    parser.add_argument("--lengths", default="1M,2M")
    parser.add_argument("--steps", type=int, default=3,
                        help="steps per run, at least 2: AdamW allocates its state after the first step's "
                             "peak, so only a later step's peak is the steady state")
    parser.add_argument("--cp", type=int, default=2, help="context-parallel ranks (GPUs) per window for the CP runs")
    parser.add_argument("--dp", type=int, default=1,
                        help="data-parallel groups of --cp ranks: torchrun starts dp x cp processes, and the reference "
                             "is dp processes without CP (the same windows); tokens/s and MFU are each mesh's")
    parser.add_argument("--layouts", default="zigzag", help="CP layouts to run, e.g. zigzag,contiguous")
    parser.add_argument("--recompute", action="store_true", help="pass --recompute to every run")
    parser.add_argument("--cp-kda", default="state",
                        help="KDA context-parallel modes to run for each layout, e.g. state,heads (finetune --cp-kda)")
    parser.add_argument("--timeout", type=float, default=280, help="seconds per run")
    parser.add_argument("--budget", type=float, default=0, help="stop starting rows after this many seconds")
    parser.add_argument("--loss-rtol", type=float, default=5e-3,
                        help="first-step losses count as equal within this relative difference (bf16 autocast)")
    parser.add_argument("--runs", default="one,cp", choices=("one,cp", "one", "cp"),
                        help="which runs this call makes: one (the one-GPU references only), cp (needs "
                             "--one-gpu-from), or both")
    parser.add_argument("--reference-cp", type=int, default=1,
                        help="GPUs per window of the reference run (default 1): 2 compares --cp 4 or 8 against two "
                             "GPUs where one cannot hold or finish the window in a device call")
    parser.add_argument("--one-gpu-steps", type=int, default=None,
                        help="steps of the one-GPU references (default --steps); 1 when two steps do not fit a "
                             "device call (base at 2M): its rate is then the first step's, and the row says so")
    parser.add_argument("--one-gpu-from", type=Path, default=None,
                        help="take the one-GPU runs from this earlier --runs one record instead of running them")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (a first step's peak lacks AdamW's state)")
    if args.dp < 1 or args.cp < 1 or args.reference_cp < 1 or args.cp % args.reference_cp:
        parser.error("--dp, --cp and --reference-cp must be at least 1, and --reference-cp must divide --cp")
    if args.one_gpu_steps is not None and args.one_gpu_steps < 1:
        parser.error("--one-gpu-steps must be at least 1")
    if (args.runs == "cp") != (args.one_gpu_from is not None):
        parser.error("--runs cp and --one-gpu-from go together: the CP rows need the one-GPU runs of an earlier "
                     "--runs one call (or run both in this call: --runs one,cp)")
    recorded = load_one_gpu_runs(args.one_gpu_from, args) if args.one_gpu_from else {}

    # NVLink multicast stays off in every child (the lent GPUs' hosts are shared; see the device's KINDS.md).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    started = time.monotonic()
    rows: list[dict] = []
    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = {**_machine(), "setup": _setup(args)}
    with tempfile.TemporaryDirectory(prefix="genolc-cp-") as tmp:
        work = Path(tmp)
        data = dataset_for(args.data, args.fasta, "none", work, env)
        for model in args.models.split(","):
            for length in (parse_length(x) for x in args.lengths.split(",") if x):
                if args.budget and time.monotonic() - started > args.budget:
                    rows.append({"model": model, "seq_len": length, "skipped": "time budget"})
                    continue
                if recorded:
                    if (model, length) not in recorded:
                        sys.exit(f"--one-gpu-from {args.one_gpu_from}: no successful one-GPU run of {model} at "
                                 f"{format_length(length)}; run --runs one for it first")
                    one = recorded[model, length]
                else:
                    one = one_gpu(data, model, length, args, env, work)
                print(json.dumps({"model": model, "seq": format_length(length), "one_gpu":
                                  {k: v for k, v in one.items() if k != "error"}}), flush=True)
                if args.runs == "one":
                    rows.append({"model": model, "seq_len": length, "seq": format_length(length), "one_gpu": one})
                    _write(out_dir, machine, rows, started)
                    continue
                for layout in args.layouts.split(","):
                    layout_rows = []
                    for kda in args.cp_kda.split(","):
                        cp = context_parallel(data, model, length, layout, kda, args, env, work)
                        row = {"model": model, "seq_len": length, "seq": format_length(length), "cp": args.cp,
                               "dp": args.dp, "reference_cp": args.reference_cp, "layout": layout, "cp_kda": kda,
                               "one_gpu": one, "context_parallel": cp,
                               **compare(one, cp, args.cp / args.reference_cp, args.loss_rtol)}
                        rows.append(row)
                        layout_rows.append(row)
                        print(json.dumps({k: v for k, v in row.items() if k not in ("one_gpu",)}, default=str),
                              flush=True)
                        _write(out_dir, machine, rows, started)
                    if len(layout_rows) > 1:
                        modes = {"model": model, "seq": format_length(length), "layout": layout,
                                 "kda_modes": compare_kda_modes(layout_rows)}
                        rows.append(modes)
                        print(json.dumps(modes), flush=True)
                        _write(out_dir, machine, rows, started)
    print(f"wrote {_write(out_dir, machine, rows, started)}")


def _machine() -> dict:
    """The record's command, git SHA and devices, found before the first run: importing torch takes seconds, and a
    device call that ends during the first write would otherwise leave no record (it happened on 2026-12-01)."""
    import torch
    from gpu_bench_common import git_sha

    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() \
        else ["cpu"]
    return {"command": "python " + " ".join(sys.argv), "git_sha": git_sha(), "devices": devices,
            "torch": torch.__version__}


def _write(out_dir: Path, machine: dict, rows: list[dict], started: float) -> Path:
    path = out_dir / f"context_parallel_{datetime.date.today().isoformat()}{os.environ.get('BENCH_TAG', '')}.json"
    record = {**machine, "seconds": round(time.monotonic() - started, 1), "rows": rows}
    path.write_text(json.dumps(record, indent=1))
    return path


if __name__ == "__main__":
    main()
