"""Sparse latent attention backward in TileLang with the scatter ordered by key slab: the backward over long key ranges.

The same contract as :func:`genolc.model.ops.dsa.tilelang.backward.sparse_latent_attention_backward`, and the same
per-slot math (see that module). What differs is the order of the work. The one-block-per-query kernel scatters
each query's ``W`` rows of ``dC`` (fp32 atomics) anywhere in ``[0, S)``, so at 512k keys the fp32 ``d_latent``
(805 MB for `base`) is far larger than the H200's 50 MB L2 and the atomics go out to memory. Measured on the H200
(benchmarks/results/dsa_backward_configs_2026-12-02.json): with the keys cut from 512k to 32k the same kernel ran in
53.8 ms instead of 79.6 (`base`) and 32.1 instead of 52.3 (`small`), and no launch config of it was faster.

Here the keys are cut into slabs of ``slab_rows`` rows, and one block handles one (query, slab) pair: the query's
slots that fall in that slab. The grid is (query, slab, batch) with the query fastest, so the blocks resident at any
moment mostly scatter into one slab, which can stay in L2. To find a query's slots in a slab, each index row is
grouped by slab (empty slots last) and cut at the slab boundaries (``genolc.model.ops.dsa.slab_order``). The price:

- each block loads its query's Q and dO rows again (once per slab that holds one of its slots);
- ``dQ`` is summed over the slabs: each block adds its ``[H, R]`` partial into an fp32 buffer with vector atomics
  (one row per (query, slab), against one per (query, slot) for ``dC``), cast at the end;
- ``delta = rowsum(O * dO)`` is computed once for all slabs, in torch, instead of by every block.

Everything else follows backward.py: Q and dO rows padded to 16 heads in shared memory, the gathered latent tile,
``S = Q C^T`` and ``dP = dO C^T`` on tensor cores, ``dQ += dS C`` in an fp32 fragment, ``dC = dS^T Q + P^T dO`` in
rank slices scattered with ``atomic_addx4``. The loop over a block's slots has a data-dependent trip count
(``ceil(count / block_slots)``), which TileLang lowers only without software pipelining
(:func:`default_slabbed_config`).

Measured on the H200 at 32k queries over 512k keys (benchmarks/results/dsa_backward_slabs_2026-12-02.json, the
sort and row dot included): `base` 72.3 ms in 32k-row slabs against 79.6 for one block per query (8k rows 110.1,
16k 86.5, 64k 74.5), `small` 40.9 against 52.3; gradients within 1.2e-4 of that kernel's. backward.chosen_backward
runs it from ``backward.SLABBED_FROM_ROWS`` (128k) latent rows on: at 128k keys 60.8 against 72.6 ms (`base`),
36.1 against 45.5 (`small`) (dsa_backward_hybrid_2026-12-02/); it was not timed at 32k or 64k keys. Registers
(ptxas, sm_90a, nvcc 13): 219 at `base`, 162 at `small`, no spills. A version that also took the one-slab case
(rows unsorted, -1 slots checked in the kernel) ran slower at `base` than both kernels: 84.1 ms at 512k keys and
65.1 at 32k (one block per query 53.6); at `small` 43.6 and 32.9 ms, between them at 512k keys and slower than one
block per query at 32k (dsa_backward_slabs_2026-12-02_wired/): the two kernels stay apart. The math of a step of
slots is shared with backward.py (backward_config.slot_step_macros; the lowered CUDA of both kernels was byte-equal
before and after); the grid, loop bounds, slot masks, delta and dQ differ.
"""

# No ``from __future__ import annotations``: TileLang evaluates the prim_func's tensor annotations.
import dataclasses

import torch

from genolc.model.ops.dsa.row_dot import row_dot
from genolc.model.ops.dsa.slab_order import slab_order
from genolc.model.ops.dsa.tilelang import forward as tilelang_forward
from genolc.model.ops.dsa.tilelang.backward_config import (ATOMIC_VECTOR, EMPTY_ROW_LSE, BackwardConfig,
                                                           check_backward_inputs, default_backward_config,
                                                           slot_step_macros)
from genolc.model.ops.dsa.tilelang.forward import LOG2_E, SUPPORTED_DTYPES, padded_heads

# 32k rows: d_latent's fp32 slab is 48 MiB at R = 384 and 32 MiB at R = 256, the sizes measured above.
DEFAULT_SLAB_ROWS = 32768


def default_slabbed_config(rank: int) -> BackwardConfig:
    """backward.py's default tiles with one stage: TileLang 0.1.15 lowers a pipelined loop with a data-dependent trip
    count only without software pipelining (two stages fail in CUDA codegen), and in the one-block-per-query kernel
    one stage timed the same as two (79.64 against 79.61 ms, dsa_backward_configs_2026-12-02.json)."""
    return dataclasses.replace(default_backward_config(rank), num_stages=1)


def build_slabbed_backward_prim_func(heads: int, rank: int, width: int, dtype: str, softmax_scale: float,
                                     config: BackwardConfig):
    """The TileLang ``prim_func`` for one ``(H, R, W, dtype, scale, config)``; arguments (Q, Latent, Rows, Offsets,
    Lse, Delta, DOut, DQ, DLatent) with DQ ``[B, T, H, R]`` and DLatent ``[B, S, R]`` fp32, zeroed by the caller."""
    config.check(rank)
    if config.num_stages != 1:
        raise ValueError(f"the slab-ordered backward runs one pipeline stage (see default_slabbed_config), "
                         f"got {config}")
    import tilelang.language as T

    block_slots, threads = config.block_slots, config.threads
    heads_pad = padded_heads(heads)
    part = rank // config.rank_parts
    part_offsets = [part * index for index in range(config.rank_parts)]
    probabilities_and_dq, dc_slice = slot_step_macros(heads_pad, block_slots, part, softmax_scale)
    accum = "float32"
    batch = T.dynamic("batch")
    seq_len = T.dynamic("seq_len")
    kv_len = T.dynamic("kv_len")
    n_bounds = T.dynamic("n_bounds")          # slabs + 1

    @T.prim_func
    def sparse_latent_bwd_slabs(
        Q: T.Tensor([batch, seq_len, heads, rank], dtype),
        Latent: T.Tensor([batch, kv_len, rank], dtype),
        Rows: T.Tensor([batch, seq_len, width], "int32"),
        Offsets: T.Tensor([batch, seq_len, n_bounds], "int32"),
        Lse: T.Tensor([batch, seq_len, heads], accum),
        Delta: T.Tensor([batch, seq_len, heads], accum),
        DOut: T.Tensor([batch, seq_len, heads, rank], dtype),
        DQ: T.Tensor([batch, seq_len, heads, rank], accum),
        DLatent: T.Tensor([batch, kv_len, rank], accum),
    ):
        with T.Kernel(seq_len, n_bounds - 1, batch, threads=threads) as (t, s, b):
            q_shared = T.alloc_shared([heads_pad, rank], dtype)
            do_shared = T.alloc_shared([heads_pad, rank], dtype)
            kv_shared = T.alloc_shared([block_slots, rank], dtype)
            p_shared = T.alloc_shared([heads_pad, block_slots], dtype)
            ds_shared = T.alloc_shared([heads_pad, block_slots], dtype)
            dkv_shared = T.alloc_shared([block_slots, part], accum)
            dq_shared = T.alloc_shared([heads_pad, rank], accum)
            scores = T.alloc_fragment([heads_pad, block_slots], accum)
            d_probs = T.alloc_fragment([heads_pad, block_slots], accum)
            acc_dq = T.alloc_fragment([heads_pad, rank], accum)
            acc_dkv = T.alloc_fragment([block_slots, part], accum)
            delta = T.alloc_fragment([heads_pad], accum)
            lse_log2 = T.alloc_fragment([heads_pad], accum)
            slot_valid = T.alloc_fragment([block_slots], "bool")
            first = Offsets[b, t, s]
            count = Offsets[b, t, s + 1] - first

            # A pair with no slot loads nothing (h < heads is false for every row when count is 0).
            for h, r in T.Parallel(heads_pad, rank):
                q_shared[h, r] = T.if_then_else(h < heads and count > 0, Q[b, t, T.min(h, heads - 1), r],
                                                T.cast(0, dtype))
                do_shared[h, r] = T.if_then_else(h < heads and count > 0, DOut[b, t, T.min(h, heads - 1), r],
                                                 T.cast(0, dtype))
            for h in T.Parallel(heads_pad):
                delta[h] = T.if_then_else(h < heads, Delta[b, t, T.min(h, heads - 1)], 0)
                lse_log2[h] = T.if_then_else(h < heads, Lse[b, t, T.min(h, heads - 1)], T.infinity(accum))
                lse_log2[h] = T.if_then_else(lse_log2[h] < T.infinity(accum), lse_log2[h] * LOG2_E, EMPTY_ROW_LSE)
            T.fill(acc_dq, 0)

            for blk in T.Pipelined(T.ceildiv(count, block_slots), num_stages=1):
                # Slots past this slab's count re-read a later sorted slot (or row 0 for -1): masked below.
                for j, r in T.Parallel(block_slots, rank):
                    kv_shared[j, r] = Latent[
                        b, T.max(Rows[b, t, T.min(first + blk * block_slots + j, width - 1)], 0), r]
                for j in T.Parallel(block_slots):
                    slot_valid[j] = blk * block_slots + j < count
                probabilities_and_dq(q_shared, do_shared, kv_shared, slot_valid, lse_log2, delta, scores, d_probs,
                                     p_shared, ds_shared, acc_dq)
                for column in part_offsets:
                    dc_slice(q_shared, do_shared, p_shared, ds_shared, acc_dkv, dkv_shared, column)
                    for j, v in T.Parallel(block_slots, part // ATOMIC_VECTOR):
                        if blk * block_slots + j < count:
                            T.atomic_addx4(
                                DLatent[b, Rows[b, t, T.min(first + blk * block_slots + j, width - 1)],
                                        column + v * ATOMIC_VECTOR],
                                dkv_shared[j, v * ATOMIC_VECTOR])

            T.copy(acc_dq, dq_shared)
            for h, v in T.Parallel(heads_pad, rank // ATOMIC_VECTOR):
                if h < heads:
                    if count > 0:
                        T.atomic_addx4(DQ[b, t, h, v * ATOMIC_VECTOR], dq_shared[h, v * ATOMIC_VECTOR])

    return sparse_latent_bwd_slabs


def compiled_slabbed_backward_kernel(heads: int, rank: int, width: int, dtype: str, softmax_scale: float,
                                     config: BackwardConfig):
    """The compiled kernel for one shape key (compiled on first use, then reused for the process)."""
    return tilelang_forward.compile_once(build_slabbed_backward_prim_func, heads, rank, width, dtype, softmax_scale,
                                         config)


def sparse_latent_attention_backward_slabs(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                           out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                                           softmax_scale: float, *, config: BackwardConfig | None = None,
                                           slab_rows: int = DEFAULT_SLAB_ROWS
                                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of the TileLang forward, the scatter ordered by key slab (arguments and returns as
    ``backward.sparse_latent_attention_backward``; ``slab_rows``: latent rows per slab)."""
    d_out = d_out.to(q_lat.dtype).contiguous()
    check_backward_inputs(q_lat, latent, indices, out, lse, d_out, softmax_scale)
    batch, seq_len, heads, rank = q_lat.shape
    config = default_slabbed_config(rank) if config is None else config
    config.check(rank)
    d_q = torch.zeros(q_lat.shape, dtype=torch.float32, device=q_lat.device)
    d_latent = torch.zeros(latent.shape, dtype=torch.float32, device=latent.device)
    if seq_len > 0 and batch > 0:
        if latent.shape[1] == 0:
            raise ValueError("latent has no rows (S = 0) but indices has rows to attend")
        kernel = compiled_slabbed_backward_kernel(heads, rank, indices.shape[2], SUPPORTED_DTYPES[q_lat.dtype],
                                                  float(softmax_scale), config)
        # Triton launches on the current device: the slab order's and the row dot's kernels too.
        with torch.cuda.device(q_lat.device):
            rows, offsets = slab_order(indices, slab_rows, latent.shape[1])
            delta = row_dot(out, d_out)
            kernel(q_lat, latent, rows, offsets, lse, delta, d_out, d_q, d_latent)
    return d_q.to(q_lat.dtype), d_latent.to(latent.dtype)
