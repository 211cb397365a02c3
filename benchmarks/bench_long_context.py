"""How long a window `genolc finetune` trains on one GPU: peak GPU and host memory and tokens/s per model and length.

    python benchmarks/bench_long_context.py --fasta .gpudata/GRCh37_chrX_1-24000000.fa.gz \
        --models small,base --lengths 128k,512k,1M,2M,4M --steps 2 [--baseline-lengths 32k,48k,64k] \
        [--heldout X:1-8000000 --eval-lengths 1M,4M --eval-models base]

Each (model, length) runs the real command, ``genolc finetune --seq L --model M --steps N`` (the step strategy left
to ``--chunk auto`` unless ``--chunk`` is given), in its own process, so one that fails cannot disturb the next;
lengths go up until one fails (refused by the plan or out of memory), then the next model starts. A row holds what
the run's summary.json and metrics.jsonl say (the strategy chosen, chunk, peak GPU memory, tokens/s of the last
step, every step's seconds and loss), the child's peak host RSS, the plan's estimate for that strategy (the
within-15 % check) and, for failures, the message's last lines. ``--baseline-lengths``: the same model config as
transformers' ``Glm5NextTextModel`` with an LM head, gradient checkpointing on, bf16 autocast, AdamW, one step per
length until it runs out of memory (needs transformers with ``glm5_next``). ``--eval-lengths``: ``genolc eval
--by-position heldout`` of a freshly initialised checkpoint, one window per length (needs ``--heldout``), with its
peak GPU memory.

The dataset is prepared once (char tokenizer) from ``--fasta`` into a temporary directory, or taken from ``--data``.
Results: ``$OUT/long_context_<date><BENCH_TAG>.json`` (benchmarks/results by default) with command, git SHA, device.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from genolc.units import format_length, parse_length  # noqa: E402
from prepared import add_dataset_options, dataset_for  # noqa: E402

BASELINE_SCRIPT = r"""
import sys, time, torch
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextModel
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
from genolc.model import preset
name, length = sys.argv[1], int(sys.argv[2])
config = Glm5NextTextConfig(**preset(name).to_hf())
torch.manual_seed(0)
body = Glm5NextTextModel(config).cuda()
head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False).cuda()
body.gradient_checkpointing_enable()
body.train()
params = list(body.parameters()) + list(head.parameters())
optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
ids = torch.randint(0, 4, (1, length + 1), device="cuda")
torch.cuda.reset_peak_memory_stats()
start = time.monotonic()
with torch.autocast("cuda", dtype=torch.bfloat16):
    hidden = body(input_ids=ids[:, :-1], use_cache=False).last_hidden_state
    logits = head(hidden).float()
loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
loss.backward()
optimizer.step()
torch.cuda.synchronize()
seconds = time.monotonic() - start
print("RESULT", length / seconds, torch.cuda.max_memory_allocated() / 2**30, float(loss), seconds)
"""


def run_child(argv: list[str], env: dict, timeout: float) -> tuple[int, str, float, float]:
    """(exit code, last output, wall seconds, peak host RSS GiB) of one child process."""
    start = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = start + timeout
        status = None
        while status is None:
            pid, wait_status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status = os.waitstatus_to_exitcode(wait_status)
                rss = usage.ru_maxrss * 1024 / 2 ** 30
                break
            if time.monotonic() > deadline:
                proc.kill()
                _, wait_status, usage = os.wait4(proc.pid, 0)
                status, rss = 124, usage.ru_maxrss * 1024 / 2 ** 30
                break
            time.sleep(0.5)
        proc.returncode = status
        log.seek(0)
        text = log.read()
    return status, text[-3000:], time.monotonic() - start, rss


def finetune_row(data: Path, model: str, length: int, args, env: dict, work: Path) -> dict:
    out = work / f"{model}-{format_length(length)}"
    argv = [sys.executable, "-m", "genolc.cli", "finetune", "--data", str(data), "--seq", str(length), "--model",
            model, "--steps", str(args.steps), "--warmup", "1", "--lr", "1e-4", "--out", str(out), "--no-progress",
            "--chunk", args.chunk]
    if args.recompute:
        argv.append("--recompute")
    code, tail, wall, rss = run_child(argv, env, args.timeout)
    row = {"model": model, "seq_len": length, "seq": format_length(length), "exit_code": code,
           "wall_seconds": round(wall, 1), "host_peak_rss_gib": round(rss, 2)}
    summary_path, metrics_path = out / "summary.json", out / "metrics.jsonl"
    if code == 0 and summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        steps = [json.loads(line) for line in metrics_path.read_text().splitlines()]
        row.update(ok=True, peak_gpu_gib=round(summary["peak_memory_gib"], 2),
                   tokens_per_s=round(steps[-1]["tokens_per_s"], 1), mfu=steps[-1].get("mfu"),
                   hfu=steps[-1].get("hfu"),
                   step_seconds=[round(s["step_seconds"], 2) for s in steps], losses=[s["loss"] for s in steps],
                   strategy=steps[-1].get("step_strategy"), chunk=steps[-1].get("chunk"),
                   plan=summary.get("step_strategies"))
    else:
        row.update(ok=False, error=tail[-1200:])
    return row


def baseline_row(model: str, length: int, env: dict, timeout: float) -> dict:
    code, tail, wall, rss = run_child([sys.executable, "-c", BASELINE_SCRIPT, model, str(length)], env, timeout)
    row = {"model": model, "seq_len": length, "seq": format_length(length), "exit_code": code,
           "wall_seconds": round(wall, 1), "host_peak_rss_gib": round(rss, 2), "engine": "transformers glm5_next"}
    lines = [line for line in tail.splitlines() if line.startswith("RESULT ")]
    if code == 0 and lines:
        tokens_per_s, peak, loss, seconds = map(float, lines[-1].split()[1:])
        row.update(ok=True, tokens_per_s=round(tokens_per_s, 1), peak_gpu_gib=round(peak, 2), loss=loss,
                   step_seconds=round(seconds, 2))
    else:
        row.update(ok=False, error=tail[-800:])
    return row


EVAL_CHECKPOINT_SCRIPT = r"""
import sys, torch
from genolc.data.dataset import PreparedDataset
from genolc.model import build_model, preset, save_pretrained
data, name, out = sys.argv[1:4]
tokenizer = PreparedDataset(data).tokenizer
torch.manual_seed(0)
save_pretrained(build_model(preset(name, vocab_size=tokenizer.vocab_size)), out, tokenizer=tokenizer)
"""


def eval_row(data: Path, model: str, length: int, record: str, env: dict, work: Path, timeout: float) -> dict:
    """`genolc eval --by-position RECORD --seq L` of a freshly initialised checkpoint (what is measured is memory
    and time: eval's chunked scoring, not what the model knows), one window."""
    checkpoint = work / f"eval-{model}-checkpoint"
    if not checkpoint.exists():
        made = subprocess.run([sys.executable, "-c", EVAL_CHECKPOINT_SCRIPT, str(data), model, str(checkpoint)],
                              env=env, cwd=ROOT, capture_output=True, text=True)
        if made.returncode:
            return {"model": model, "seq_len": length, "ok": False, "error": made.stderr[-1200:], "engine": "eval"}
    out = work / f"eval-{model}-{format_length(length)}"
    probe = ("import torch, runpy, sys; sys.argv = sys.argv[1:]; "
             "import atexit; atexit.register(lambda: print('PEAK_GPU_GIB', torch.cuda.max_memory_allocated() / 2**30)); "
             "runpy.run_module('genolc.cli', run_name='__main__')")
    argv = [sys.executable, "-c", probe, "genolc", "eval", "--by-position", record, "--data", str(data),
            "--checkpoint", str(checkpoint), "--seq", str(length), "--max-windows", "1", "--bootstrap", "10",
            "--out", str(out), "--no-progress"]
    code, tail, wall, rss = run_child(argv, env, timeout)
    row = {"model": model, "seq_len": length, "seq": format_length(length), "engine": "eval --by-position",
           "exit_code": code, "wall_seconds": round(wall, 1), "host_peak_rss_gib": round(rss, 2), "ok": code == 0}
    peaks = [line for line in tail.splitlines() if line.startswith("PEAK_GPU_GIB ")]
    if peaks:
        row["peak_gpu_gib"] = round(float(peaks[-1].split()[1]), 2)
    if code != 0:
        row["error"] = tail[-1200:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_options(parser, fasta_help="genome to prepare (char tokenizer, every record trains)")
    parser.add_argument("--models", default="small,base")
    parser.add_argument("--lengths", default="128k,512k,1M,2M,4M")
    parser.add_argument("--steps", type=int, default=2,
                        help="steps per run, at least 2: AdamW allocates its state after the first step's "
                             "peak, so only a later step's peak is the steady state")
    parser.add_argument("--chunk", default="auto", help="passed to finetune --chunk")
    parser.add_argument("--recompute", action="store_true", help="pass --recompute")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument("--baseline-lengths", default="", help="transformers baseline lengths, e.g. 32k,48k,64k")
    parser.add_argument("--baseline-model", default="small")
    parser.add_argument("--budget", type=float, default=0, help="stop starting runs after this many seconds")
    parser.add_argument("--heldout", default="none", help="prepare's --heldout (e.g. X:1-8000000, for --eval-lengths)")
    parser.add_argument("--eval-lengths", default="", help="genolc eval --by-position window lengths, e.g. 1M,4M")
    parser.add_argument("--eval-models", default="base", help="models for --eval-lengths")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (a first step's peak lacks AdamW's state)")

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    rows: list[dict] = []
    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="genolc-long-") as tmp:
        work = Path(tmp)
        data = dataset_for(args.data, args.fasta, args.heldout, work, env)
        def series(lengths: str, make_row) -> None:
            """Rows for ``lengths`` in order, until one fails or the time budget is spent."""
            for length in (parse_length(x) for x in lengths.split(",") if x):
                if args.budget and time.monotonic() - started > args.budget:
                    rows.append({"seq_len": length, "skipped": "time budget"})
                    continue
                row = make_row(length)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
                if not row["ok"]:
                    print(row["error"][-600:], flush=True)
                    break
                _write(out_dir, rows, args, started)

        for model in args.models.split(",") if args.lengths else ():
            series(args.lengths, lambda length: finetune_row(data, model, length, args, env, work))
        for model in args.eval_models.split(",") if args.eval_lengths else ():
            series(args.eval_lengths, lambda length: eval_row(data, model, length, "heldout", env, work, args.timeout))
        series(args.baseline_lengths, lambda length: baseline_row(args.baseline_model, length, env, args.timeout))
    path = _write(out_dir, rows, args, started)
    print(f"wrote {path}")


def _write(out_dir: Path, rows: list[dict], args, started: float) -> Path:
    import datetime

    import torch
    from gpu_bench_common import git_sha

    path = out_dir / f"long_context_{datetime.date.today().isoformat()}{os.environ.get('BENCH_TAG', '')}.json"
    record = {"command": "python " + " ".join(sys.argv), "git_sha": git_sha(),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "host_max_rss_note": "ru_maxrss of each child process",
              "seconds": round(time.monotonic() - started, 1), "rows": rows}
    path.write_text(json.dumps(record, indent=1))
    return path


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
