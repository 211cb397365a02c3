"""Which module makes the model's GPU forward differ between identical runs (issue 14).

    python3 benchmarks/forward_determinism.py --model small --seq 64k --runs 6 [--json OUT]

benchmarks/chunked_vs_whole.py --spread found three whole-window forwards of one window that did not agree bit for
bit (the DSA rows and the MoE experts of later layers differed, the first MoE layer's did not), so a chunked step's
gradients can land 3e-2 apart from an identical one's. This runs the same forward ``--runs`` times without
gradients under bf16 autocast, with a forward hook on every module that records a checksum of each input and
output tensor (its bit patterns summed as integers, weighted by position), in call order. Against the first run it
reports, per run, the first call whose inputs all agree and whose output does not: that module is where the
difference arises (its children, hooked too, narrow it down when they come first). Inputs are summed before the
module runs (a pre-hook), so a module that changes its inputs in place does not hide itself. The checksums stay on
the GPU until every run is done, so that the runs are not drained between modules. On 2026-12-02 neither that nor
reading each checksum back caught a difference in eight runs; under ``CUDA_LAUNCH_BLOCKING=1`` one run of six
differed (benchmarks/results/determinism_2026-12-02/README.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from genolc.model import build_model, preset  # noqa: E402
from genolc.errors import ConfigError  # noqa: E402
from genolc.units import parse_length  # noqa: E402

_INTEGER_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def checksum(tensor: torch.Tensor) -> torch.Tensor:
    """The bit patterns of ``tensor``, summed as int64 with weights by position (1 to 1,000,003, never 0), so that a
    changed element always changes the sum and two swapped ones nearly always do."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.int8)
    if flat.is_floating_point():
        flat = flat.view(_INTEGER_VIEW[flat.element_size()])
    flat = flat.to(torch.int64)
    weights = torch.arange(flat.numel(), device=flat.device, dtype=torch.int64) % 1000003 + 1
    return (flat * weights).sum()


def tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors(item)]
    if hasattr(value, "__dataclass_fields__"):
        return [t for name in value.__dataclass_fields__ for t in tensors(getattr(value, name))]
    return []


def recorded_forward(model, inputs) -> list[tuple[str, list[torch.Tensor], list[torch.Tensor]]]:
    calls: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]] = []
    started: dict[int, list[list[torch.Tensor]]] = {}
    handles = []
    for name, module in model.named_modules():
        def before(module, args, kwargs):
            started.setdefault(id(module), []).append([checksum(t) for t in tensors((args, kwargs))])

        def after(module, args, kwargs, output, _name=name or "model"):
            calls.append((_name, started[id(module)].pop(), [checksum(t) for t in tensors(output)]))

        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True))
    try:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def read_back(calls) -> list[tuple[str, list[int], list[int]]]:
    return [(name, [int(t) for t in ins], [int(t) for t in outs]) for name, ins, outs in calls]


def first_difference(reference, run) -> dict | None:
    """None where the runs agree call for call; else where they first part."""
    if reference == run:
        return None
    if [c[0] for c in reference] != [c[0] for c in run]:
        return {"error": "the runs called different modules"}
    for index, ((name, ins, outs), (_, run_ins, run_outs)) in enumerate(zip(reference, run)):
        if ins == run_ins and outs != run_outs:
            return {"call": index, "module": name,
                    "outputs_differing": sum(a != b for a, b in zip(outs, run_outs)), "outputs": len(outs)}
    return {"error": "the runs differ, but no call's outputs differ with identical inputs"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq", default="64k")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs CUDA: this looks for nondeterminism in the GPU kernels")
    try:
        length = parse_length(args.seq, "--seq")
    except ConfigError as error:
        parser.error(str(error))
    if args.runs < 2:
        parser.error(f"--runs must be at least 2 (one to compare the others with), got {args.runs}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = build_model(preset(args.model)).cuda()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 4, (1, length), generator=generator).cuda()
    runs = [read_back(calls) for calls in [recorded_forward(model, inputs) for _ in range(args.runs)]]
    found = {f"run {i}": first_difference(runs[0], run) for i, run in enumerate(runs[1:], start=1)}
    for run, difference in found.items():
        print(f"{run} against run 0: {difference or 'bit for bit the same'}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "calls": len(runs[0]),
                                         "first_differences": found}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
