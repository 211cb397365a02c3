"""python bench_dsa_backward_configs.py [--presets base,small] [--queries 32768] [--keys 524288]   (benchmarks/, H200)

Launch configs and slab sizes of the TileLang sparse-attention backward (genolc.model.ops.dsa.tilelang.backward:
one block per (query, key slab); BackwardConfig: slots per step, threads, rank slices; ``slab_rows``), timed at the
shape the chunked step runs: one 32k chunk of queries at the end of a 512k window (``--queries``, ``--keys``),
W = topk + kpool - 1 slots per query.

Index rows: 512 random pools of 4 rows each from all ``--keys`` rows plus 3 random tail rows (timing only; the
kernel does not need causal rows). q, latent, d_out random bf16; out and lse from the TileLang forward on the same
rows. Every config is compiled first, in parallel threads (``tilelang.compile`` of build_backward_prim_func, as
genolc/train/kernel_warmup.py compiles several kernels at once), then timed (median of ``--repeats`` after one
warm-up; the sort into slabs, the row dot and d_latent's zeroing are inside each call, as in training), and its
d_q and d_latent are compared with the default's (relative error; atomics add in a different order, so not
bit-equal; over 1e-2 the script exits 1 after writing its results). Then the default config at each of
``--slab-rows``, and with the keys cut to ``--queries`` rows (one slab: no sort, each block walks its whole row).

History: on 2026-12-02 the one-block-per-query kernel this one replaced took 79.6 ms (`base`) and 52.3 ms
(`small`) here, 53.6 and 31.8 with the keys cut to 32k; 14 launch configs were within 0.6 % of its default
(dsa_backward_configs_2026-12-02.json); the slab-ordered kernel took 72.3 and 40.9 ms at 32k-row slabs
(dsa_backward_slabs_2026-12-02.json).

Writes $OUT or benchmarks/results/dsa_backward_configs_<date>.json (command, git SHA, device).
"""

from __future__ import annotations

import argparse
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch

from gpu_bench_common import measure, rel_err, write_results
from genolc.model.ops.dsa.tilelang import backward as tilelang_backward
from genolc.model.ops.dsa.tilelang import forward as tilelang_forward
from genolc.model.presets import PRESETS

# (block_slots, threads, rank_parts); invalid ones for a rank are skipped (BackwardConfig.check).
CANDIDATES = [(32, 128, 1), (32, 128, 2), (32, 128, 3), (32, 128, 4), (32, 128, 6), (64, 128, 2), (64, 128, 3),
              (64, 256, 2), (64, 256, 3), (64, 256, 4), (64, 256, 6)]
SHARED_LIMIT = 227 * 1024      # sm_90's largest dynamic shared memory per block
COMPILE_BUDGET_S = 150.0     # per preset


def shape_of(name: str) -> dict:
    config = PRESETS[name]()
    return {"heads": config.num_attention_heads, "rank": config.kv_lora_rank,
            "width": config.index_topk + config.index_kpool - 1, "scale": config.qk_head_dim ** -0.5,
            "pools": config.index_topk // config.index_kpool, "kpool": config.index_kpool}


def configs_for(shape: dict) -> list[tilelang_backward.BackwardConfig]:
    default = tilelang_backward.default_backward_config(shape["rank"])
    out = [default]
    for entry in CANDIDATES:
        config = tilelang_backward.BackwardConfig(*entry)
        try:
            config.check(shape["rank"])
        except ValueError:
            continue
        if config.shared_bytes(shape["heads"], shape["rank"]) <= SHARED_LIMIT and config not in out:
            out.append(config)
    return out


def pool_rows(queries: int, keys: int, shape: dict, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kpool = shape["kpool"]
    pools = torch.randint(0, keys // kpool, (queries, shape["pools"]), generator=gen, device="cuda")
    rows = (pools[:, :, None] * kpool + torch.arange(kpool, device="cuda")).reshape(queries, -1)
    tail = torch.randint(0, keys, (queries, shape["width"] - rows.shape[1]), generator=gen, device="cuda")
    return torch.cat([rows, tail], 1).int()[None].contiguous()


def inputs(queries: int, keys: int, shape: dict) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    heads, rank = shape["heads"], shape["rank"]
    q = torch.randn(1, queries, heads, rank, generator=gen, device="cuda").bfloat16()
    latent = torch.randn(1, keys, rank, generator=gen, device="cuda").bfloat16()
    d_out = torch.randn(1, queries, heads, rank, generator=gen, device="cuda").bfloat16()
    indices = pool_rows(queries, keys, shape, seed=1)
    out, lse = tilelang_forward.sparse_latent_attention_forward(q, latent, indices, shape["scale"])
    return {"q": q, "latent": latent, "indices": indices, "out": out, "lse": lse, "d_out": d_out}


def compile_one(shape: dict, config) -> tuple[object, float]:
    start = time.monotonic()
    tilelang_backward._compiled_backward_kernel(shape["heads"], shape["rank"], shape["width"], "bfloat16",
                                                float(shape["scale"]), config)
    return config, time.monotonic() - start


def backward(tensors: dict, shape: dict, config, slab_rows: int = tilelang_backward.DEFAULT_SLAB_ROWS):
    return tilelang_backward.sparse_latent_attention_backward(
        tensors["q"], tensors["latent"], tensors["indices"], tensors["out"], tensors["lse"], tensors["d_out"],
        shape["scale"], config=config, slab_rows=slab_rows)


def timed_row(row: dict, run, reference: tuple[torch.Tensor, torch.Tensor], repeats: int,
              not_built: str | None) -> dict:
    """``row`` with ``run()``'s gradients compared with ``reference`` and its timing (median and every repeat), or
    the error that stopped it; printed as it is made."""
    if not_built is not None:
        row["error"] = not_built
    else:
        try:
            d_q, d_latent = run()
            row["d_q_rel_err_vs_default"] = rel_err(d_q, reference[0])
            row["d_latent_rel_err_vs_default"] = rel_err(d_latent, reference[1])
            timing = measure(run, repeats)
            row["ms"] = round(timing["ms"], 2)
            row["ms_all"] = [round(ms, 2) for ms in timing["ms_all"]]
        except Exception as error:  # noqa: BLE001 - a config that fails at run time is a result, not a crash
            row["error"] = traceback.format_exception_only(type(error), error)[-1][:400]
    print(row, flush=True)
    return row


def sweep(name: str, args, rows: list[dict]) -> None:
    start = time.monotonic()
    shape = shape_of(name)
    configs = configs_for(shape) if args.configs == "all" else configs_for(shape)[:1]
    compile_seconds, errors = {}, {}
    pool = ThreadPoolExecutor(max_workers=8)
    futures = {config: pool.submit(compile_one, shape, config) for config in configs}
    for config, future in futures.items():
        left = max(1.0, COMPILE_BUDGET_S - (time.monotonic() - start))
        try:
            compile_seconds[config] = round(future.result(timeout=left)[1], 1)
        except FutureTimeout:
            errors[config] = f"not compiled within the {COMPILE_BUDGET_S:.0f} s budget"
        except Exception as error:  # noqa: BLE001 - a config that fails to build is a result, not a crash
            errors[config] = f"{type(error).__name__}: {error}"[:400]
    # Compiles past the budget are left running in their threads (not waited for) and their configs not timed.
    pool.shutdown(wait=False, cancel_futures=True)
    tensors = inputs(args.queries, args.keys, shape)
    default = configs[0]
    if default not in compile_seconds:
        raise SystemExit(f"{name}: the default config did not compile: {errors.get(default)}")
    reference = backward(tensors, shape, default)
    slab_rows = tilelang_backward.DEFAULT_SLAB_ROWS

    def row(config, keys: int, rows_per_slab: int) -> dict:
        return {"preset": name, "queries": args.queries, "keys": keys, "config": list(vars(config).values()),
                "default": config == default, "slab_rows": rows_per_slab,
                "shared_bytes": config.shared_bytes(shape["heads"], shape["rank"]),
                "compile_s": compile_seconds.get(config)}

    for config in configs:
        rows.append(timed_row(row(config, args.keys, slab_rows), lambda c=config: backward(tensors, shape, c),
                              reference, args.repeats,
                              None if config in compile_seconds else errors.get(config, "not compiled")))
    for other in [r for r in args.slab_rows if r != slab_rows]:
        rows.append(timed_row(row(default, args.keys, other), lambda r=other: backward(tensors, shape, default, r),
                              reference, args.repeats, None))
    local = inputs(args.queries, args.queries, shape)
    local_row = timed_row(row(default, args.queries, slab_rows), lambda: backward(local, shape, default),
                          backward(local, shape, default), args.repeats, None)
    local_row["note"] = ("keys cut to the query count: one slab, and d_latent's fp32 rows (and the gathered latent "
                         "rows) mostly fit in L2")
    rows.append(local_row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="base,small")
    parser.add_argument("--queries", type=int, default=32768)
    parser.add_argument("--keys", type=int, default=524288)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--configs", choices=("all", "default"), default="all",
                        help="time every candidate launch config, or only the default")
    parser.add_argument("--slab-rows", default="16384,65536",
                        help="comma-separated slab sizes (rows) to time the default config at, besides the default")
    args = parser.parse_args()
    args.slab_rows = [int(rows) for rows in args.slab_rows.split(",") if rows]
    rows: list[dict] = []
    start = time.monotonic()
    for name in args.presets.split(","):
        sweep(name, args, rows)
        write_results("dsa_backward_configs", rows, {"timing": f"median of {args.repeats} after one warm-up"})
    print(f"done in {time.monotonic() - start:.0f} s")
    wrong = [row for row in rows
             if max(row.get("d_q_rel_err_vs_default", 0), row.get("d_latent_rel_err_vs_default", 0)) >= 1e-2]
    for row in wrong:
        print(f"FAILED: {row['preset']} config {row['config']} at {row['slab_rows']} rows per slab differs from the "
              f"default: d_q {row['d_q_rel_err_vs_default']:.2e}, d_latent {row['d_latent_rel_err_vs_default']:.2e}")
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
