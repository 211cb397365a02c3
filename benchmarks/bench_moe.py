"""python benchmarks/bench_moe.py [--sizes 64k,256k,1M] [--presets small,base]

Routed experts fwd+bwd (bf16, skewed random routing as real DNA produces): grouped GEMM in 64k-token chunks
(checkpointed) vs the reference per-expert loop (genolc.model.ops.moe.reference; T <= 256k).
FLOPs: 6*D*I per token slot forward (gate_up 4*D*I, down 2*D*I), x3 for fwd+bwd (recompute not counted).
Shapes: small E=16 K=2 D=1024 I=512; base E=32 K=4 D=1536 I=768. Writes benchmarks/results/moe_<date>.json.
"""

from __future__ import annotations


import torch

from gpu_bench_common import SIZES, parse_bench_args, print_table, try_measure, write_results
from genolc.model.layers.moe import Experts
from genolc.model.ops.moe.grouped_mm import grouped_experts
from genolc.model.ops.moe.reference import routed_experts
from genolc.model.presets import base, small

PRESETS = {"small": small, "base": base}

RESULT_NAME = "moe"
NOTES = {"flops": "18*T*K*D*I (fwd+bwd)", "chunk_tokens": 65536}


def main() -> None:
    args = parse_bench_args(__doc__)
    rows = []
    for preset in args.presets.split(","):
        config = PRESETS[preset]()
        experts = Experts(config).cuda().bfloat16()
        skew = torch.linspace(3.0, 0.2, config.n_routed_experts, device="cuda")
        for size in args.sizes.split(","):
            length = SIZES[size]
            x = torch.randn(length, config.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            expert_ids = torch.multinomial(skew.expand(length, -1), config.num_experts_per_tok)
            weights = torch.rand(length, config.num_experts_per_tok, device="cuda")
            d_out = torch.randn_like(x)
            params = (x, experts.gate_up_proj, experts.down_proj)
            flops = 3 * 6 * length * config.num_experts_per_tok * config.hidden_size * config.moe_intermediate_size
            variants = [("grouped", lambda: grouped_experts(x, expert_ids, weights, experts.gate_up_proj,
                                                            experts.down_proj, experts.swiglu_limit))]
            if length <= SIZES["256k"]:
                variants.append(("reference", lambda: routed_experts(x, expert_ids, weights, experts.gate_up_proj,
                                                                    experts.down_proj, experts.swiglu_limit)))
            for name, run in variants:
                def step():
                    out, _ = run()
                    torch.autograd.grad(out, params, d_out)

                result = try_measure(step, 3)
                row = {"preset": preset, "T": size, "variant": name, **result}
                if "ms" in result:
                    row["TFLOP_s"] = flops / result["ms"] / 1e9
                rows.append(row)
                print(row, flush=True)
                write_results(RESULT_NAME, rows, NOTES)
            counts = torch.bincount(expert_ids.flatten(), minlength=config.n_routed_experts)
            rows[-1]["tokens_per_expert"] = counts.tolist()
            del x, expert_ids, weights, d_out
            torch.cuda.empty_cache()
    path = write_results(RESULT_NAME, rows, NOTES)
    print("wrote", path)


if __name__ == "__main__":
    main()
