"""python benchmarks/bench_moe_glue.py [--tokens 32768]   (on the GPU; carry: [".gpu"])

The routed experts' element-wise glue (everything of genolc.model.ops.moe.grouped_mm's chunk but the two grouped
GEMMs), forward and forward + backward, the eager way genolc ran it before 2026-12-02's fused ops and the ops of
genolc.model.ops.moe.op:

- ``swiglu``: eager ``clamped_swiglu`` on the halves of ``hidden [S, 2I]`` against ``swiglu_op``;
- ``gather + combine``: eager ``x[order // K]`` and the routing-weighted sum (a bf16 product, a copy back into slot
  order, a sum over K) against ``gather_slots_op`` and ``combine_op``.

Shapes of `small` (K=2, D=1024, I=512) and `base` (K=4, D=1536, I=768) for one chunk of ``--tokens``, slots in the
order a skewed routing sorts them. Median of 20 runs after a warm-up (gpu_bench_common.measure). Writes JSON
(command, git SHA, device) to $OUT or benchmarks/results/moe_glue_<date>.json.
"""

from __future__ import annotations

import argparse
import json

import torch

from gpu_bench_common import measure, rel_err, write_results
from genolc.model.ops.moe.op import combine_op, gather_slots_op, slot_positions, swiglu_op
from genolc.model.ops.moe.swiglu import clamped_swiglu
from genolc.model.presets import base, small

LIMIT = 7.0


def eager_swiglu(hidden: torch.Tensor) -> torch.Tensor:
    return clamped_swiglu(*hidden.chunk(2, dim=-1), LIMIT)


def fused_swiglu(hidden: torch.Tensor) -> torch.Tensor:
    return swiglu_op(hidden, LIMIT)


def eager_gather_combine(x, rows, order, position, weights):
    top_k = weights.shape[1]
    gathered = x[order // top_k]
    weighted = (rows + 0 * gathered[:, :1]) * weights.reshape(-1)[order].unsqueeze(-1).to(rows.dtype)
    by_slot = torch.index_copy(torch.empty_like(weighted), 0, order, weighted)
    return by_slot.view(-1, top_k, rows.shape[-1]).sum(dim=1)


def fused_gather_combine(x, rows, order, position, weights):
    gathered = gather_slots_op(x, order, position, weights.shape[1])
    return combine_op(rows + 0 * gathered[:, :1], position, weights)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768)
    args = parser.parse_args()
    results = []
    for name, config in (("small", small()), ("base", base())):
        top_k, dim, inter = config.num_experts_per_tok, config.hidden_size, config.moe_intermediate_size
        slots = args.tokens * top_k
        skew = torch.linspace(3.0, 0.2, config.n_routed_experts, device="cuda")
        order = torch.multinomial(skew.expand(args.tokens, -1), top_k).reshape(-1).argsort(stable=True)
        position = slot_positions(order)
        hidden = (4.0 * torch.randn(slots, 2 * inter, device="cuda")).bfloat16().requires_grad_(True)
        d_act = torch.randn(slots, inter, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(args.tokens, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        rows = torch.randn(slots, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        weights = torch.rand(args.tokens, top_k, device="cuda", requires_grad=True)
        d_out = torch.randn(args.tokens, dim, device="cuda", dtype=torch.bfloat16)
        exact_act = eager_swiglu(hidden.detach().double())
        exact_out = eager_gather_combine(x.detach().double(), rows.detach().double(), order, position,
                                         weights.detach().double())
        cases = [("swiglu", way, fn, (hidden,), d_act, exact_act)
                 for way, fn in (("eager", eager_swiglu), ("fused", fused_swiglu))]
        cases += [("gather + combine", way, fn, (x, rows, order, position, weights), d_out, exact_out)
                  for way, fn in (("eager", eager_gather_combine), ("fused", fused_gather_combine))]
        for part, way, fn, inputs, grad, exact in cases:
            leaves = [t for t in inputs if t.requires_grad]
            detached = [t.detach() if t.requires_grad else t for t in inputs]
            forward = measure(lambda: fn(*detached), repeats=20)["ms"]
            both = measure(lambda: torch.autograd.grad(fn(*inputs), leaves, grad), repeats=20)["ms"]
            results.append({"preset": name, "tokens": args.tokens, "top_k": top_k, "dim": dim, "inter": inter,
                            "part": part, "way": way, "forward_ms": round(forward, 3),
                            "forward_backward_ms": round(both, 3),
                            "relative_error_vs_fp64": rel_err(fn(*detached).double(), exact)})
            print(json.dumps(results[-1]), flush=True)
    print(f"wrote {write_results('moe_glue', results, {'timing': 'median of 20 after one warm-up, CUDA events'})}")


if __name__ == "__main__":
    main()
