"""python bench_dsa_backward_configs.py [--presets base,small] [--queries 32768] [--keys 524288]   (benchmarks/, H200)

Launch configs of the TileLang sparse-attention backward (genolc.model.ops.dsa.tilelang.backward.BackwardConfig:
slots per step, pipeline depth, threads, rank slices), timed at the shape the chunked step runs: one 32k chunk of
queries at the end of a 512k window (``--queries``, ``--keys``), W = topk + kpool - 1 slots per query. The default
config was chosen from ptxas' register counts; timed here against 13 others for `base` and 6 for `small`
(dsa_backward_configs_2026-12-02.json), none was more than 0.6 % faster. In the `base` 512k profile
(profile_chunked_base_512k_2026-12-02.json) the backward is the longest kernel, 64 calls, 72.5 ms each.

Index rows: 512 random pools of 4 rows each from all ``--keys`` rows plus 3 random tail rows (timing only; the
kernel does not need causal rows). q, latent, d_out random bf16; out and lse from the TileLang forward on the same
rows. Every config is compiled first, in parallel threads (``tilelang.compile`` of build_backward_prim_func, as
genolc/train/kernel_warmup.py compiles several kernels at once), then timed (median of ``--repeats`` after one
warm-up, d_latent zeroed inside each call as the op does), and its d_q and d_latent are compared with the default
config's (relative error; atomics add in a different order, so not bit-equal). Also the default config with the keys
cut to ``--queries`` rows: d_latent's fp32 rows (48 MiB for `base`) and the gathered bf16 rows then mostly fit in
the 50 MB L2, so the two effects are not separated. Each row keeps all its timed repeats (``ms_all``; the first
run, on 2026-12-02, kept only the median).

``--slab-rows 16384,32768`` also times the slab-ordered backward (genolc.model.ops.dsa.tilelang.backward_slabs: one
block per (query, key slab), the blocks in flight scattering into one slab) at each slab size, with its sort of the
index rows and its row dot included, and checks its gradients against the default kernel's (relative error under
1e-2, else the script exits 1 after writing its results). ``--configs default``
skips the other launch configs. Runs: ``--configs default --slab-rows 8192,16384,32768,65536``
(dsa_backward_slabs_2026-12-02.json) and ``--configs default --slab-rows 32768 --keys 131072`` / ``262144``
(dsa_backward_hybrid_2026-12-02/), which set backward.SLABBED_FROM_ROWS.

Writes $OUT or benchmarks/results/dsa_backward_configs[_keysN]_<date>.json (command, git SHA, device).
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
from genolc.model.ops.dsa.tilelang import backward_slabs
from genolc.model.ops.dsa.tilelang import forward as tilelang_forward
from genolc.model.presets import PRESETS

# (block_slots, num_stages, threads, rank_parts); invalid ones for a rank are skipped (BackwardConfig.check).
CANDIDATES = [(32, 2, 128, 1), (32, 2, 128, 2), (32, 2, 128, 3), (32, 3, 128, 3), (32, 2, 128, 4), (32, 2, 128, 6),
              (64, 2, 128, 3), (64, 2, 128, 2), (64, 2, 256, 2), (64, 2, 256, 3), (64, 3, 256, 3), (64, 2, 256, 4),
              (64, 2, 256, 6), (32, 1, 128, 3), (32, 3, 128, 2)]
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
    tilelang_backward.compiled_backward_kernel(shape["heads"], shape["rank"], shape["width"], "bfloat16",
                                               float(shape["scale"]), config)
    return config, time.monotonic() - start


def compile_slabbed(shape: dict) -> tuple[str, float]:
    start = time.monotonic()
    backward_slabs.compiled_slabbed_backward_kernel(shape["heads"], shape["rank"], shape["width"], "bfloat16",
                                                    float(shape["scale"]),
                                                    backward_slabs.default_slabbed_config(shape["rank"]))
    return "slabs", time.monotonic() - start


def slabbed(tensors: dict, shape: dict, slab_rows: int):
    return backward_slabs.sparse_latent_attention_backward_slabs(
        tensors["q"], tensors["latent"], tensors["indices"], tensors["out"], tensors["lse"], tensors["d_out"],
        shape["scale"], slab_rows=slab_rows)


def backward(tensors: dict, shape: dict, config):
    return tilelang_backward.sparse_latent_attention_backward(
        tensors["q"], tensors["latent"], tensors["indices"], tensors["out"], tensors["lse"], tensors["d_out"],
        shape["scale"], config=config)



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
    if args.slab_rows:
        futures["slabs"] = pool.submit(compile_slabbed, shape)
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
    reference = backward(tensors, shape, default)
    for config in configs:
        row = {"preset": name, "queries": args.queries, "keys": args.keys, "config": list(vars(config).values()),
               "default": config == default, "shared_bytes": config.shared_bytes(shape["heads"], shape["rank"]),
               "compile_s": compile_seconds.get(config)}
        compiled = config in compile_seconds
        rows.append(timed_row(row, lambda c=config: backward(tensors, shape, c), reference, args.repeats,
                              None if compiled else errors.get(config, "not compiled within the budget")))
    for slab_rows in args.slab_rows:
        row = {"preset": name, "queries": args.queries, "keys": args.keys, "variant": "slabs", "slab_rows": slab_rows,
               "config": list(vars(backward_slabs.default_slabbed_config(shape["rank"])).values()),
               "compile_s": compile_seconds.get("slabs")}
        compiled = "slabs" in compile_seconds
        row = timed_row(row, lambda r=slab_rows: slabbed(tensors, shape, r), reference, args.repeats,
                        None if compiled else errors.get("slabs", "not compiled within the budget"))
        if "error" not in row:
            row["matches_default"] = max(row["d_q_rel_err_vs_default"], row["d_latent_rel_err_vs_default"]) < 1e-2
        rows.append(row)
    local = inputs(args.queries, args.queries, shape)
    timing = measure(lambda: backward(local, shape, default), args.repeats)
    rows.append({"preset": name, "queries": args.queries, "keys": args.queries, "config": list(vars(default).values()),
                 "default": True, "ms": round(timing["ms"], 2), "ms_all": [round(ms, 2) for ms in timing["ms_all"]],
                 "note": "keys cut to the query count: d_latent's fp32 rows (and the gathered latent rows) mostly "
                         "fit in L2"})
    print(rows[-1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="base,small")
    parser.add_argument("--queries", type=int, default=32768)
    parser.add_argument("--keys", type=int, default=524288)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--configs", choices=("all", "default"), default="all",
                        help="time every candidate launch config, or only the default")
    parser.add_argument("--slab-rows", default="",
                        help="comma-separated slab sizes (rows) for the slab-ordered backward; empty: not run")
    args = parser.parse_args()
    args.slab_rows = [int(rows) for rows in args.slab_rows.split(",") if rows]
    rows: list[dict] = []
    start = time.monotonic()
    for name in args.presets.split(","):
        sweep(name, args, rows)
        # Runs at other key counts get their own file (one call's 256k run once overwrote its 128k one's).
        name_keys = "" if args.keys == 524288 else f"_keys{args.keys}"
        write_results(f"dsa_backward_configs{name_keys}", rows,
                      {"timing": f"median of {args.repeats} after one warm-up"})
    print(f"done in {time.monotonic() - start:.0f} s")
    wrong = [row for row in rows if row.get("matches_default") is False]
    for row in wrong:
        print(f"FAILED: the slab-ordered backward at {row['slab_rows']} rows differs from the default kernel: "
              f"d_q {row['d_q_rel_err_vs_default']:.2e}, d_latent {row['d_latent_rel_err_vs_default']:.2e}")
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
