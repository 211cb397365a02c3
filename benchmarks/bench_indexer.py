"""python benchmarks/bench_indexer.py [--sizes 64k,256k,1M]

Indexer selection (no grad; both presets use 8 heads x 64 dims, kpool 4, topk 2048, tail on; bf16 features):
the Triton-scored streamed selection with its top-k kernel ("streamed"), the same with torch.topk over each score
block ("streamed, torch.topk", what it ran before 2026-12-02), and the pure-torch reference (64k, 256k). Counts
written down:
  FLOPs  2*H*D per (query, causal pool) pair, T*(T/kpool)/2 pairs; score bytes written+read by top-k 8 per pair.
The streamed op returns int32 rows, as the model asks for on CUDA (the reference returns int64). Peak memory is
reported above the inputs and also minus the [T, 2051] output (the working set): the output itself is T*2051*4
bytes, 7.8 GiB at 1M (the first run of this benchmark, 2026-11-29, measured int64 rows: 15.6 GiB).
Writes benchmarks/results/indexer_<date>.json.
"""

from __future__ import annotations

import functools

import torch

from gpu_bench_common import SIZES, parse_bench_args, print_table, try_measure, write_results
from genolc.model.ops.indexer import reference, triton as indexer_triton

HEADS, DIM, KPOOL, TOPK = 8, 64, 4, 2048

RESULT_NAME = "indexer"
NOTES = {"flops": "2*H*D*T*(T/kpool)/2", "heads": HEADS, "dim": DIM}


def main() -> None:
    args = parse_bench_args(__doc__, presets=False)
    rows = []
    for size in args.sizes.split(","):
        length = SIZES[size]
        index_q = torch.randn(1, length, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
        weights = torch.randn(1, length, HEADS, device="cuda") * HEADS ** -0.5
        pooled = torch.randn(1, length // KPOOL, DIM, device="cuda", dtype=torch.bfloat16)
        pairs = length * (length // KPOOL) / 2
        variants = [("streamed", indexer_triton.select_indices, torch.int32),
                    ("streamed, torch.topk", functools.partial(indexer_triton.streamed_select, fused_topk=False,
                                                               query_chunk=None, query_offset=0), torch.int32)]
        if length <= SIZES["256k"]:
            variants.append(("reference", reference.select_indices, torch.int64))
        for name, op, row_dtype in variants:
            output_gib = length * (TOPK + KPOOL - 1) * row_dtype.itemsize / 2 ** 30
            dtype_arg = {} if name == "reference" else {"out_dtype": row_dtype}

            def step():
                op(index_q, weights, pooled, kpool=KPOOL, topk=TOPK, select_tail=True, softmax_scale=DIM ** -0.5,
                   **dtype_arg)

            result = try_measure(step, 1 if length >= SIZES["1M"] or name == "reference" else 3)
            row = {"T": size, "variant": name, "rows": str(row_dtype), **result}
            if "ms" in result:
                row["TFLOP_s"] = pairs * 2 * HEADS * DIM / result["ms"] / 1e9
                row["score_GB_s"] = pairs * 8 / result["ms"] / 1e6
                row["working_gib"] = result["peak_above_inputs_gib"] - output_gib
            rows.append(row)
            print(row, flush=True)
            write_results(RESULT_NAME, rows, NOTES)
        del index_q, weights, pooled
        torch.cuda.empty_cache()
    path = write_results(RESULT_NAME, rows, NOTES)
    print("wrote", path)


if __name__ == "__main__":
    main()
