"""python benchmarks/bench_slab_order.py [--shapes base-512k,base-1M,small-512k] [--sweep]   (on the GPU)

The slab order of the DSA backward's index rows (genolc/model/ops/dsa/tilelang/backward_slabs.py: each row sorted,
empty slots last, and cut at 32k-row key slabs) on the rows of one chunk of a training step at the end of its
window: `base` (32k queries over 512k and 1M keys) and `small` (64k queries over 512k keys), W = 2051 int32 slots
as the indexer writes them on CUDA. Each query at position ``p`` keeps 512 distinct pools of 4 tokens among its
complete ones (``[0, (p + 1) // 4)``, drawn uniformly), in ascending pool order as top_pools writes them, expanded
by indexer.layout.index_rows (``pool * 4 + 0..3``, then the 3 tail slots: its own incomplete pool's tokens up to
``p``, -1 after). ``--order shuffled`` also times the same rows shuffled within each row.

Times backward_slabs.slab_order (torch: a key-value radix sort, where, searchsorted, masked_fill) against
triton_slab_order.slab_order (one program a row: a bitonic sort in registers and the bounds counted in the kernel),
medians of ``--repeats`` after a warm-up (gpu_bench_common.measure, CUDA events), and checks that both give the same
rows and offsets bit for bit (exit status 1 when not). ``--sweep`` also times the Triton order with 8 and 16 warps
and with its bounds cut by torch.searchsorted instead of in the kernel. GB/s: the rows read and written and the
offsets written, over the time. Writes JSON (command, git SHA, device) to $OUT or
benchmarks/results/slab_order_<date>.json.
"""

from __future__ import annotations

import argparse
import sys

import torch

from gpu_bench_common import measure, print_table, write_results
from genolc.model.ops.dsa import triton_slab_order
from genolc.model.ops.dsa.tilelang import backward_slabs
from genolc.model.ops.dsa.tilelang.backward_config import slab_count
from genolc.model.ops.indexer import layout

KPOOL, KEEP_POOLS, SLAB_ROWS = 4, 512, backward_slabs.DEFAULT_SLAB_ROWS
SHAPES = {"base-512k": (32768, 524288), "base-1M": (32768, 1048576), "small-512k": (65536, 524288)}
SWEEP = {"8 warps": {"warps": 8}, "16 warps": {"warps": 16}, "searchsorted bounds": {"kernel_bounds": 0}}


def window_end_rows(queries: int, kv_len: int, seed: int, pool_chunk: int = 1024) -> torch.Tensor:
    """``[1, queries, W]`` int32 index rows of the window's last ``queries`` positions (see the module docstring)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    first = kv_len - queries
    n_pools = kv_len // KPOOL
    pools = torch.empty(queries, KEEP_POOLS, dtype=torch.int64, device="cuda")
    pool_ids = torch.arange(n_pools, device="cuda")
    for q0 in range(0, queries, pool_chunk):
        q1 = min(queries, q0 + pool_chunk)
        visible = (first + torch.arange(q0, q1, device="cuda") + 1) // KPOOL
        scores = torch.rand(q1 - q0, n_pools, generator=gen, device="cuda")
        scores.masked_fill_(pool_ids[None] >= visible[:, None], -1.0)
        chosen = scores.topk(KEEP_POOLS, dim=-1)
        # Ascending with -1 (a pool not visible, where fewer than 512 are) after the kept ones, as top_pools writes.
        kept = chosen.indices.masked_fill(chosen.values < 0, n_pools).sort(-1).values
        pools[q0:q1] = kept.masked_fill(kept == n_pools, -1)
        del scores, chosen
    rows = layout.index_rows(pools[None], query_offset=first, kpool=KPOOL, select_tail=True, dtype=torch.int32)
    return rows.contiguous()


def shuffled(rows: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    order = torch.rand(rows.shape, generator=gen, device="cuda").argsort(-1)
    return rows.gather(-1, order).contiguous()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, from {', '.join(SHAPES)}")
    parser.add_argument("--order", default="ascending,shuffled", help="comma-separated: ascending, shuffled")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sweep", action="store_true", help="also time 8 and 16 warps and searchsorted bounds")
    args = parser.parse_args()
    unknown = [name for name in args.shapes.split(",") if name not in SHAPES]
    if unknown:
        parser.error(f"unknown --shapes {', '.join(unknown)}; use {', '.join(SHAPES)}")
    results, mismatches = [], 0
    for name in args.shapes.split(","):
        queries, kv_len = SHAPES[name]
        ascending = window_end_rows(queries, kv_len, seed=queries + kv_len)
        for order in args.order.split(","):
            indices = ascending if order == "ascending" else shuffled(ascending, seed=1)
            n_slabs = slab_count(SLAB_ROWS, kv_len)
            moved_gb = (indices.numel() * (indices.element_size() + 4) + queries * (n_slabs + 1) * 4) / 1e9
            base = {"shape": name, "order": order, "queries": queries, "kv_len": kv_len, "width": indices.shape[-1],
                    "slab_rows": SLAB_ROWS, "bounds": n_slabs + 1,
                    "valid_slots_mean": float((indices >= 0).sum(-1).float().mean())}
            expected = backward_slabs.slab_order(indices, SLAB_ROWS, kv_len)
            timed = measure(lambda: backward_slabs.slab_order(indices, SLAB_ROWS, kv_len), args.repeats)
            torch_ms = timed["ms"]
            results.append({**base, "variant": "torch", "ms": timed["ms"], "ms_all": timed["ms_all"],
                            "peak_above_inputs_gib": timed["peak_above_inputs_gib"]})
            print(results[-1], flush=True)
            for variant, options in {"triton": {}, **(SWEEP if args.sweep else {})}.items():
                got = triton_slab_order.slab_order(indices, SLAB_ROWS, kv_len, **options)
                same = torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
                mismatches += not same
                del got
                timed = measure(lambda: triton_slab_order.slab_order(indices, SLAB_ROWS, kv_len, **options),
                                args.repeats)
                results.append({**base, "variant": variant, "ms": timed["ms"], "ms_all": timed["ms_all"],
                                "peak_above_inputs_gib": timed["peak_above_inputs_gib"],
                                "GB_s": moved_gb / timed["ms"] * 1e3, "same_as_torch": same,
                                "speedup": torch_ms / timed["ms"]})
                print(results[-1], flush=True)
        ascending = indices = expected = None
        torch.cuda.empty_cache()
    print_table(results, ["shape", "order", "bounds", "variant", "ms", "GB_s", "speedup", "same_as_torch"])
    print("wrote", write_results("slab_order", results, {"kpool": KPOOL, "keep_pools": KEEP_POOLS,
                                                         "slab_rows": SLAB_ROWS,
                                                         "default_warps": triton_slab_order.DEFAULT_WARPS,
                                                         "kernel_bounds": triton_slab_order.KERNEL_BOUNDS}))
    if mismatches:
        print(f"{mismatches} Triton run(s) differ from the torch order")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
