"""python benchmarks/bench_moe_combine.py [--tokens 32768]   (on the GPU; carry: [".gpu"])

The routed experts' last step, each token's sum of its K weighted expert rows, forward and backward, two ways:
``index_add_`` into bf16 zeros (genolc before 2026-12-02) and ``combine_slots`` (a copy back into slot order, a sum
over K). Shapes of `small` (K=2, D=1024) and `base` (K=4, D=1536) for one chunk of ``--tokens``, rows in the order
a skewed routing sorts them. Median of 20 runs after a warm-up (gpu_bench_common.measure). Writes JSON (command,
git SHA, device) to $OUT or benchmarks/results/moe_combine_<date>.json. (The 2026-12-02 record ran the script of
4f548e7, which took the median after three warm-ups.)
"""

from __future__ import annotations

import argparse
import json

import torch

from gpu_bench_common import measure, write_results
from genolc.model.ops.moe.grouped_mm import combine_slots
from genolc.model.presets import base, small


def index_add_combine(slot_rows: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    tokens = slot_rows.shape[0] // top_k
    return slot_rows.new_zeros(tokens, slot_rows.shape[1]).index_add_(0, order // top_k, slot_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768)
    args = parser.parse_args()
    rows = []
    for name, config in (("small", small()), ("base", base())):
        top_k, dim = config.num_experts_per_tok, config.hidden_size
        skew = torch.linspace(3.0, 0.2, config.n_routed_experts, device="cuda")
        expert_ids = torch.multinomial(skew.expand(args.tokens, -1), top_k)
        order = expert_ids.reshape(-1).argsort(stable=True)
        slot_rows = torch.randn(args.tokens * top_k, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        d_out = torch.randn(args.tokens, dim, device="cuda", dtype=torch.bfloat16)
        reference = index_add_combine(slot_rows.detach().float(), order, top_k)
        for way, combine in (("index_add_", index_add_combine), ("combine_slots", combine_slots)):
            forward = measure(lambda: combine(slot_rows.detach(), order, top_k), repeats=20)["ms"]
            both = measure(lambda: torch.autograd.grad(combine(slot_rows, order, top_k), slot_rows, d_out),
                           repeats=20)["ms"]
            error = float((combine(slot_rows.detach(), order, top_k).float() - reference).norm() / reference.norm())
            rows.append({"preset": name, "tokens": args.tokens, "top_k": top_k, "dim": dim, "way": way,
                         "forward_ms": round(forward, 3), "forward_backward_ms": round(both, 3),
                         "relative_error_vs_fp32": error})
            print(json.dumps(rows[-1]))
    print(f"wrote {write_results('moe_combine', rows, {'timing': 'median of 20 after one warm-up, CUDA events'})}")


if __name__ == "__main__":
    main()
