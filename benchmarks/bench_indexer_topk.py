"""python benchmarks/bench_indexer_topk.py [--windows 512k,1M] [--sweep]

The indexer's top-k alone, on the score block of a window's last query chunk (the largest a step scores): both
presets' indexer (8 heads x 64 dims, kpool 4, 512 pools kept a query), bf16 random features scored by the Triton
scoring kernel, the chunk's rows as genolc.model.ops.indexer.triton.default_query_chunk sizes them. torch.topk over
the block (what the op ran before 2026-12-02) against top_pools, whole and per kernel (CUDA events), medians of 10.
--sweep also times other segment / block / tile / warp sizes of top_pools. Counts: the causal scores
(rows x mean visible pools x 4 bytes), which top_pools reads twice (torch.topk reads whole rows, in four radix
passes and a gather); GB/s is twice that over top_pools' time.
Writes benchmarks/results/indexer_topk_<date>.json (OUT when set).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from gpu_bench_common import write_results
from genolc.model.ops.indexer import triton as indexer_triton
from genolc.model.ops.indexer.triton_topk import TopPoolsBuffers, launch_shape, top_pools

HEADS, DIM, KPOOL, KEEP = 8, 64, 4, 512
WINDOWS = {"128k": 131072, "512k": 524288, "1M": 1048576}
STAGES = ["group tops", "floors", "candidates", "select"]
SWEEP = [dict(segment=s, block=b, tile=t, warps=w) for s, b, t, w in
         [(8192, 1024, 4096, 4), (32768, 1024, 4096, 4), (16384, 2048, 4096, 4), (16384, 4096, 4096, 4),
          (16384, 4096, 4096, 8), (16384, 1024, 8192, 8), (32768, 4096, 8192, 8), (65536, 4096, 8192, 8)]]
SWEEP += [dict(select_warps=16), dict(select_warps=4)]


def score_block(window: int) -> tuple[torch.Tensor, int]:
    """The last query chunk's fp32 score block and its first query."""
    n_pools = window // KPOOL
    rows = indexer_triton.default_query_chunk(n_pools)
    first = window - rows
    index_q = torch.randn(rows, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    weights = torch.randn(rows, HEADS, device="cuda") * HEADS ** -0.5
    pooled = torch.randn(n_pools, DIM, device="cuda", dtype=torch.bfloat16)
    block = torch.empty(rows, n_pools, device="cuda")
    indexer_triton.pool_score_block(index_q, weights, pooled, first, DIM ** -0.5, KPOOL, block)
    return block, first


def timed(fn, repeats: int = 10) -> tuple[float, list[list[float]]]:
    """Median ms of ``fn(stages)`` and each run's per-stage ms (from the events ``fn`` appends)."""
    fn(None)
    torch.cuda.synchronize()
    totals, per_stage = [], []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        stages: list = []
        start.record()
        fn(stages)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        torch.cuda.synchronize()
        totals.append(start.elapsed_time(end))
        marks = [start] + stages
        per_stage.append([a.elapsed_time(b) for a, b in zip(marks, marks[1:])])
    return statistics.median(totals), per_stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", default="512k,1M", help=f"comma-separated, from {', '.join(WINDOWS)}")
    parser.add_argument("--sweep", action="store_true", help="also time other launch shapes")
    args = parser.parse_args()
    rows_out = []
    for name in args.windows.split(","):
        block, first = score_block(WINDOWS[name])
        rows, cols = block.shape
        visible = torch.clamp((first + torch.arange(rows, device="cuda") + 1) // KPOOL, max=cols)
        causal_gb = float(visible.sum()) * 4 / 1e9
        reference = block.topk(KEEP, dim=-1).indices.sort(-1).values
        torch_ms, _ = timed(lambda stages: block.topk(KEEP, dim=-1))
        base = {"window": name, "rows": rows, "pools": cols, "causal_scores_GB": causal_gb}
        rows_out.append({**base, "variant": "torch.topk", "ms": torch_ms})
        print(rows_out[-1], flush=True)
        for overrides in [{}] + (SWEEP if args.sweep else []):
            shape = launch_shape(KEEP, **overrides)
            out = torch.empty(rows, KEEP, dtype=torch.int64, device="cuda")
            buffers = TopPoolsBuffers.allocate(rows, cols, KEEP, block.device, shape)

            def run(stages):
                top_pools(block, first_query=first, kpool=KPOOL, keep=KEEP, out=out, buffers=buffers, shape=shape,
                          stages=stages)

            ms, per_stage = timed(run)
            same = float((out == reference).all(-1).float().mean())
            stage_ms = {stage: statistics.median(run_ms[i] for run_ms in per_stage) for i, stage in enumerate(STAGES)}
            rows_out.append({**base, "variant": "top_pools", "shape": overrides or "default", "ms": ms,
                             "stage_ms": stage_ms, "GB_s": 2 * causal_gb / ms * 1e3,
                             "rows_as_torch_topk": same})
            print(rows_out[-1], flush=True)
        del block
        torch.cuda.empty_cache()
    print("wrote", write_results("indexer_topk", rows_out, {"heads": HEADS, "dim": DIM, "kpool": KPOOL, "keep": KEEP}))


if __name__ == "__main__":
    main()
