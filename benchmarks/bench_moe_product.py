"""python benchmarks/bench_moe_product.py [--tokens 65536]   (GPU; carry [".gpu"])

One MoE layer of `small` and of `base` (a built model's second layer: routed experts on the grouped GEMMs, the
shared expert, the sigmoid router) on one chunk of ``--tokens`` bf16 inputs under bf16 autocast, as the trainer runs
it, two ways of making the router's and the shared expert's projections of the layer's input:

- ``one_product``: ``MoE.forward`` as it is (``MoE.route``): one GEMM of x with the router's, the shared gate's and
  the shared up projection's weights side by side; x's gradient is one GEMM.
- ``separate``: what genolc ran until then: the router's own ``[T, E]`` product, then the shared expert's gate and up
  as two products; autograd adds the three shares of x's gradient (and the routed experts') in bf16.

Forward and forward + backward (gradients for x and every weight), median of 20 after a warm-up
(gpu_bench_common.measure), the output's and x's gradient's relative difference between the two ways, and the
kernels of one forward and backward. Writes JSON (command, git SHA, device) to $OUT or
benchmarks/results/moe_product_<date>.json.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from gpu_bench_common import measure, profiled_kernels, rel_err, write_results
from genolc.model import build_model, preset
from genolc.model.ops.moe.swiglu import clamped_swiglu


def separate(moe, x: torch.Tensor) -> torch.Tensor:
    """MoE.forward with the router and the shared expert's gate and up each making its own product."""
    flat = x.reshape(-1, x.shape[-1])
    routing = moe.gate(flat)
    routed, _ = moe.experts(flat, routing.expert_ids, routing.weights)
    shared = moe.shared_experts
    gate, up = F.linear(x, shared.gate_proj.weight), F.linear(x, shared.up_proj.weight)
    return routed.view_as(x) + shared.down_proj(clamped_swiglu(gate, up, shared.swiglu_limit))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=65536)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (it times the MoE layer's GEMMs there)")
    rows = []
    for name in ("small", "base"):
        torch.manual_seed(0)
        moe = build_model(preset(name), device="cuda").layers[1].mlp
        x = torch.randn(1, args.tokens, moe.gate.weight.shape[1], device="cuda").to(torch.bfloat16)
        x.requires_grad_()
        grad = torch.randn_like(x)
        leaves = [x, *moe.parameters()]
        ways = {"one_product": lambda inputs: moe(inputs).hidden, "separate": lambda inputs: separate(moe, inputs)}
        results = {}
        for way, run in ways.items():
            def forward_only():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return run(x.detach())

            def forward_backward():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = run(x)
                return out, torch.autograd.grad(out, leaves, grad, allow_unused=True)

            out, grads = forward_backward()
            results[way] = (out.detach(), grads[0])
            rows.append({"preset": name, "tokens": args.tokens, "way": way,
                         "forward_ms": round(measure(forward_only, repeats=20)["ms"], 3),
                         "forward_backward_ms": round(measure(forward_backward, repeats=20)["ms"], 3),
                         "kernels": profiled_kernels(forward_backward)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "kernels"}))
        (out, dx), (other_out, other_dx) = results["one_product"], results["separate"]
        rows.append({"preset": name, "output_relative_difference": rel_err(out, other_out),
                     "x_gradient_relative_difference": rel_err(dx, other_dx)})
        print(json.dumps(rows[-1]))
    print(f"wrote {write_results('moe_product', rows, {'timing': 'median of 20 after one warm-up, CUDA events'})}")


if __name__ == "__main__":
    main()
