"""Sparse latent attention (DSA, absorbed MLA form) backward in TileLang, and the TileLang autograd op.

Contract (the same as ``dsa_triton.sparse_latent_attention_backward``):

    q_lat    [B, T, H, R]  bf16 or fp16, contiguous      latent  [B, S, R]  q's dtype, contiguous
    indices  [B, T, W]     int32, contiguous (-1 = empty slot, shared by all heads)
    out      [B, T, H, R]  the forward's o_lat            lse     [B, T, H]  fp32 natural log, +inf for empty rows
    d_out    [B, T, H, R]  gradient of o_lat
    returns  (d_q_lat [B, T, H, R] in q's dtype, d_latent [B, S, R] in latent's dtype)

    P = exp(scale * Q C^T - lse);  delta = rowsum(O * dO);  dP = dO C^T;  dS = P * (dP - delta) * scale
    dQ = dS C;  dC[s] += dS[:, s]^T Q + P[:, s]^T dO   for every selected row s (fp32 atomics, cast at the end)

What limits it: the scatter. Every (query, slot) adds one fp32 row of R into d_latent: T * W * R * 4 bytes of
read-modify-write traffic (3.2 TB at 1M tokens, W = 2051, R = 384) against 10 * T * W * H * R FLOPs. At 512k keys
the fp32 d_latent (805 MB for `base`) is far larger than the H200's 50 MB L2, so a kernel that lets each query
scatter anywhere sends its atomics out to memory.

Design. The keys are cut into slabs of ``slab_rows`` rows and one thread block handles one (query, slab) pair: the
query's slots in that slab. The grid is (query, slab, batch) with the query fastest, so the blocks resident at once
mostly scatter into one slab, which can stay in L2. To find a query's slots in a slab, each index row is sorted
(empty slots last) and cut at the slab boundaries (:func:`slab_order`, torch); with one slab (S <= ``slab_rows``)
nothing is sorted and the block walks the whole row, as one block per query would. A block holds its query's H
rows of Q and dO in shared memory, zero-padded to 16 heads (the M extent of an MMA tile), and walks its slots in
blocks of ``block_slots``: gather the latent rows into shared memory, ``S = Q C^T`` and ``dP = dO C^T`` on tensor
cores into fp32 fragments, ``P`` and ``dS`` elementwise, ``dQ += dS C`` into an fp32 ``[H_pad, R]`` fragment, and
``dC = dS^T Q + P^T dO`` in ``rank_parts`` column slices (an fp32 ``[block_slots, R / rank_parts]`` fragment), each
staged through shared memory and added into the fp32 ``[B, S, R]`` buffer with 16-byte vector atomics
(``atomic_addx4``: ``atom.global.add.v4.f32`` on sm_90; consecutive threads take consecutive 16 bytes of a row).
Masked slots (-1, or past the block's count) get P = 0 and issue no atomics. What slabs cost: each block loads its
query's Q and dO again (once per slab holding one of its slots); dQ's per-slab partials are summed with vector
atomics into an fp32 buffer (one row per (query, slab)) and cast at the end; ``delta`` is computed once, in torch
(:func:`row_dot`). The slot loop's trip count depends on the data, which TileLang 0.1.15 lowers only without
software pipelining: one stage (in the earlier one-block-per-query kernel one stage timed the same as two).

Measured on the H200, 32k queries at the end of a 512k window (benchmarks/results/
dsa_backward_slabs_2026-12-02.json, medians of 5, sort and row dot included): `base` 72.3 ms with 32k-row slabs
against 79.6 for one block per query (8k rows 110.1, 16k 86.5, 64k 74.5); `small` 40.9 against 52.3. With the keys
cut to 32k the one-block kernel took 53.6 and 31.8 ms: the L2 bound the slabs approach only part of the way.
Registers (ptxas, sm_90a, nvcc 13): 226 at `base`, 154 at `small`, no spills.

Empty rows: lse = +inf gives P = 0, hence dQ = 0 and no contribution to d_latent. The exponent uses a finite
stand-in for +inf (``EMPTY_ROW_LSE``) so fast-math ``exp2`` never sees an infinity.

Kernels are compiled per ``(H, R, W, dtype, softmax_scale, BackwardConfig)`` and cached for the process; B, T, S and
the slab count are dynamic. TileLang is imported only when a kernel is built. Unsupported inputs raise ValueError;
nothing falls back to another implementation.
"""

# No ``from __future__ import annotations``: TileLang evaluates the prim_func's tensor annotations, which name
# build_backward_prim_func's local dynamic dimensions.
import functools
import threading
from dataclasses import dataclass

import torch

from genolc.model.ops.dsa import triton as dsa_triton
from genolc.model.ops.dsa.tilelang import forward as tilelang_forward
from genolc.model.ops.dsa.tilelang.forward import LOG2_E, SUPPORTED_DTYPES, check_inputs, padded_heads

# Finite stand-in for lse = +inf (log2 units): exp2(score - 2^30) underflows to exactly 0 for any finite score.
EMPTY_ROW_LSE = 2.0 ** 30
# Components per vector atomic (red.global.add.v4.f32): R must be a multiple of it (it is: R % 16 == 0).
ATOMIC_VECTOR = 4
# 32k rows: d_latent's fp32 slab is 48 MiB at R = 384 and 32 MiB at R = 256; the fastest of 8k-64k for both presets.
DEFAULT_SLAB_ROWS = 32768
MAX_SLABS = 65535          # CUDA's limit on gridDim.y
_EMPTY_KEY = torch.iinfo(torch.int32).max
# Index rows sorted per step of this many queries: the sort's int64 order stays ~100 MB at W = 2051.
_SORT_QUERIES = 4096


@dataclass(frozen=True)
class BackwardConfig:
    """Launch shape of the backward: slots per step, threads per block, and the number of rank slices the dC tile is
    computed and scattered in (fewer live fp32 registers per slice)."""

    block_slots: int = 32
    threads: int = 128
    rank_parts: int = 2

    def check(self, rank: int) -> None:
        """ValueError unless every GEMM tiles: the ``[16, slots]``, ``[16, R]`` and ``[slots, R / rank_parts]``
        outputs split their N extent over the warps in MMA tiles of 8, and ``slots`` is a multiple of 16 (the K
        extent of ``dS @ C``)."""
        warps = self.threads // 32
        if self.threads not in (128, 256) or self.block_slots not in (32, 64):
            raise ValueError(f"threads must be 128/256 and block_slots 32/64, got {self}")
        if not 1 <= self.rank_parts <= 8 or rank % self.rank_parts != 0:
            raise ValueError(f"rank_parts must be in [1, 8] and divide R ({rank}), got {self.rank_parts}")
        part = rank // self.rank_parts
        if self.block_slots % (8 * warps) != 0 or part % (8 * warps) != 0:
            raise ValueError(f"block_slots ({self.block_slots}) and R / rank_parts ({part}) must be multiples of "
                             f"8 * warps = {8 * warps} for {self.threads} threads")

    def shared_bytes(self, heads: int, rank: int, itemsize: int = 2) -> int:
        """Shared memory the kernel asks for (Q, dO, the gathered tile, P and dS tiles, the fp32 dC slice and the
        fp32 dQ staging tile)."""
        heads_pad = padded_heads(heads)
        return (2 * heads_pad * rank * itemsize + self.block_slots * rank * itemsize
                + 2 * heads_pad * self.block_slots * itemsize + self.block_slots * (rank // self.rank_parts) * 4
                + heads_pad * rank * 4)


def default_backward_config(rank: int) -> BackwardConfig:
    """32 slots, 128 threads, and the fewest rank slices of <= 128 columns: what ptxas (sm_90a, nvcc 13) compiles
    without spilling at R = 256 (2 slices) and R = 384 (3 slices; 1 slice spilled in the one-block-per-query kernel).
    In that kernel 14 other configs for `base` and 6 for `small` were timed on the H200 (benchmarks/results/
    dsa_backward_configs_2026-12-02.json): none was more than 0.6 % faster."""
    widest = 128
    fitting = [p for p in range(1, 9) if rank % p == 0 and (rank // p) % 32 == 0]
    if not fitting:
        raise ValueError(f"the TileLang backward needs R a multiple of 32 (128 threads), got {rank}")
    narrow = [p for p in fitting if rank // p <= widest]
    return BackwardConfig(rank_parts=narrow[0] if narrow else fitting[-1])


def check_backward_inputs(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                          lse: torch.Tensor, d_out: torch.Tensor, softmax_scale: float) -> None:
    """ValueError unless the backward kernel can take these (pure torch; no TileLang import). The backward-only
    tensors are checked first, so CPU tests reach those messages before the forward's CUDA check."""
    for name, tensor in (("out", out), ("d_out", d_out)):
        if tensor.shape != q_lat.shape or tensor.dtype != q_lat.dtype or not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous [B, T, H, R] {q_lat.dtype} like q_lat "
                             f"{tuple(q_lat.shape)}, got {tuple(tensor.shape)} {tensor.dtype}")
    if lse.shape != q_lat.shape[:3] or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"lse must be contiguous [B, T, H] float32, got {tuple(lse.shape)} {lse.dtype}")
    for name, tensor in (("out", out), ("lse", lse), ("d_out", d_out)):
        if tensor.device != q_lat.device:
            raise ValueError(f"{name} is on {tensor.device}, q_lat on {q_lat.device}")
    check_inputs(q_lat, latent, indices, softmax_scale)


def slab_order(indices: torch.Tensor, slab_rows: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots each (query, slab) block walks.

    Args:
        indices: ``[B, T, W]`` int32/int64 latent rows, -1 for an empty slot.
        slab_rows: rows per slab (positive).
        kv_len: S, the number of latent rows (every valid index is below it).

    Returns:
        ``rows [B, T, W]`` int32 and ``offsets [B, T, n + 1]`` int32 with ``n = ceil(S / slab_rows)`` (at least 1):
        query t's slots in slab s are ``rows[b, t, offsets[b, t, s]:offsets[b, t, s + 1]]``, where an entry of -1
        is an empty slot (the kernel skips it). With more than one slab each row is sorted, its empty slots last
        and outside every slab's range, so ``offsets[..., n]`` is its count of valid slots; with one slab the rows
        are the indices as given and ``offsets`` is ``(0, W)``.
    """
    if slab_rows < 1:
        raise ValueError(f"slab_rows must be positive, got {slab_rows}")
    if kv_len >= _EMPTY_KEY:
        raise ValueError(f"kv_len {kv_len} does not fit the int32 rows")
    n_slabs = max(1, -(-kv_len // slab_rows))
    if n_slabs > MAX_SLABS:
        raise ValueError(f"{n_slabs} slabs of {slab_rows} rows over {kv_len} keys: at most {MAX_SLABS} (the grid's "
                         f"second dimension); use slab_rows >= {-(-kv_len // MAX_SLABS)}")
    batch, seq_len, width = indices.shape
    if n_slabs == 1:
        offsets = torch.tensor([0, width], dtype=torch.int32, device=indices.device)
        return indices.to(torch.int32).contiguous(), offsets.expand(batch, seq_len, 2).contiguous()
    rows = torch.empty(indices.shape, dtype=torch.int32, device=indices.device)
    offsets = torch.empty((batch, seq_len, n_slabs + 1), dtype=torch.int32, device=indices.device)
    bounds = torch.arange(n_slabs + 1, device=indices.device, dtype=torch.int64) * slab_rows
    bounds = bounds.clamp_max(_EMPTY_KEY - 1).to(torch.int32)
    for t0 in range(0, seq_len, _SORT_QUERIES):
        t1 = min(seq_len, t0 + _SORT_QUERIES)
        piece = indices[:, t0:t1]
        keys = torch.where(piece < 0, _EMPTY_KEY, piece).to(torch.int32).sort(dim=-1).values
        offsets[:, t0:t1] = torch.searchsorted(keys, bounds.expand(batch, t1 - t0, n_slabs + 1).contiguous(),
                                               out_int32=True)
        rows[:, t0:t1] = keys.masked_fill(keys == _EMPTY_KEY, -1)
    return rows, offsets


def row_dot(out: torch.Tensor, d_out: torch.Tensor, rows_per_step: int = 4096) -> torch.Tensor:
    """``delta [B, T, H]`` fp32 = rowsum(O * dO), products and sums in fp32, a few thousand queries at a time (no
    full fp32 copies of O and dO)."""
    delta = torch.empty(out.shape[:-1], dtype=torch.float32, device=out.device)
    for t0 in range(0, out.shape[1], rows_per_step):
        t1 = min(out.shape[1], t0 + rows_per_step)
        delta[:, t0:t1] = (out[:, t0:t1].float() * d_out[:, t0:t1].float()).sum(-1)
    return delta


def build_backward_prim_func(heads: int, rank: int, width: int, dtype: str, softmax_scale: float,
                             config: BackwardConfig):
    """The TileLang ``prim_func`` for one ``(H, R, W, dtype, scale, config)``; arguments (Q, Latent, Rows, Offsets,
    Lse, Delta, DOut, DQ, DLatent) with DQ ``[B, T, H, R]`` and DLatent ``[B, S, R]`` fp32, zeroed by the caller."""
    import tilelang.language as T

    config.check(rank)
    block_slots, threads = config.block_slots, config.threads
    heads_pad = padded_heads(heads)
    scale = float(softmax_scale)
    scale_log2 = scale * LOG2_E
    part = rank // config.rank_parts
    part_offsets = [part * index for index in range(config.rank_parts)]
    accum = "float32"
    batch = T.dynamic("batch")
    seq_len = T.dynamic("seq_len")
    kv_len = T.dynamic("kv_len")
    n_bounds = T.dynamic("n_bounds")          # slabs + 1

    @T.prim_func
    def sparse_latent_bwd(
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
                # Slots past this block's count re-read a later slot (or row 0 for -1): masked below.
                for j, r in T.Parallel(block_slots, rank):
                    kv_shared[j, r] = Latent[
                        b, T.max(Rows[b, t, T.min(first + blk * block_slots + j, width - 1)], 0), r]
                for j in T.Parallel(block_slots):
                    slot_valid[j] = T.if_then_else(blk * block_slots + j < count,
                                                   Rows[b, t, T.min(first + blk * block_slots + j, width - 1)] >= 0,
                                                   False)
                T.gemm(q_shared, kv_shared, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullCol,
                       clear_accum=True)
                T.gemm(do_shared, kv_shared, d_probs, transpose_B=True, policy=T.GemmWarpPolicy.FullCol,
                       clear_accum=True)
                for h, j in T.Parallel(heads_pad, block_slots):
                    scores[h, j] = T.if_then_else(slot_valid[j], T.exp2(scores[h, j] * scale_log2 - lse_log2[h]), 0)
                for h, j in T.Parallel(heads_pad, block_slots):
                    d_probs[h, j] = scores[h, j] * (d_probs[h, j] - delta[h]) * scale
                T.copy(scores, p_shared)
                T.copy(d_probs, ds_shared)
                T.gemm(ds_shared, kv_shared, acc_dq, policy=T.GemmWarpPolicy.FullCol)
                # dC in rank slices (a Python loop: unrolled while the kernel is built), so the fp32 tile in
                # registers is [slots, R / rank_parts], not [slots, R].
                for column in part_offsets:
                    T.gemm(ds_shared, q_shared[0:heads_pad, column:column + part], acc_dkv, transpose_A=True,
                           policy=T.GemmWarpPolicy.FullCol, clear_accum=True)
                    T.gemm(p_shared, do_shared[0:heads_pad, column:column + part], acc_dkv, transpose_A=True,
                           policy=T.GemmWarpPolicy.FullCol)
                    T.copy(acc_dkv, dkv_shared)
                    for j, v in T.Parallel(block_slots, part // ATOMIC_VECTOR):
                        if blk * block_slots + j < count:
                            if Rows[b, t, T.min(first + blk * block_slots + j, width - 1)] >= 0:
                                T.atomic_addx4(
                                    DLatent[b, Rows[b, t, T.min(first + blk * block_slots + j, width - 1)],
                                            column + v * ATOMIC_VECTOR],
                                    dkv_shared[j, v * ATOMIC_VECTOR])

            T.copy(acc_dq, dq_shared)
            for h, v in T.Parallel(heads_pad, rank // ATOMIC_VECTOR):
                if h < heads:
                    if count > 0:
                        T.atomic_addx4(DQ[b, t, h, v * ATOMIC_VECTOR], dq_shared[h, v * ATOMIC_VECTOR])

    return sparse_latent_bwd


_COMPILE_LOCK = threading.Lock()     # as the forward's: one compile per key across threads


def compiled_backward_kernel(heads: int, rank: int, width: int, dtype: str, softmax_scale: float,
                             config: BackwardConfig):
    """The compiled backward kernel for one shape key (compiled on first use, then reused for the process)."""
    with _COMPILE_LOCK:
        return _compiled_backward_kernel(heads, rank, width, dtype, softmax_scale, config)


@functools.lru_cache(maxsize=None)
def _compiled_backward_kernel(heads: int, rank: int, width: int, dtype: str, softmax_scale: float,
                              config: BackwardConfig):
    import tilelang

    func = build_backward_prim_func(heads, rank, width, dtype, softmax_scale, config)
    return tilelang.compile(func, target="cuda", pass_configs=tilelang_forward.pass_configs())


def sparse_latent_attention_backward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                     out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                                     softmax_scale: float, *, config: BackwardConfig | None = None,
                                     slab_rows: int = DEFAULT_SLAB_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of :func:`tilelang_forward.sparse_latent_attention_forward` (the Triton backward's contract).

    Args:
        q_lat, latent, indices, softmax_scale: the forward's inputs (see the module docstring for shapes).
        out: ``[B, T, H, R]`` the forward's o_lat; lse: ``[B, T, H]`` its fp32 natural-log log-sum-exp.
        d_out: ``[B, T, H, R]`` gradient of o_lat (cast to q's dtype and made contiguous here).
        config: launch shape (default :func:`default_backward_config`).
        slab_rows: latent rows per slab (:func:`slab_order`).

    Returns:
        ``(d_q_lat [B, T, H, R] in q's dtype, d_latent [B, S, R] in latent's dtype)``.
    """
    d_out = d_out.to(q_lat.dtype).contiguous()
    check_backward_inputs(q_lat, latent, indices, out, lse, d_out, softmax_scale)
    batch, seq_len, heads, rank = q_lat.shape
    config = default_backward_config(rank) if config is None else config
    config.check(rank)
    d_q = torch.zeros(q_lat.shape, dtype=torch.float32, device=q_lat.device)
    d_latent = torch.zeros(latent.shape, dtype=torch.float32, device=latent.device)
    if seq_len > 0 and batch > 0:
        if latent.shape[1] == 0:
            raise ValueError("latent has no rows (S = 0) but indices has rows to attend")
        rows, offsets = slab_order(indices, slab_rows, latent.shape[1])
        delta = row_dot(out, d_out)
        kernel = compiled_backward_kernel(heads, rank, indices.shape[2], SUPPORTED_DTYPES[q_lat.dtype],
                                          float(softmax_scale), config)
        with torch.cuda.device(q_lat.device):
            kernel(q_lat, latent, rows, offsets, lse, delta, d_out, d_q, d_latent)
    return d_q.to(q_lat.dtype), d_latent.to(latent.dtype)


# The kernel pair for dsa_triton.SparseLatentAttention (TileLang forward and backward).
TILELANG_KERNELS = (tilelang_forward.sparse_latent_attention_forward, sparse_latent_attention_backward)


def prepare_tilelang_inputs(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the TileLang kernels are handed: q_lat and latent in one dtype and contiguous exactly as
    ``dsa_triton.prepare_inputs`` gives them, indices as contiguous int32 (int64 rows are narrowed: valid entries are
    latent row numbers, far below 2^31). Pure torch, CPU-runnable."""
    q_lat, latent, indices = dsa_triton.prepare_inputs(q_lat, latent, indices)
    if indices.dtype == torch.int64:
        indices = indices.to(torch.int32)
    return q_lat, latent, indices.contiguous()


def sparse_latent_attention(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                            *, query_chunk: int | None = None, recompute: bool | None = None) -> torch.Tensor:
    """Drop-in for ``dsa_triton.sparse_latent_attention`` on CUDA bf16/fp16 tensors (TileLang forward and backward).

    Args as the reference; ``query_chunk`` and ``recompute`` are accepted for signature compatibility and ignored
    (nothing is gathered into memory; backward recomputes probabilities from the stored log-sum-exp). fp32 inputs
    raise ValueError (the Triton op takes them). Returns ``o_lat [B, T, H, R]`` in the kernels' common dtype.
    """
    if not (q_lat.is_cuda and latent.is_cuda and indices.is_cuda):
        raise ValueError("the TileLang sparse attention needs CUDA tensors; use reference.sparse_latent_attention "
                         "on CPU")
    q_lat, latent, indices = prepare_tilelang_inputs(q_lat, latent, indices)
    check_inputs(q_lat, latent, indices, softmax_scale)
    return dsa_triton.SparseLatentAttention.apply(q_lat, latent, indices, softmax_scale, TILELANG_KERNELS)
