"""python benchmarks/bench_kda.py [--sizes 64k,256k,1M] [--presets small,base]

KDA fwd+bwd (B=1, D=128, bf16 q/k/v/beta, fp32 gate, l2norm in kernel) for the presets' head counts (small H=8,
base H=12): genolc's segment-wise fla op (segments of 64k and 32k) vs fla unsegmented (T <= 256k); the pure-torch
reference's figures (small, 64k; it does not fit beyond) are carried in the notes. Reports tokens/s, an estimated
TFLOP/s and peak memory (total, and above the inputs).
FLOP estimate (chunk C=64, per token and head): forward ~ 8*C*Dk + 6*Dk*Dv (intra-chunk Aqk/Akk and solve, state
reads for q and w, state update); backward ~ 2x forward; the segmented op re-runs the forward once more, which is
not counted as useful work. Target: base at 1M under 20 GiB ("workspace_gib": the peak above the inputs minus
the input gradients and the output that the op must return). Writes benchmarks/results/kda_<date>.json.
"""

from __future__ import annotations


import torch

from gpu_bench_common import SIZES, parse_bench_args, print_table, try_measure, write_results
from genolc.model.ops.kda import fast

HEADS = {"small": 8, "base": 12}
DIM = 128

RESULT_NAME = "kda"
NOTES = {"flops_fwd_bwd_per_token_head": 3 * (8 * 64 * DIM + 6 * DIM * DIM), "segment_len": fast.DEFAULT_SEGMENT_LEN,
         # The pure-torch reference is not re-run here (it needs ~54 GiB and 5.5 s at 64k, so 256k and 1M do not
         # fit in 141 GiB); measured on this H200 with the same op code at c2380e7 (kda_2026-11-29 first record):
         "reference_small_64k": {"ms": 5483.4, "peak_above_inputs_gib": 53.9, "Mtok_s": 0.012},
         "reference_memory_per_token_head_kib": 108}


def main() -> None:
    args = parse_bench_args(__doc__)
    rows = []
    for preset in args.presets.split(","):
        heads = HEADS[preset]
        for size in args.sizes.split(","):
            length = SIZES[size]
            shape = (1, length, heads, DIM)
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            g = (-5.0 * torch.sigmoid(torch.randn(shape, device="cuda") - 2.0)).requires_grad_(True)
            beta = torch.rand(1, length, heads, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            d_out = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            flops = 3 * length * heads * (8 * 64 * DIM + 6 * DIM * DIM)
            variants = [("segmented", lambda: fast.chunk_kda, 3),
                        ("segmented-32k", lambda: lambda *a, **kw: fast.chunk_kda(*a, segment_len=32768, **kw), 2)]
            if length <= SIZES["256k"]:
                variants.append(("fla", lambda: lambda *a, **kw: fast.chunk_kda(*a, segment_len=None, **kw), 3))
            for name, get_op, repeats in variants:
                op = get_op()

                def step():
                    out, _ = op(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
                    torch.autograd.grad(out, (q, k, v, g, beta), d_out)

                result = try_measure(step, repeats)
                row = {"preset": preset, "T": size, "heads": heads, "variant": name, **result}
                if "ms" in result:
                    # What the op itself holds beyond its inputs: the input gradients it must return, its output
                    # and its workspace; "workspace" takes the gradients and the output away.
                    grads_gib = sum(t.numel() * t.element_size() for t in (q, k, v, g, beta)) / 2 ** 30
                    out_gib = d_out.numel() * d_out.element_size() / 2 ** 30
                    row["workspace_gib"] = result["peak_above_inputs_gib"] - grads_gib - out_gib
                    row["Mtok_s"] = length / result["ms"] / 1e3
                    row["TFLOP_s"] = flops / result["ms"] / 1e9
                rows.append(row)
                print(row, flush=True)
                write_results(RESULT_NAME, rows, NOTES)
            del q, k, v, g, beta, d_out
            torch.cuda.empty_cache()
    path = write_results(RESULT_NAME, rows, NOTES)
    print_table(rows, ["preset", "T", "variant", "ms", "Mtok_s", "TFLOP_s", "peak_total_gib", "peak_above_inputs_gib",
                       "workspace_gib"])
    print("wrote", path)


if __name__ == "__main__":
    main()
