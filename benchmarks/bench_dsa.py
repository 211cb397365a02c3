"""python benchmarks/bench_dsa.py [--sizes 64k,256k,1M] [--presets small,base]

DSA sparse attention fwd+bwd (B=1, Dk=Dv=128, bf16, index rows 2051 wide = topk 2048 + kpool 4 - 1, int32) for the
presets' head counts (small H=8, base H=12): the fused Triton op vs the pure-torch reference (64k only).
Index rows: 512 distinct causal pools per query drawn at random over all visible pools (uniformly spread: the
worst case for cache reuse), plus the tail. Counts written down:
  FLOPs  fwd 4*T*W*H*D (scores + weighted values), bwd 10*T*W*H*D (scores, dP, dQ, dK, dV);
  bytes  gathered K/V rows fwd T*W*H*(Dk+Dv)*2, bwd the same plus fp32 atomic adds T*W*H*(Dk+Dv)*4.
The op is gather-bound (1 FLOP per byte): GB/s of gathered bytes is the figure to compare with ~4.8 TB/s HBM.
Writes benchmarks/results/dsa_<date>.json.
"""

from __future__ import annotations


import torch

from gpu_bench_common import SIZES, parse_bench_args, print_table, try_measure, write_results
from genolc.model.ops.dsa import fast, reference

HEADS = {"small": 8, "base": 12}
DIM, TOPK, KPOOL = 128, 2048, 4
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
NOTES = {"width": WIDTH, "flops_fwd_bwd": "14*T*W*H*D", "gathered_bytes_fwd_bwd": "T*W*H*(Dk+Dv)*(2+2+4)"}


def main() -> None:
    args = parse_bench_args(__doc__)
    rows = []
    for size in args.sizes.split(","):
        length = SIZES[size]
        indices = stratified_rows(length)
        for preset in args.presets.split(","):
            heads = HEADS[preset]
            q = torch.randn(1, length, heads, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k, v = (torch.randn(1, length, heads, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(2))
            d_out = torch.randn(1, length, heads, DIM, device="cuda", dtype=torch.bfloat16)
            pairs = length * WIDTH * heads
            flops = 14 * pairs * DIM
            gathered = pairs * 2 * DIM * (2 + 2 + 4)
            variants = [("fused", fast.sparse_attention, 3 if length < SIZES["1M"] else 1)]
            if length <= SIZES["64k"]:
                variants.append(("reference", reference.sparse_attention, 1))
            for name, op, repeats in variants:
                def step():
                    out = op(q, k, v, indices, DIM ** -0.5)
                    torch.autograd.grad(out, (q, k, v), d_out)

                def forward_only():
                    with torch.no_grad():
                        op(q, k, v, indices, DIM ** -0.5)

                result = try_measure(step, repeats)
                fwd = try_measure(forward_only, repeats)
                row = {"preset": preset, "T": size, "heads": heads, "variant": name, **result,
                       "fwd_ms": fwd.get("ms")}
                if "ms" in result:
                    row["TFLOP_s"] = flops / result["ms"] / 1e9
                    row["gather_GB_s"] = gathered / result["ms"] / 1e6
                if fwd.get("ms"):
                    row["fwd_gather_GB_s"] = pairs * 2 * DIM * 2 / fwd["ms"] / 1e6
                rows.append(row)
                print(row, flush=True)
                write_results(RESULT_NAME, rows, NOTES)
            del q, k, v, d_out
            torch.cuda.empty_cache()
        del indices
    path = write_results(RESULT_NAME, rows, NOTES)
    print_table(rows, ["preset", "T", "variant", "ms", "fwd_ms", "TFLOP_s", "gather_GB_s", "fwd_gather_GB_s",
                       "peak_above_inputs_gib"])
    print("wrote", path)


if __name__ == "__main__":
    main()
