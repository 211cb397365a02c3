"""python benchmarks/bench_checkpoint.py [--presets small,base] [--dir DIR]   (GPU; on CPU a plumbing check)

What a `finetune` checkpoint costs the training loop, per preset, with the trainer's fp32 weights and AdamW state
(one optimizer step taken, so the moments exist):

- ``foreground``: ``state.save_checkpoint``, what every save was until 2026-12-04 and the last one still is (the
  weights copied off the device at once, the optimizer's state one tensor at a time as torch.save writes it);
- ``snapshot (new buffers)`` and ``snapshot (reused buffers)``: what a step waits for when the checkpoint is written
  in the background (genolc/train/background_save.py): every tensor copied to host memory, the first save into new
  host buffers, the later ones into the same buffers;
- ``background write``: the thread's writing of one snapshot, which overlaps the next training steps.

Each save goes to a new folder under ``--dir`` (default: a temporary folder, removed after), the page cache flushed
(``os.sync``) before each timing, and the bytes written are reported. Writes JSON (command, git SHA, device) to $OUT
or benchmarks/results/checkpoint_<date>.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from gpu_bench_common import print_table, write_results
from genolc.errors import GenolcError
from genolc.model import build_model, preset
from genolc.train import state as ckpt
from genolc.train.background_save import BackgroundCheckpoints, snapshot_bytes
from genolc.train.optimizer import build_adamw


def _timed(run) -> float:
    os.sync()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _folder_files(path: Path) -> dict[str, int]:
    """Each file's size under ``path`` by its relative name."""
    return {str(f.relative_to(path)): f.stat().st_size for f in sorted(path.rglob("*")) if f.is_file()}


def bench_preset(name: str, device: str, root: Path) -> list[dict]:
    model = build_model(preset(name), device=device)
    optimizer = build_adamw(model, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    nbytes = snapshot_bytes(model, optimizer)
    state = {"tokens_seen": 0, "targets_seen": 0, "config": {}, "samplers": {}}
    rows = []

    def row(form: str, seconds: float, written: Path | None = None) -> None:
        entry = {"preset": name, "form": form, "seconds": round(seconds, 3), "state_gb": round(nbytes / 1e9, 2)}
        if written is not None:
            entry["written_files"] = _folder_files(written)
            entry["written_bytes"] = sum(entry["written_files"].values())
            entry["written_gb"] = round(entry["written_bytes"] / 1e9, 2)
        rows.append(entry)

    out = root / f"{name}-foreground"
    row("foreground", _timed(lambda: ckpt.save_checkpoint(out, 1, model=model, optimizer=optimizer, tokenizer=None,
                                                           trainer_state=state, keep=1)),
        ckpt.checkpoint_root(out) / ckpt.checkpoint_name(1))
    shutil.rmtree(out)
    checkpoints = BackgroundCheckpoints(root / f"{name}-background", tokenizer=None, keep=1)
    for step, form in ((1, "snapshot (new buffers)"), (2, "snapshot (reused buffers)")):
        row(form, _timed(lambda: checkpoints.save(step, model=model, optimizer=optimizer, trainer_state=state,
                                                  background=True)))
        row("background write", _timed(checkpoints.wait), checkpoints.written)
    shutil.rmtree(root / f"{name}-background")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="small,base")
    parser.add_argument("--dir", type=Path, default=None, help="where the checkpoints are written (default: a new "
                        "temporary folder, removed after)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dir is not None and args.dir.exists() and any(args.dir.iterdir()):
        sys.exit(f"bench_checkpoint: --dir {args.dir} is not empty; give a new or empty folder")
    root = Path(tempfile.mkdtemp(prefix="bench-checkpoint-")) if args.dir is None else args.dir
    root.mkdir(parents=True, exist_ok=True)
    try:
        rows = [row for name in args.presets.split(",") for row in bench_preset(name, device, root)]
    except GenolcError as error:
        sys.exit(f"bench_checkpoint: {error}")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print_table(rows, ["preset", "form", "seconds", "state_gb", "written_gb"])
    if device == "cuda":
        print(f"wrote {write_results('checkpoint', rows, {'dir': str(root)})}")
    else:
        print("bench_checkpoint: no CUDA device; a plumbing check, nothing written")


if __name__ == "__main__":
    main()
