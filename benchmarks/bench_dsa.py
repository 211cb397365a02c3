"""python benchmarks/bench_dsa.py [--sizes 64k,256k,1M] [--presets small,base]

DSA sparse attention in MLA's absorbed form, fwd+bwd and fwd-only, B=1, bf16, index rows 2051 wide (topk 2048 +
kpool 4 - 1, int32), for the presets' shapes (small H=8, R=kv_lora_rank=256; base H=12, R=384): the fused Triton
op (genolc.model.ops.dsa.triton.sparse_latent_attention) and, at 64k for small only, the pure-torch reference.
Index rows: 512 distinct causal pools per query drawn at random over all visible pools (uniformly spread: the
worst case for cache reuse), plus the tail. Counts written down (T queries, W slots, H heads, R latent rank):
  FLOPs  fwd 4*T*W*H*R (S = Q C^T and P C), bwd 10*T*W*H*R (S, dP, dQ, dS^T Q, P^T dO): 14*T*W*H*R fwd+bwd;
  bytes  gathered latent rows T*W*R*2 per pass (fwd, bwd), plus T*W*R*4 of fp32 atomic adds in bwd.
One gathered row now serves all H heads (H FLOPs per byte times 2), so unlike the per-head kernel this is not
purely gather-bound; the figures to compare are TFLOP/s against the tensor cores and GB/s against ~4.8 TB/s HBM.
"before" in the JSON notes: the per-head (non-absorbed, Dk=Dv=128) fused kernel this one replaced, measured
2026-11-29 (benchmarks/results/dsa_2026-11-29_{64k,1M}.json). Repeats: 3 below 1M, 1 at 1M (after one warm-up).
Writes benchmarks/results/dsa_<date>.json (after every row).
"""

from __future__ import annotations

import torch

from gpu_bench_common import SIZES, parse_bench_args, print_table, try_measure, write_results
from genolc.model.ops.dsa import reference, triton as dsa_triton

SHAPES = {"small": (8, 256), "base": (12, 384)}  # (heads, kv_lora_rank)
QK_HEAD_DIM, TOPK, KPOOL = 128, 2048, 4
WIDTH = TOPK + KPOOL - 1


def stratified_rows(length: int) -> torch.Tensor:
    """``[1, T, W]`` int32 index rows in the indexer's layout with random, distinct, causal pools."""
    pools_per_row = TOPK // KPOOL
    out = torch.full((1, length, WIDTH), -1, dtype=torch.int32, device="cuda")
    within = torch.arange(KPOOL, device="cuda")
    for q0 in range(0, length, 65536):
        positions = torch.arange(q0, min(length, q0 + 65536), device="cuda")
        visible = (positions + 1) // KPOOL
        strata = torch.arange(pools_per_row, device="cuda")
        # Sorted draws c_j in [0, visible - 512] plus j: strictly increasing, so distinct and causal.
        spare = (visible - pools_per_row + 1).clamp_min(1)
        draws = (torch.rand(positions.numel(), pools_per_row, device="cuda") * spare[:, None]).floor().long()
        pools = draws.sort(-1).values + strata
        few = visible[:, None] <= pools_per_row      # short prefixes: every visible pool, the rest empty
        pools = torch.where(few, strata.expand_as(pools), pools)
        pools = pools.masked_fill(pools >= visible[:, None], -1)
        tokens = (pools[..., None] * KPOOL + within).masked_fill(pools[..., None] < 0, -1).flatten(-2)
        tail = (visible * KPOOL)[:, None] + torch.arange(KPOOL - 1, device="cuda")
        tail = tail.masked_fill(tail > positions[:, None], -1)
        out[0, positions, :TOPK] = tokens.int()
        out[0, positions, TOPK:] = tail.int()
    return out


RESULT_NAME = "dsa"
NOTES = {
    "form": "absorbed MLA (q_lat [B,T,H,R] over the shared latent [B,S,R]); fused Triton fwd+bwd",
    "width": WIDTH,
    "flops_fwd": "4*T*W*H*R", "flops_fwd_bwd": "14*T*W*H*R",
    "gathered_bytes_fwd": "T*W*R*2", "gathered_bytes_fwd_bwd": "T*W*R*(2+2+4) (bwd gather + fp32 atomics)",
    "before_per_head_fused_kernel_2026_11_29": {
        "what": "one program per (query, head), CUDA-core math, k/v [B,T,H,128] each, dk/dv atomics per head",
        "small_64k": {"ms": 569.7, "fwd_ms": 135.1, "peak_above_inputs_gib": 1.0},
        "small_64k_reference": {"ms": 16654.2, "fwd_ms": 3369.1, "peak_above_inputs_gib": 1.8},
        "base_64k": {"ms": 853.9, "fwd_ms": 202.1, "peak_above_inputs_gib": 1.51},
        "base_1M": {"ms": 21682.3, "fwd_ms": 3725.0, "peak_above_inputs_gib": 24.09},
    },
}


def main() -> None:
    args = parse_bench_args(__doc__)
    rows = []
    for size in args.sizes.split(","):
        length = SIZES[size]
        indices = stratified_rows(length)
        for preset in args.presets.split(","):
            heads, rank = SHAPES[preset]
            q_lat = torch.randn(1, length, heads, rank, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            latent = torch.randn(1, length, rank, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            d_out = torch.randn(1, length, heads, rank, device="cuda", dtype=torch.bfloat16)
            scale = QK_HEAD_DIM ** -0.5
            pairs = length * WIDTH
            flops_fwd = 4 * pairs * heads * rank
            flops = 14 * pairs * heads * rank
            gathered_fwd = pairs * rank * 2
            gathered = pairs * rank * (2 + 2 + 4)
            variants = [("fused", dsa_triton.sparse_latent_attention, 3 if length < SIZES["1M"] else 1)]
            if length <= SIZES["64k"] and preset == "small":
                variants.append(("reference", reference.sparse_latent_attention, 1))
            for name, op, repeats in variants:
                def step():
                    out = op(q_lat, latent, indices, scale)
                    torch.autograd.grad(out, (q_lat, latent), d_out)

                def forward_only():
                    with torch.no_grad():
                        op(q_lat, latent, indices, scale)

                result = try_measure(step, repeats)
                fwd = try_measure(forward_only, repeats)
                row = {"preset": preset, "T": size, "heads": heads, "rank": rank, "variant": name, **result,
                       "fwd_ms": fwd.get("ms"), "fwd_peak_above_inputs_gib": fwd.get("peak_above_inputs_gib")}
                if "ms" in result:
                    row["TFLOP_s"] = flops / result["ms"] / 1e9
                    row["gather_GB_s"] = gathered / result["ms"] / 1e6
                if fwd.get("ms"):
                    row["fwd_TFLOP_s"] = flops_fwd / fwd["ms"] / 1e9
                    row["fwd_gather_GB_s"] = gathered_fwd / fwd["ms"] / 1e6
                rows.append(row)
                print(row, flush=True)
                write_results(RESULT_NAME, rows, NOTES)
            del q_lat, latent, d_out
            torch.cuda.empty_cache()
        del indices
    path = write_results(RESULT_NAME, rows, NOTES)
    print_table(rows, ["preset", "T", "variant", "ms", "fwd_ms", "TFLOP_s", "fwd_TFLOP_s", "gather_GB_s",
                       "fwd_gather_GB_s", "peak_above_inputs_gib"])
    print("wrote", path)


if __name__ == "__main__":
    main()
