"""python3 benchmarks/ab_merge_finetune.py DATA [--model small] [--seq 512k] [--steps 14]   (GPU; carry [".gpu", ...])

mHC's merge two ways in ONE ``finetune`` process, alternating step by step, so that the machine and the process are
the same for both: ``kernels`` (genolc/model/ops/mhc/merge_triton.py through ``dispatch.mhc_merge``, what the trainer
runs on CUDA since session 33) and ``compiled`` (the same fp32 sum as torch code, ``reference.merge``, compiled by
inductor: what it ran before). Why: in session 33 the kernels made the bare 512k step faster (`small` 6.14 -> 6.00 s,
`base` 14.12 -> 13.81 s), but ``finetune``'s step took 0.24-0.32 s more than the bare step where it had taken 0.08 s
more before; those runs were on different machines (benchmarks/results/mhc_merge_last_chunk_2026-12-04/README.md).

Every other setting is ``finetune``'s default (``TrainConfig``). Odd steps run ``kernels``, even steps ``compiled``;
the first step of each (steps 1 and 2) compiles or builds what it needs and is left out of the medians. The merge is
switched between steps on the class the trainer gives its hyper-connections (``Fp32MergeHyperConnection`` with bf16
streams; on CPU, a plumbing check only, the plain ``HyperConnection``, whose both modes then run the reference).
Writes JSON (each step's mode and seconds, per-mode medians, command, git SHA, device) to $OUT or
benchmarks/results/ab_merge_finetune_<date>.json. The run goes to ``--run-dir`` (``finetune``'s rules: new or
empty), by default a new temporary folder.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from gpu_bench_common import ROOT, git_sha
from genolc.errors import GenolcError
from genolc.fsutil import atomic_write_json, output_dir
from genolc.model.layers.mhc import HyperConnection
from genolc.model.ops.mhc import reference
from genolc.signals import Interrupted
from genolc.train.apply import Fp32MergeHyperConnection
from genolc.train.command import LEGACY_RUN, RUN_KIND
from genolc.train.config import TrainConfig
from genolc.train.loop import TrainHooks, finetune
from genolc.units import parse_length

MODES = ("kernels", "compiled")


def fp32_merge(block_out, post, comb, streams):
    return reference.merge(block_out, post, comb, streams, compute_dtype=torch.float32)


def mode_of_step(step: int) -> str:
    """``step`` counts from 1: odd steps run the kernels, even ones the compiled merge."""
    return MODES[(step - 1) % 2]


class MergeSwitch:
    """Sets ``cls.merge`` to the kernels' (the class's own) or the compiled merge, and records each step's mode."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.original = cls.merge
        compiled = torch.compile(fp32_merge, dynamic=False)

        def compiled_merge(module, block_out, post, comb, streams):
            return compiled(block_out, post, comb, streams)

        self.methods = {"kernels": self.original, "compiled": compiled_merge}
        self.steps: list[dict] = []

    def use(self, mode: str) -> None:
        self.cls.merge = self.methods[mode]

    def on_step_end(self, done: int, metrics: dict) -> None:
        self.steps.append({"step": done, "mode": mode_of_step(done), "seconds": metrics["step_seconds"],
                           "loss": metrics["loss"]})
        self.use(mode_of_step(done + 1))

    def restore(self) -> None:
        self.cls.merge = self.original


def medians(steps: list[dict]) -> dict[str, float | None]:
    out = {}
    for mode in MODES:
        seconds = [s["seconds"] for s in steps if s["mode"] == mode and s["step"] > 2]
        out[mode] = round(statistics.median(seconds), 3) if seconds else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="a prepared dataset (genolc prepare)")
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq", default="512k")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--run-dir", type=Path, default=None, help="the finetune run's folder (default: a new one "
                        "under the system's temporary folder)")
    args = parser.parse_args()
    if args.steps < 4:
        parser.error("--steps must be at least 4: two steps build each mode, the later ones are timed")
    cuda = torch.cuda.is_available()
    switch = MergeSwitch(Fp32MergeHyperConnection if cuda else HyperConnection)
    run_dir = Path(tempfile.mkdtemp(prefix="ab-merge-run-")) if args.run_dir is None else args.run_dir
    switch.use(mode_of_step(1))
    try:
        config = TrainConfig(data=args.data, out=run_dir, seq_len=parse_length(args.seq), model=args.model,
                             steps=args.steps)
        # Claimed as `genolc finetune` claims its --out: new, empty or an earlier run's, never a folder of the user's.
        with output_dir(run_dir, RUN_KIND, legacy=LEGACY_RUN):
            finetune(config, TrainHooks(on_step_end=switch.on_step_end))
    except Interrupted:
        print(f"ab_merge_finetune: stopped after {len(switch.steps)} of {args.steps} steps; no results written "
              f"(the run and its checkpoint stay in {run_dir})", file=sys.stderr)
        sys.exit(130)
    except GenolcError as error:
        sys.exit(f"ab_merge_finetune: {error}")
    finally:
        switch.restore()
    record = {"command": "python " + " ".join(sys.argv), "git_sha": git_sha(),
              "device": torch.cuda.get_device_name() if cuda else "cpu (plumbing check: both modes are the reference)",
              "torch": torch.__version__, "model": args.model, "seq": args.seq, "steps": switch.steps,
              "median_seconds_after_step_2": medians(switch.steps)}
    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"ab_merge_finetune_{datetime.date.today().isoformat()}.json"
    atomic_write_json(path, record)
    print(json.dumps(record["median_seconds_after_step_2"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
