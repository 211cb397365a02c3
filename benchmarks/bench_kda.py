"""python benchmarks/bench_kda.py [--sizes 64k,256k,1M] [--presets small,base]

KDA fwd+bwd (B=1, D=128, bf16 q/k/v/beta, l2norm in kernel) for the presets' head counts (small H=8, base H=12):
genolc's segment-wise fla op (segments of 64k and 32k) vs fla unsegmented (T <= 256k), each with a finished fp32
decay g and with the layer's form ("gate": bf16 raw gate, decay formed inside fla; "-safe": fla's safe_gate path).
"gate-32k-safe" is what the model runs (kda_fla.chunk_kda's defaults with the layer's gate).
The pure-torch reference's figures (small, 64k; it does not fit beyond) are carried in the notes. Reports tokens/s,
an estimated TFLOP/s and peak memory (total, and above the inputs).
FLOP estimate (chunk C=64, per token and head): forward ~ 8*C*Dk + 6*Dk*Dv (intra-chunk Aqk/Akk and solve, state
reads for q and w, state update); backward ~ 2x forward; the segmented op re-runs the forward once more, which is
not counted as useful work. Target: base at 1M under 20 GiB, read as the peak above the inputs (what the op adds:
the input gradients it must return, its output, its workspace); "workspace_gib" takes the gradients and the output
away. Writes benchmarks/results/kda_<date>.json.
"""

from __future__ import annotations


import torch

from gpu_bench_common import SIZES, parse_bench_args, print_table, try_measure, write_results
from genolc.model.ops.kda import fla as kda_fla

HEADS = {"small": 8, "base": 12}
DIM = 128

RESULT_NAME = "kda"
NOTES = {"flops_fwd_bwd_per_token_head": 3 * (8 * 64 * DIM + 6 * DIM * DIM), "segment_len": kda_fla.DEFAULT_SEGMENT_LEN,
         # The pure-torch reference is not re-run here (it needs ~54 GiB and 5.5 s at 64k, so 256k and 1M do not
         # fit in 141 GiB); measured on this H200 with the same op code at c2380e7 (kda_2026-11-29 first record):
         "reference_small_64k": {"ms": 5483.4, "peak_above_inputs_gib": 53.9, "Mtok_s": 0.012},
         "reference_memory_per_token_head_kib": 108}


def _variants(length: int) -> list[tuple[str, dict, bool, int]]:
    """(name, kda_fla.chunk_kda keyword arguments, gate in the kernel?, timed repeats). "gate" variants take the layer's
    form: the raw gate pre-activation in bf16 with A_log/dt_bias/lower_bound, the decay formed inside fla."""
    variants = [("segmented", {"segment_len": 65536}, False, 3), ("segmented-32k", {"segment_len": 32768}, False, 2),
                ("gate", {"segment_len": 65536, "safe_gate": False}, True, 3),
                ("gate-32k", {"segment_len": 32768, "safe_gate": False}, True, 3),
                ("gate-32k-safe", {"segment_len": 32768, "safe_gate": True}, True, 2)]
    if length <= SIZES["256k"]:
        variants += [("fla", {"segment_len": None}, False, 3),
                     ("fla-gate", {"segment_len": None, "safe_gate": False}, True, 3)]
    return variants


def main() -> None:
    args = parse_bench_args(__doc__)
    rows = []
    for preset in args.presets.split(","):
        heads = HEADS[preset]
        for size in args.sizes.split(","):
            length = SIZES[size]
            shape = (1, length, heads, DIM)
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            beta = torch.rand(1, length, heads, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            d_out = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            flops = 3 * length * heads * (8 * 64 * DIM + 6 * DIM * DIM)
            for name, kwargs, gate_in_kernel, repeats in _variants(length):
                if gate_in_kernel:
                    g = (2.0 * torch.randn(shape, device="cuda")).bfloat16().requires_grad_(True)
                    A_log = torch.zeros(heads, device="cuda", requires_grad=True)
                    dt_bias = torch.zeros(heads * DIM, device="cuda", requires_grad=True)
                    kwargs = dict(kwargs, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, lower_bound=-5.0)
                    leaves = (q, k, v, g, beta, A_log, dt_bias)
                else:
                    g = (-5.0 * torch.sigmoid(torch.randn(shape, device="cuda") - 2.0)).requires_grad_(True)
                    leaves = (q, k, v, g, beta)

                def step():
                    out, _ = kda_fla.chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, **kwargs)
                    torch.autograd.grad(out, leaves, d_out)

                result = try_measure(step, repeats)
                row = {"preset": preset, "T": size, "heads": heads, "variant": name, "g_dtype": str(g.dtype),
                       **result}
                if "ms" in result:
                    # What the op itself holds beyond its inputs: the input gradients it must return, its output
                    # and its workspace; "workspace" takes the gradients and the output away.
                    grads_gib = sum(t.numel() * t.element_size() for t in leaves) / 2 ** 30
                    out_gib = d_out.numel() * d_out.element_size() / 2 ** 30
                    row["workspace_gib"] = result["peak_above_inputs_gib"] - grads_gib - out_gib
                    row["Mtok_s"] = length / result["ms"] / 1e3
                    row["TFLOP_s"] = flops / result["ms"] / 1e9
                rows.append(row)
                print(row, flush=True)
                write_results(RESULT_NAME, rows, NOTES)
                del g, leaves
            del q, k, v, beta, d_out
            torch.cuda.empty_cache()
    path = write_results(RESULT_NAME, rows, NOTES)
    print_table(rows, ["preset", "T", "variant", "ms", "Mtok_s", "TFLOP_s", "peak_total_gib", "peak_above_inputs_gib",
                       "workspace_gib"])
    print("wrote", path)


if __name__ == "__main__":
    main()
