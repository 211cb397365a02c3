"""python benchmarks/bench_adamw.py [--presets small,base]   (on the GPU; carry: [".gpu"])

The trainer's optimizer step, torch's ``foreach`` AdamW (what it ran until 2026-12-04) against the fused one it runs
on CUDA now (genolc/train/optimizer.py), on each preset's fp32 parameters with the trainer's two groups (decay 0.1).
Also times ``clip_grad_norm_``, the step's other pass over every gradient, for scale. Each form starts from the same
weights, gradients and empty moments and takes three steps; the largest difference between the two results is
reported (they must agree to fp32 rounding: the script exits 1 where one weight differs by more than 1e-6 of the
largest weight). Median of 20 steps after a warm-up (gpu_bench_common.measure); the kernels of one step
(torch.profiler). Writes JSON (command, git SHA, device) to $OUT or benchmarks/results/fused_adamw_<date>.json.
"""

from __future__ import annotations

import argparse
import sys

import torch

from gpu_bench_common import measure, print_table, profiled_kernels, write_results
from genolc.model import build_model, preset
from genolc.train.optimizer import parameter_groups

FORMS = {"foreach": {"foreach": True}, "fused": {"fused": True}}
AGREEMENT = 1e-6


def optimizer(model: torch.nn.Module, form: str) -> torch.optim.AdamW:
    return torch.optim.AdamW(parameter_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **FORMS[form])


def three_steps(model: torch.nn.Module, form: str, start: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        for param, value in zip(model.parameters(), start):
            param.copy_(value)
    stepper = optimizer(model, form)
    for _ in range(3):
        stepper.step()
    return [param.detach().clone() for param in model.parameters()]


def timed_preset(name: str) -> dict:
    torch.manual_seed(0)
    model = build_model(preset(name), device="cuda")
    for param in model.parameters():
        param.grad = torch.randn_like(param) * 1e-3
    params = list(model.parameters())
    row = {"preset": name, "parameters": sum(p.numel() for p in params), "tensors": len(params)}
    start = [param.detach().clone() for param in params]
    results = {form: three_steps(model, form, start) for form in FORMS}
    largest = max(float(p.abs().max()) for p in start)
    row["max_abs_difference"] = max(float((a - b).abs().max()) for a, b in zip(results["foreach"], results["fused"]))
    row["largest_weight"] = largest
    row["agree"] = row["max_abs_difference"] <= AGREEMENT * largest
    del results, start
    for form in FORMS:
        stepper = optimizer(model, form)
        timing = measure(stepper.step, 20)
        row[f"{form}_ms"], row[f"{form}_ms_all"] = timing["ms"], timing["ms_all"]
        row[f"{form}_kernels"] = profiled_kernels(stepper.step)[:12]
        del stepper
        torch.cuda.empty_cache()

    def clip():
        torch.nn.utils.clip_grad_norm_(params, 1.0)

    row["clip_grad_norm_ms"] = measure(clip, 20)["ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="small,base", help="comma-separated genolc presets")
    args = parser.parse_args()
    rows = []
    for name in args.presets.split(","):
        rows.append(timed_preset(name))
        torch.cuda.empty_cache()
    print_table(rows, ["preset", "parameters", "tensors", "foreach_ms", "fused_ms", "clip_grad_norm_ms",
                       "max_abs_difference", "agree"])
    disagree = [row["preset"] for row in rows if not row["agree"]]
    path = write_results("fused_adamw", rows, {"agreement": f"max |foreach - fused| <= {AGREEMENT} x largest weight",
                                               "disagree": disagree})
    print(f"wrote {path}")
    if disagree:
        print(f"fused and foreach AdamW differ beyond rounding on {', '.join(disagree)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
