"""python benchmarks/bench_indexer_kl.py [--sizes 64k,512k] [--presets small,base] [--chunk 32768] [--mode sparse]
                                       [--sides fused,reference] [--block-p 32] [--warps 4,8] [--precision ieee,tf32]
                                       [--target-lse own,forward] [--pool-mass-launch 32x8,64x8]

The DSA indexer's KL loss (genolc.model.indexer_loss.indexer_kl_loss), what `finetune --indexer sparse` (or dense)
adds to each DSA layer with an indexer: forward alone, and forward + backward, for one chunk of queries — the last
``--chunk`` queries of a window of ``--sizes`` keys, as the chunked step calls it (``query_offset``, ``row_count``
of the window), or the whole window when the chunk is at least the window. Inputs at the preset's shapes in bf16:
q_lat ``[1, C, H, R]``, the latent as one shared key head ``[1, S, 1, R]``, indexer queries; head weights and pool
keys in fp32 (as the indexer hands them under autocast); the last three with gradients. Index rows hold ``topk //
kpool`` distinct random causal pools per query plus its tail (uniform over the visible pools: no two neighbours
share more than chance, so the gathers find less in L2 than a trained model's would). The kernels of one forward +
backward are listed (torch.profiler). ``--sides``: the sparse mode's indexer side as the trainer runs it on CUDA
(``fused``: genolc/model/ops/indexer_kl/triton.py, no checkpoint) and as it ran before (``reference``: the torch
formula, checkpointed per chunk of queries); ``--block-p`` times the fused side at each of these slot steps
(genolc/model/ops/indexer_kl/triton.py's ``BLOCK_P``, untimed when it was chosen), ``--warps`` at each of these warp
counts (``NUM_WARPS``) and ``--precision`` with each of these product precisions (``DOT_PRECISION``: ieee, or tf32
on the tensor cores). ``--target-lse``: the sparse target forms its softmax's normaliser itself (``own``, a first
pass over each row) or reads the attention forward's log-sum-exp (``forward``, what the DSA layer hands it since
2026-12-05; that forward runs once, untimed, before the timing). ``--pool-mass-launch``: the target alone (the pool
mass given the forward's lse, no backward) at each (slots a step)x(warps) of genolc/model/ops/dsa/triton.py's
``POOL_MASS_LAUNCH``. Writes benchmarks/results/indexer_kl_<date>.json.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from gpu_bench_common import SIZES, measure, profiled_kernels, write_results
from genolc.model.indexer_loss import indexer_kl_loss, window_kl_rows
from genolc.model.ops import dispatch
from genolc.model.ops.dsa import triton as dsa_triton
from genolc.model.ops.indexer_kl import triton as indexer_kl_triton
from genolc.model.ops.indexer.layout import complete_pools_visible, index_rows
from genolc.model.presets import PRESETS, preset

RESULT_NAME = "indexer_kl"
LENGTHS = {**SIZES, "32k": 32768, "128k": 131072, "512k": 524288}


def random_pools(query_offset: int, queries: int, slots: int, kpool: int, generator: torch.Generator,
                 block: int = 1024) -> torch.Tensor:
    """``[1, C, slots]`` int32: for each query, ``slots`` distinct complete pools it may see (uniformly at random;
    -1 where fewer are visible)."""
    out = torch.full((1, queries, slots), -1, dtype=torch.int32, device="cuda")
    for q0 in range(0, queries, block):
        q1 = min(queries, q0 + block)
        visible = complete_pools_visible(torch.arange(query_offset + q0, query_offset + q1, device="cuda"), kpool)
        n_pools = int(visible.max())
        if n_pools == 0:
            continue
        scores = torch.rand(q1 - q0, n_pools, device="cuda", generator=generator)
        scores.masked_fill_(torch.arange(n_pools, device="cuda")[None, :] >= visible[:, None], -1.0)
        top, pools = scores.topk(min(slots, n_pools), dim=-1)
        out[0, q0:q1, : pools.shape[1]] = pools.masked_fill(top < 0, -1).int()
    return out


def inputs(name: str, keys: int, queries: int):
    config = preset(name)
    heads, rank, kpool, topk = config.num_attention_heads, config.kv_lora_rank, config.index_kpool, config.index_topk
    offset = keys - queries
    generator = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, grad=False, dtype=torch.bfloat16):
        tensor = torch.randn(*shape, device="cuda", dtype=dtype, generator=generator)
        return tensor.requires_grad_(grad)

    pools = random_pools(offset, queries, topk // kpool, kpool, generator)
    indices = index_rows(pools, query_offset=offset, kpool=kpool, select_tail=True, dtype=torch.int32)
    tensors = {"main_q": randn(1, queries, heads, rank), "main_k": randn(1, keys, 1, rank),
               "index_q": randn(1, queries, config.index_n_heads, config.index_head_dim, grad=True),
               "head_weights": randn(1, queries, config.index_n_heads, grad=True, dtype=torch.float32),
               "pooled": randn(1, keys // kpool, config.index_head_dim, grad=True, dtype=torch.float32)}
    scales = {"softmax_scale": config.qk_head_dim ** -0.5,
              "index_softmax_scale": config.index_head_dim ** -0.5}
    window = {"query_offset": offset, "row_count": window_kl_rows(1, keys, kpool)}
    return tensors, indices, scales, window, kpool, topk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64k,512k", help=f"window lengths (keys), from {', '.join(LENGTHS)}")
    parser.add_argument("--presets", default="small,base")
    parser.add_argument("--chunk", type=int, default=32768, help="queries per call (the window's last ones)")
    parser.add_argument("--mode", default="sparse", choices=("sparse", "dense"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sides", default=None,
                        help="the sparse mode's indexer side: fused, reference (default both; dense: reference)")
    parser.add_argument("--block-p", default=str(indexer_kl_triton.BLOCK_P),
                        help="the fused side's slot steps to time, powers of two from 16 (comma-separated)")
    parser.add_argument("--warps", default=str(indexer_kl_triton.NUM_WARPS),
                        help="the fused side's warps a program to time (comma-separated)")
    parser.add_argument("--precision", default=indexer_kl_triton.dot_precision(torch.bfloat16),
                        help="the fused side's product precisions to time: ieee and/or tf32 (comma-separated; "
                             "default: the trainer's for these bf16 queries)")
    parser.add_argument("--target-lse", default=None,
                        help="the sparse target's normaliser: own and/or forward (default both; dense: own)")
    parser.add_argument("--pool-mass-launch", default="",
                        help="time the target alone at these BLOCK_WxWARPS launches (e.g. 32x8,64x8)")
    args = parser.parse_args()
    try:
        launches = [tuple(int(n) for n in item.split("x")) for item in args.pool_mass_launch.split(",") if item]
    except ValueError:
        launches = [(0, 0)]
    if any(len(launch) != 2 or launch[0] < 16 or launch[0] & (launch[0] - 1) or launch[1] not in (1, 2, 4, 8, 16)
           for launch in launches):
        parser.error(f"--pool-mass-launch takes BLOCK_WxWARPS pairs, powers of two, BLOCK_W from 16 (tl.dot's "
                     f"least N) and warps up to 16 (e.g. 64x8), got {args.pool_mass_launch!r}")
    lse_sources = (args.target_lse or ("own,forward" if args.mode == "sparse" else "own")).split(",")
    if not lse_sources or any(source not in ("own", "forward") for source in lse_sources):
        parser.error(f"--target-lse takes own and/or forward, got {args.target_lse!r}")
    if args.mode == "dense" and "forward" in lse_sources:
        parser.error("--mode dense has no sparse attention forward: pass --target-lse own")
    sides = (args.sides or ("fused,reference" if args.mode == "sparse" else "reference")).split(",")
    if any(side not in ("fused", "reference") for side in sides):
        parser.error(f"--sides takes fused and/or reference, got {args.sides!r}")
    if args.mode == "dense" and "fused" in sides:
        parser.error("--mode dense has no fused side: pass --sides reference")
    try:
        steps = [int(step) for step in args.block_p.split(",")]
    except ValueError:
        steps = [0]
    if any(step < 16 or step & (step - 1) for step in steps):
        parser.error(f"--block-p takes powers of two from 16, got {args.block_p!r}")
    try:
        warps = [int(count) for count in args.warps.split(",")]
    except ValueError:
        warps = [0]
    if any(count not in (1, 2, 4, 8, 16) for count in warps):
        parser.error(f"--warps takes powers of two from 1 to 16, got {args.warps!r}")
    precisions = args.precision.split(",")
    if any(precision not in ("ieee", "tf32") for precision in precisions):
        parser.error(f"--precision takes ieee and/or tf32, got {args.precision!r}")
    sides = [side if side == "reference" else f"fused:{step}:{count}:{precision}" for side in sides
             for step in (steps if side == "fused" else [0]) for count in (warps if side == "fused" else [0])
             for precision in (precisions if side == "fused" else [""])]
    unknown = [size for size in args.sizes.split(",") if size not in LENGTHS]
    if unknown or args.chunk < 1:
        parser.error(f"--sizes from {', '.join(LENGTHS)} and a positive --chunk, got {args.sizes!r}, {args.chunk}")
    unknown = [name for name in args.presets.split(",") if name not in PRESETS]
    if unknown:
        parser.error(f"unknown --presets {', '.join(unknown)}; use {', '.join(PRESETS)}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (it times the kernels the model runs there)")
    rows = []
    for name, size, side, lse_source in ((n, z, d, e) for n in args.presets.split(",") for z in args.sizes.split(",")
                                         for d in sides for e in lse_sources):
        with _indexer_side(side):
            keys = LENGTHS[size]
            queries = min(keys, args.chunk)
            tensors, indices, scales, window, kpool, topk = inputs(name, keys, queries)
            leaves = [tensors[key] for key in ("index_q", "head_weights", "pooled")]
            main_lse = None
            if lse_source == "forward":
                _, main_lse = dispatch.sparse_latent_attention_forward(
                    tensors["main_q"], tensors["main_k"][:, :, 0], indices, scales["softmax_scale"])

            def loss():
                return indexer_kl_loss(args.mode, **tensors, **scales, kpool=kpool, topk=topk,
                                       indices=indices if args.mode == "sparse" else None, main_lse=main_lse,
                                       **window)

            def forward():
                with torch.no_grad():
                    loss()

            def forward_backward():
                torch.autograd.grad(loss(), leaves)

            row = {"preset": name, "keys": size, "queries": queries, "mode": args.mode, "side": side.split(":")[0],
                   "target_lse": lse_source}
            if side.startswith("fused"):
                if not dispatch.fused_indexer_kl(*leaves):
                    parser.error(f"--presets {name}: the fused indexer KL does not take its operands "
                                 f"({indexer_kl_triton.unsupported_reason(*leaves)}); time it with --sides reference")
                row.update(block_p=indexer_kl_triton.BLOCK_P, warps=indexer_kl_triton.NUM_WARPS,
                           precision=indexer_kl_triton.dot_precision(tensors["index_q"].dtype))
            try:
                row["forward"] = measure(forward, args.repeats)
                row["forward_backward"] = measure(forward_backward, args.repeats)
                kernels = profiled_kernels(forward_backward)
                row["kernels"] = kernels[:12]
                row["kernel_launches"] = sum(kernel["calls"] for kernel in kernels)
                row["loss"] = float(loss())
                # Beside the loss, what the precision does to what the indexer learns from it.
                row["grad_norms"] = [float(grad.float().norm()) for grad in torch.autograd.grad(loss(), leaves)]
            except torch.cuda.OutOfMemoryError as error:
                row["error"] = f"OOM: {str(error)[:160]}"
            torch.cuda.empty_cache()
            rows.append(row)
            print({k: v for k, v in row.items() if k != "kernels"}, flush=True)
            write_results(RESULT_NAME, rows, {"chunk": args.chunk})
    for name, size, launch in ((n, z, x) for n in args.presets.split(",") for z in args.sizes.split(",")
                               for x in launches):
        rows.append(_pool_mass_row(name, LENGTHS[size], min(LENGTHS[size], args.chunk), launch, args.repeats))
        rows[-1]["keys"] = size
        print(rows[-1], flush=True)
        write_results(RESULT_NAME, rows, {"chunk": args.chunk})


def _pool_mass_row(name: str, keys: int, queries: int, launch: tuple[int, int], repeats: int) -> dict:
    """The target alone, given the forward's lse, at one (BLOCK_W, warps) launch of the pool mass kernel."""
    tensors, indices, scales, _, kpool, topk = inputs(name, keys, queries)
    q_lat, latent = tensors["main_q"], tensors["main_k"][:, :, 0]
    _, lse = dispatch.sparse_latent_attention_forward(q_lat, latent, indices, scales["softmax_scale"])
    kept = dsa_triton.POOL_MASS_LAUNCH
    dsa_triton.POOL_MASS_LAUNCH = launch
    try:
        def target():
            return dsa_triton.sparse_pool_mass(q_lat, latent, indices, scales["softmax_scale"], kpool=kpool,
                                               topk=topk, lse=lse)

        row = {"preset": name, "queries": queries, "side": "pool_mass", "block_w": launch[0], "warps": launch[1],
               "forward": measure(target, repeats), "mass_sum": float(target().sum())}
    finally:
        dsa_triton.POOL_MASS_LAUNCH = kept
    torch.cuda.empty_cache()
    return row


@contextlib.contextmanager
def _indexer_side(side: str):
    """``reference``: the dispatch's fused sparse indexer KL turned off, as before it existed; ``fused:N:W:P``: the
    fused kernels at N slots a step, W warps a program, products in precision P."""
    kept = (dispatch.fused_indexer_kl, indexer_kl_triton.BLOCK_P, indexer_kl_triton.NUM_WARPS,
            indexer_kl_triton.DOT_PRECISION)
    if side == "reference":
        dispatch.fused_indexer_kl = lambda *operands: False
    else:
        _, step, warps, precision = side.split(":")
        indexer_kl_triton.BLOCK_P, indexer_kl_triton.NUM_WARPS = int(step), int(warps)
        indexer_kl_triton.DOT_PRECISION = precision
    try:
        yield
    finally:
        (dispatch.fused_indexer_kl, indexer_kl_triton.BLOCK_P, indexer_kl_triton.NUM_WARPS,
         indexer_kl_triton.DOT_PRECISION) = kept


if __name__ == "__main__":
    main()
