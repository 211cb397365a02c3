"""python benchmarks/bench_slab_order.py   (on the GPU; carry: [".gpu", ".gpudata"])

The slab-ordered DSA backward groups each index row by key slab before its kernel (genolc.model.ops.dsa.slab_order).
Its first form sorted the rows' int32 keys, a radix sort over 32 bits: 139 ms of `base`'s 512k step and 112 ms of
`small`'s (benchmarks/results/kda_conv_2026-12-03/, ``radixSortKVInPlace``). The torch form since sorts each slot's
slab number (uint8 for up to 255 slabs), stably, and gathers the rows in that order (2.33 ms a call for `base`,
4.62 for `small`; benchmarks/results/finetune_sync_slab_2026-12-04/). The Triton form packs rows whose slabs never
fall and counting-sorts the others, one program a row. All three are timed here at the shapes the chunked step runs
at 512k and 1M: `base`'s last 32k chunk (16 and 32 slabs of 32k rows) and `small`'s last 64k chunk, W = 2,051 slots
(512 pools of 4 rows, ascending as the Triton selector writes them, 1 % of the pool slots empty where they lie, as
its -1 holes, then 3 tail slots); and `small`'s rows with each row's slots shuffled (``any order``: the Triton
form's counting sort, the full sort's rows differ there and are not compared). The forms must give the same rows
and offsets where compared (the script exits 1 otherwise). Median of 20 after a warm-up (gpu_bench_common.measure);
the kernels of one call (torch.profiler). Then the backward's other input, the row dot rowsum(O * dO) in fp32
(genolc.model.ops.dsa.row_dot), in torch and in Triton, at `base`'s 32k chunk (12 heads x 384) and `small`'s 64k
chunk (8 x 256), bf16. Writes JSON (command, git SHA, device) to $OUT or benchmarks/results/slab_order_<date>.json.
"""

from __future__ import annotations

import argparse
import sys

import torch

from gpu_bench_common import measure, print_table, profiled_kernels, write_results
from genolc.model.ops.dsa.row_dot import row_dot_reference, row_dot_triton
from genolc.model.ops.dsa.slab_order import slab_order_reference, slab_order_triton
from genolc.model.ops.dsa.tilelang.backward_slabs import DEFAULT_SLAB_ROWS

_EMPTY = torch.iinfo(torch.int32).max
SHAPES = (("base", 512 * 1024, 32768, "ascending"), ("base", 1024 * 1024, 32768, "ascending"),
          ("small", 512 * 1024, 65536, "ascending"), ("small", 512 * 1024, 65536, "any order"))


def full_sort(indices: torch.Tensor, slab_rows: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """slab_order's first form: each row's int32 keys sorted ascending (empty slots last), cut by searchsorted."""
    n_slabs = max(1, -(-kv_len // slab_rows))
    rows = torch.where(indices < 0, _EMPTY, indices).to(torch.int32).sort(dim=-1).values
    bounds = (torch.arange(n_slabs + 1, device=indices.device) * slab_rows).clamp_max(_EMPTY - 1).to(torch.int32)
    offsets = torch.searchsorted(rows, bounds.expand(*rows.shape[:-1], n_slabs + 1).contiguous(), out_int32=True)
    return rows.masked_fill(rows == _EMPTY, -1).contiguous(), offsets.contiguous()


def selector_rows(queries: int, kv_len: int, topk: int = 2048, kpool: int = 4) -> torch.Tensor:
    """``[1, queries, topk + kpool - 1]`` int32 rows of the last chunk of a ``kv_len`` window, laid out as the Triton
    selector writes them (genolc/model/ops/indexer/layout.py)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    positions = torch.arange(kv_len - queries, kv_len, device="cuda")
    visible = (positions + 1) // kpool                       # complete pools a query may choose (causal)
    # One pool drawn from each of topk // kpool equal strata of the visible ones: ascending, no pool twice.
    stride = (visible // (topk // kpool))[:, None]
    within = (torch.rand((queries, topk // kpool), device="cuda", generator=gen) * stride).long()
    pools = torch.arange(topk // kpool, device="cuda") * stride + within
    holes = torch.rand(pools.shape, device="cuda", generator=gen) < 0.01
    pools = pools.masked_fill(holes, -1)
    tokens = (pools[..., None] * kpool + torch.arange(kpool, device="cuda")).masked_fill(pools[..., None] < 0, -1)
    tail = (positions // kpool * kpool)[:, None] + torch.arange(kpool - 1, device="cuda")
    tail = tail.masked_fill(tail > positions[:, None], -1)
    return torch.cat([tokens.flatten(1), tail], dim=1).to(torch.int32)[None].contiguous()


def timed_shape(model: str, kv_len: int, queries: int, order: str) -> dict:
    """The forms on one shape's rows: whether they agree, their median ms and their kernels."""
    indices = selector_rows(queries, kv_len)
    if order == "any order":
        gen = torch.Generator(device="cuda").manual_seed(1)
        shuffle = torch.rand(indices.shape, device="cuda", generator=gen).argsort(dim=-1)
        indices = torch.gather(indices, -1, shuffle).contiguous()
    forms = {"slab_number_sort": slab_order_reference, "triton": slab_order_triton}
    if order == "ascending":
        forms["full_sort"] = full_sort
    outputs = {name: form(indices, DEFAULT_SLAB_ROWS, kv_len) for name, form in forms.items()}
    expected = outputs["slab_number_sort"]
    row = {"model": model, "keys": kv_len, "queries": queries, "rows": order, "slabs": expected[1].shape[-1] - 1,
           "same": all(torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
                       for got in outputs.values())}
    del outputs
    for name, form in forms.items():
        def call(form=form):
            return form(indices, DEFAULT_SLAB_ROWS, kv_len)

        timing = measure(call, 20)
        row[f"{name}_ms"], row[f"{name}_ms_all"] = timing["ms"], timing["ms_all"]
        row[f"{name}_kernels"] = profiled_kernels(call)
    return row


def timed_row_dot(model: str, queries: int, heads: int, rank: int) -> dict:
    """Both row dots on one chunk's o_lat and its gradient: their largest difference, median ms and kernels."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    out, d_out = (torch.randn(1, queries, heads, rank, device="cuda", generator=gen).bfloat16() for _ in range(2))
    row = {"model": model, "queries": queries, "heads": heads, "rank": rank,
           "max_abs_diff": float((row_dot_triton(out, d_out) - row_dot_reference(out, d_out)).abs().max())}
    for name, form in (("torch", row_dot_reference), ("triton", row_dot_triton)):
        def call(form=form):
            return form(out, d_out)

        timing = measure(call, 20)
        row[f"{name}_ms"], row[f"{name}_ms_all"] = timing["ms"], timing["ms_all"]
        row[f"{name}_kernels"] = profiled_kernels(call)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (it times the slab order's forms and the row dot there)")
    rows = []
    for model, kv_len, queries, order in SHAPES:
        rows.append(timed_shape(model, kv_len, queries, order))
        torch.cuda.empty_cache()
    mismatched = [f"{row['model']} {row['keys']} {row['rows']}" for row in rows if not row["same"]]
    print_table(rows, ["model", "keys", "queries", "rows", "slabs", "same", "full_sort_ms", "slab_number_sort_ms",
                       "triton_ms"])
    dots = [timed_row_dot("base", 32768, 12, 384), timed_row_dot("small", 65536, 8, 256)]
    print_table(dots, ["model", "queries", "heads", "rank", "max_abs_diff", "torch_ms", "triton_ms"])
    path = write_results("slab_order", rows, {"slab_rows": DEFAULT_SLAB_ROWS, "mismatched": mismatched,
                                              "row_dot": dots})
    print(f"wrote {path}")
    if mismatched:
        print(f"the forms differ on {', '.join(mismatched)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
