"""python benchmarks/bench_indexer_topk.py [--windows 512k,1M] [--sweep] [--score-sweep]

The indexer's top-k alone, on the score block of a window's last query chunk (the largest a step scores): both
presets' indexer (8 heads x 64 dims, kpool 4, 512 pools kept a query), bf16 random features scored by the Triton
scoring kernel, the chunk's rows as genolc.model.ops.indexer.triton.default_query_chunk sizes them. torch.topk over
the block (what the op ran before 2026-12-02) against top_pools, whole and per kernel (CUDA events), medians of 10.
Then scoring and top-k together both ways streamed_select could run them (the scoring kernel and top_pools' four
launches, or the scoring kernel that writes the groups' tops and top_pools' other three), and top_pools at the
launches of its second read not yet timed (``CANDIDATE_LAUNCHES``: loading each step's next block ahead, 512-score
blocks, both). --sweep also times other segment / block / tile / warp sizes of top_pools; --score-sweep times the
scoring kernel's other tile shapes on the same block (and the largest difference of their scores from the default
tiles'). Counts: the causal scores (rows x mean visible pools x 4 bytes), which top_pools reads twice (torch.topk
reads whole rows, in four radix passes and a gather); GB/s is twice that over top_pools' time. Also the candidates a
row copied (mean, max) and the rows whose candidates overflowed their slots (select reads those rows again).
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
# Half as many groups: the floor's 2 G tops are then exactly keep, so the floor is their lowest (before 2026-12-03).
SWEEP += [dict(groups=KEEP // 2)]
CANDIDATE_LAUNCHES = [dict(prefetch=True), dict(block=512), dict(block=512, prefetch=True)]
SCORE_TILES = [dict(block_queries=m, block_pools=n, warps=w, stages=st) for m, n, w, st in
               [(64, 128, 4, 2), (64, 128, 4, 1), (64, 128, 8, 3), (64, 256, 8, 3), (64, 256, 8, 2), (128, 128, 8, 3),
                (32, 128, 4, 3), (64, 64, 4, 3)]]


def score_inputs(window: int) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], int]:
    """The last query chunk's scoring inputs (queries, head weights, pooled keys) and its first query."""
    n_pools = window // KPOOL
    rows = indexer_triton.default_query_chunk(n_pools)
    index_q = torch.randn(rows, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    weights = torch.randn(rows, HEADS, device="cuda") * HEADS ** -0.5
    pooled = torch.randn(n_pools, DIM, device="cuda", dtype=torch.bfloat16)
    return (index_q, weights, pooled), window - rows


def score(inputs, first: int, out: torch.Tensor, **tiles) -> torch.Tensor:
    return indexer_triton.pool_score_block(*inputs, first, DIM ** -0.5, KPOOL, out, **tiles)


def score_sweep(inputs, first: int, block: torch.Tensor, base: dict) -> list[dict]:
    """The scoring kernel at each of SCORE_TILES against its default tiles (``block`` holds their scores)."""
    rows = []
    finite = torch.isfinite(block)
    for tiles in [{}] + SCORE_TILES:
        out = torch.empty_like(block)
        ms, _ = timed(lambda stages: score(inputs, first, out, **tiles))
        same_mask = bool((torch.isfinite(out) == finite).all())
        diff = float((out[finite] - block[finite]).abs().max())
        rows.append({**base, "variant": "pool_score_block", "tiles": tiles or "default", "ms": ms,
                     "written_GB_s": block.numel() * 4 / ms / 1e6, "same_causal_mask": same_mask,
                     "max_abs_diff": diff})
        print(rows[-1], flush=True)
    return rows


def selection_pipelines(inputs, first: int, block: torch.Tensor, reference: torch.Tensor, base: dict) -> list[dict]:
    """Scoring and top-k together, as streamed_select runs them: the scoring kernel then top_pools' four launches,
    against the scoring kernel that also writes the groups' tops then top_pools' last three."""
    rows, cols = block.shape
    shape = launch_shape(KEEP)
    found = []
    for fused in (False, True):
        out = torch.empty(rows, KEEP, dtype=torch.int64, device="cuda")
        scores = torch.empty_like(block)
        buffers = TopPoolsBuffers.allocate(rows, cols, KEEP, block.device, shape)

        def run(stages):
            score(inputs, first, scores, **({"tops": buffers.tops, "shape": shape} if fused else {}))
            top_pools(scores, first_query=first, kpool=KPOOL, keep=KEEP, out=out, buffers=buffers, shape=shape,
                      tops_ready=fused)

        ms, _ = timed(run)
        finite = torch.isfinite(block)
        found.append({**base, "variant": "score + top_pools" + (", tops from the scoring" if fused else ""),
                      "ms": ms, "same_causal_mask": bool((torch.isfinite(scores) == finite).all()),
                      "max_abs_diff": float((scores[finite] - block[finite]).abs().max()),
                      "rows_as_torch_topk": float((out == reference).all(-1).float().mean())})
        print(found[-1], flush=True)
    return found


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
    parser.add_argument("--sweep", action="store_true", help="also time other top_pools shapes")
    parser.add_argument("--score-sweep", action="store_true", help="also time the scoring kernel's tile shapes")
    args = parser.parse_args()
    rows_out = []
    for name in args.windows.split(","):
        inputs, first = score_inputs(WINDOWS[name])
        block = torch.empty(inputs[0].shape[0], inputs[2].shape[0], device="cuda")
        score(inputs, first, block)
        rows, cols = block.shape
        visible = torch.clamp((first + torch.arange(rows, device="cuda") + 1) // KPOOL, max=cols)
        causal_gb = float(visible.sum()) * 4 / 1e9
        reference = block.topk(KEEP, dim=-1).indices.sort(-1).values
        torch_ms, _ = timed(lambda stages: block.topk(KEEP, dim=-1))
        base = {"window": name, "rows": rows, "pools": cols, "causal_scores_GB": causal_gb}
        if args.score_sweep:
            rows_out += score_sweep(inputs, first, block, base)
        rows_out.append({**base, "variant": "torch.topk", "ms": torch_ms})
        print(rows_out[-1], flush=True)
        rows_out += selection_pipelines(inputs, first, block, reference, base)
        # The second read's launches still to be timed against the default, always (triton_topk's docstring).
        for overrides in [{}, *CANDIDATE_LAUNCHES] + (SWEEP if args.sweep else []):
            shape = launch_shape(KEEP, **overrides)
            out = torch.empty(rows, KEEP, dtype=torch.int64, device="cuda")
            buffers = TopPoolsBuffers.allocate(rows, cols, KEEP, block.device, shape)

            def run(stages):
                top_pools(block, first_query=first, kpool=KPOOL, keep=KEEP, out=out, buffers=buffers, shape=shape,
                          stages=stages)

            ms, per_stage = timed(run)
            same = float((out == reference).all(-1).float().mean())
            # Rows whose candidates overflowed their slots: select reads those rows again (up to five times).
            copied = buffers.counts[:rows, 0][visible > KEEP]
            stage_ms = {stage: statistics.median(run_ms[i] for run_ms in per_stage) for i, stage in enumerate(STAGES)}
            rows_out.append({**base, "variant": "top_pools", "shape": overrides or "default", "ms": ms,
                             "stage_ms": stage_ms, "GB_s": 2 * causal_gb / ms * 1e3,
                             "rows_as_torch_topk": same, "candidates_mean": float(copied.float().mean()),
                             "candidates_max": int(copied.max()), "overflow_rows": int((copied > shape.cap).sum())})
            print(rows_out[-1], flush=True)
        block = inputs = None
        torch.cuda.empty_cache()
    print("wrote", write_results("indexer_topk", rows_out, {"heads": HEADS, "dim": DIM, "kpool": KPOOL, "keep": KEEP}))


if __name__ == "__main__":
    main()
