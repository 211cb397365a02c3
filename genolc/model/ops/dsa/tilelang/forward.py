"""Sparse latent attention forward (DSA, absorbed MLA form) in TileLang: heads share each gathered latent tile.

Contract (the same as ``triton.sparse_latent_attention_forward``):

    q_lat    [B, T, H, R]  bf16 or fp16, contiguous   (queries already absorbed into the latent space)
    latent   [B, S, R]     q's dtype, contiguous     (the MLA latent: keys AND values, shared by all heads)
    indices  [B, T, W]     int32, contiguous         (-1 = empty slot; one row per query, the same for all heads)
    returns  o_lat [B, T, H, R] in q's dtype, lse [B, T, H] fp32

    scores[h, s] = softmax_scale * q_lat[h] . latent[s];  o_lat[h] = sum_s softmax(scores)[h, s] * latent[s];
    lse = natural-log log-sum-exp of the scaled scores; a row with no valid slot gives zeros and lse = +inf.

Design. One thread block per query token (grid T x B, 128 threads by default). The block keeps its H query rows in
shared memory, padded with zero rows to a multiple of 16 (the M extent of an MMA tile), and walks the index row in
blocks of ``block_slots`` slots: it gathers those latent rows (R * 2 contiguous bytes each) into shared memory, computes
the ``[H_pad, block_slots]`` score tile with one tensor-core GEMM (Q @ K^T), updates an fp32 online softmax
(exp2 with the scale folded into log2 units), and accumulates ``P @ V`` into an fp32 ``[H_pad, R]`` fragment with a
second GEMM on the same shared tile (keys and values are the same latent rows). The gather is software-pipelined
(``num_stages`` buffers) so the next block's loads overlap this block's math.

Why this shape: every gathered latent row serves all H heads, so a slot costs ``4 * H * R`` FLOPs for ``2 * R``
bytes gathered (16-24 FLOP/byte at H = 8-12): still below the H200's balance point, i.e. gather-bound, but ~H times
less traffic than per-head keys. Masked slots (-1, or past W in the last block) get a score of -inf before the
GEMM adds to it; their gather reads row 0 or slot W - 1's row (cached) instead of branching. The running max starts at a
large finite negative value so a block with no valid slot never computes ``-inf - -inf``.

Kernels are compiled per ``(H, R, W, dtype, softmax_scale, KernelConfig)`` (B, T and S are dynamic) and cached for
the process. TileLang widens index arithmetic to 64 bits where 32 could overflow (``T * H * R`` passes 2**31 at 1M
tokens; the generated CUDA indexes every global tensor with ``int64_t``). TileLang is imported only when a kernel is
built, never at module import (CPU installs have no TileLang). Unsupported inputs raise ValueError; there is no
fallback to another implementation.
"""

import functools
import math
import threading
from dataclasses import dataclass

import torch

MAX_HEADS = 32
MAX_RANK = 512
SUPPORTED_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Finite floor of the running max (raw score units): keeps exp2 arguments finite while no valid slot was seen.
RUNNING_MAX_FLOOR = -(2.0 ** 30)
LOG2_E = 1.4426950408889634


@dataclass(frozen=True)
class KernelConfig:
    """Launch shape: slots gathered per pipeline step, pipeline depth, threads per block (one query per block)."""

    block_slots: int = 64
    num_stages: int = 2
    threads: int = 128

    def check(self, rank: int) -> None:
        """ValueError unless both GEMMs can split their N extent (slots, R) over the warps in MMA tiles of 8."""
        warps = self.threads // 32
        if self.threads not in (64, 128, 256) or self.block_slots not in (16, 32, 64, 128):
            raise ValueError(f"threads must be 64/128/256 and block_slots 16/32/64/128, got {self}")
        if not 1 <= self.num_stages <= 4:
            raise ValueError(f"num_stages must be in [1, 4], got {self.num_stages}")
        if self.block_slots % (8 * warps) != 0 or rank % (8 * warps) != 0:
            raise ValueError(f"block_slots ({self.block_slots}) and R ({rank}) must be multiples of "
                             f"8 * warps = {8 * warps} for {self.threads} threads")


DEFAULT_CONFIG = KernelConfig()


def default_config(rank: int) -> KernelConfig:
    """64-slot double-buffered tiles, 128 threads, for every rank: the fastest of the four configs tried on the H200
    (benchmarks/results/dsa_tilelang_2026-11-29.json, 64k tokens, W = 2051). At R = 384 these tiles take ~113 KiB of
    shared memory, one block per SM, yet beat 32-slot triple-buffered ones (two blocks per SM): 25.8 vs 33.3 ms."""
    return DEFAULT_CONFIG


def padded_heads(heads: int) -> int:
    """Heads rounded up to the 16-row M extent of one MMA tile."""
    return 16 * math.ceil(heads / 16)


def unsupported_reason(q_lat: torch.Tensor, latent: torch.Tensor) -> str | None:
    """Why these (prepared) operands need the Triton kernels instead, or None when TileLang's take them: dtype,
    head count and latent rank (pure torch; no TileLang import)."""
    if q_lat.dtype not in SUPPORTED_DTYPES or latent.dtype != q_lat.dtype:
        return f"dtype {q_lat.dtype}/{latent.dtype} (TileLang kernels take bf16 or fp16)"
    heads, rank = q_lat.shape[-2], q_lat.shape[-1]
    if not 1 <= heads <= MAX_HEADS:
        return f"{heads} heads (TileLang kernels take up to {MAX_HEADS})"
    if rank % 16 != 0 or not 16 <= rank <= MAX_RANK:
        return f"latent rank {rank} (TileLang kernels take multiples of 16 up to {MAX_RANK})"
    return None


def check_inputs(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, softmax_scale: float) -> None:
    """ValueError unless the kernel can take these inputs exactly as given (pure torch; no TileLang import)."""
    if q_lat.dim() != 4 or latent.dim() != 3 or indices.dim() != 3:
        raise ValueError(f"q_lat must be [B, T, H, R], latent [B, S, R], indices [B, T, W]; got "
                         f"{tuple(q_lat.shape)}, {tuple(latent.shape)}, {tuple(indices.shape)}")
    batch, seq_len, heads, rank = q_lat.shape
    if latent.shape[0] != batch or latent.shape[2] != rank:
        raise ValueError(f"latent [B, S, R] must match q_lat [B, T, H, R] in B and R: {tuple(latent.shape)} vs "
                         f"{tuple(q_lat.shape)}")
    if tuple(indices.shape[:2]) != (batch, seq_len):
        raise ValueError(f"indices [B, T, W] must match q_lat in B and T: {tuple(indices.shape)} vs "
                         f"{tuple(q_lat.shape)}")
    if indices.shape[2] < 1:
        raise ValueError("indices must have at least one slot per row (W >= 1)")
    if q_lat.dtype not in SUPPORTED_DTYPES or latent.dtype != q_lat.dtype:
        raise ValueError(f"q_lat and latent must share one dtype of {tuple(SUPPORTED_DTYPES)}, got {q_lat.dtype}, "
                         f"{latent.dtype}")
    if indices.dtype != torch.int32:
        raise ValueError(f"indices must be int32, got {indices.dtype}")
    for name, tensor in (("q_lat", q_lat), ("latent", latent), ("indices", indices)):
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {tensor.stride()} for shape "
                             f"{tuple(tensor.shape)}")
    if not 1 <= heads <= MAX_HEADS:
        raise ValueError(f"H must be in [1, {MAX_HEADS}], got {heads}")
    if rank % 16 != 0 or not 16 <= rank <= MAX_RANK:
        # 16: the K extent of one bf16 MMA step in Q @ K^T.
        raise ValueError(f"R must be a multiple of 16 in [16, {MAX_RANK}], got {rank}")
    if not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
    if not (q_lat.is_cuda and latent.is_cuda and indices.is_cuda):
        raise ValueError("the TileLang kernel needs CUDA tensors; use reference.sparse_latent_attention on CPU")
    if q_lat.device != latent.device or q_lat.device != indices.device:
        raise ValueError(f"q_lat, latent, indices must be on one device, got {q_lat.device}, {latent.device}, "
                         f"{indices.device}")


def build_prim_func(heads: int, rank: int, width: int, dtype: str, softmax_scale: float,
                    config: KernelConfig = DEFAULT_CONFIG):
    """The TileLang ``prim_func`` for one ``(H, R, W, dtype, scale)``; arguments (Q, Latent, Indices, Out, Lse)."""
    import tilelang.language as T

    config.check(rank)
    block_slots, num_stages, threads = config.block_slots, config.num_stages, config.threads
    heads_pad = padded_heads(heads)
    num_blocks = -(-width // block_slots)
    scale_log2 = float(softmax_scale) * LOG2_E
    accum = "float32"
    batch = T.dynamic("batch")
    seq_len = T.dynamic("seq_len")
    kv_len = T.dynamic("kv_len")

    @T.prim_func
    def sparse_latent_fwd(
        Q: T.Tensor([batch, seq_len, heads, rank], dtype),
        Latent: T.Tensor([batch, kv_len, rank], dtype),
        Indices: T.Tensor([batch, seq_len, width], "int32"),
        Out: T.Tensor([batch, seq_len, heads, rank], dtype),
        Lse: T.Tensor([batch, seq_len, heads], accum),
    ):
        with T.Kernel(seq_len, batch, threads=threads) as (t, b):
            q_shared = T.alloc_shared([heads_pad, rank], dtype)
            kv_shared = T.alloc_shared([block_slots, rank], dtype)
            p_shared = T.alloc_shared([heads_pad, block_slots], dtype)
            scores = T.alloc_fragment([heads_pad, block_slots], accum)
            acc_o = T.alloc_fragment([heads_pad, rank], accum)
            row_max = T.alloc_fragment([heads_pad], accum)
            row_max_prev = T.alloc_fragment([heads_pad], accum)
            rescale = T.alloc_fragment([heads_pad], accum)
            row_sum = T.alloc_fragment([heads_pad], accum)
            block_sum = T.alloc_fragment([heads_pad], accum)
            slot_valid = T.alloc_fragment([block_slots], "bool")

            for h, r in T.Parallel(heads_pad, rank):
                q_shared[h, r] = T.if_then_else(h < heads, Q[b, t, T.min(h, heads - 1), r], T.cast(0, dtype))
            T.fill(acc_o, 0)
            T.fill(row_sum, 0)
            T.fill(row_max, RUNNING_MAX_FLOOR)

            for blk in T.Pipelined(num_blocks, num_stages=num_stages):
                # Slots past W (last block) re-read slot W - 1 and -1 slots read row 0: both masked below.
                for j, r in T.Parallel(block_slots, rank):
                    kv_shared[j, r] = Latent[b, T.max(Indices[b, t, T.min(blk * block_slots + j, width - 1)], 0), r]
                for j in T.Parallel(block_slots):
                    slot_valid[j] = T.if_then_else(blk * block_slots + j < width,
                                                   Indices[b, t, T.min(blk * block_slots + j, width - 1)] >= 0, False)
                for h, j in T.Parallel(heads_pad, block_slots):
                    scores[h, j] = T.if_then_else(slot_valid[j], 0, -T.infinity(accum))
                T.gemm(q_shared, kv_shared, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)

                T.copy(row_max, row_max_prev)
                T.reduce_max(scores, row_max, dim=1, clear=False)
                for h in T.Parallel(heads_pad):
                    rescale[h] = T.exp2((row_max_prev[h] - row_max[h]) * scale_log2)
                for h, j in T.Parallel(heads_pad, block_slots):
                    scores[h, j] = T.exp2(scores[h, j] * scale_log2 - row_max[h] * scale_log2)
                T.reduce_sum(scores, block_sum, dim=1)
                for h in T.Parallel(heads_pad):
                    row_sum[h] = row_sum[h] * rescale[h] + block_sum[h]
                for h, r in T.Parallel(heads_pad, rank):
                    acc_o[h, r] *= rescale[h]
                T.copy(scores, p_shared)
                T.gemm(p_shared, kv_shared, acc_o, policy=T.GemmWarpPolicy.FullCol)

            for h, r in T.Parallel(heads_pad, rank):
                if h < heads:
                    Out[b, t, h, r] = T.if_then_else(row_sum[h] > 0, acc_o[h, r] / row_sum[h], 0)
            for h in T.Parallel(heads_pad):
                if h < heads:
                    Lse[b, t, h] = T.if_then_else(row_sum[h] > 0,
                                                  T.log(row_sum[h]) + row_max[h] * float(softmax_scale),
                                                  T.infinity(accum))

    return sparse_latent_fwd


def pass_configs() -> dict:
    import tilelang

    return {
        tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True,
        tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
    }


# A thread that asks for a kernel another thread is compiling waits for it rather than compiling it again
# (genolc/train/kernel_warmup.py compiles the forward and the backward in two threads while its step runs).
_KEY_LOCKS: dict[tuple, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()


def compile_once(build, *key):
    """``tilelang.compile(build(*key))`` for CUDA, once per process and ``(build, key)``: threads asking for one key
    wait for the first one's compile; different keys (the warm-up's kernels, a benchmark's configs) compile at once,
    nvcc running outside the GIL. ``build`` returns a TileLang ``prim_func`` (this module's and the backward
    modules' builders)."""
    with _KEY_LOCKS_GUARD:
        lock = _KEY_LOCKS.setdefault((build, key), threading.Lock())
    with lock:
        return _compiled(build, key)


@functools.lru_cache(maxsize=None)
def _compiled(build, key: tuple):
    import tilelang

    return tilelang.compile(build(*key), target="cuda", pass_configs=pass_configs())


def compiled_kernel(heads: int, rank: int, width: int, dtype: str, softmax_scale: float,
                    config: KernelConfig = DEFAULT_CONFIG):
    """The compiled kernel for one shape key (compiled on first use, then reused for the process)."""
    return compile_once(build_prim_func, heads, rank, width, dtype, softmax_scale, config)


def sparse_latent_attention_forward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                    softmax_scale: float, *, config: KernelConfig | None = None
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention of each query's H heads over its selected latent rows (TileLang, forward only).

    Args:
        q_lat: ``[B, T, H, R]`` absorbed queries, bf16/fp16, contiguous.
        latent: ``[B, S, R]`` keys and values shared by all heads, q's dtype, contiguous.
        indices: ``[B, T, W]`` int32 latent rows per query, ``-1`` for empty slots; valid entries in ``[0, S)``.
        softmax_scale: multiplies ``q . latent`` before the softmax.
        config: launch shape (default :func:`default_config`); each config is its own compiled kernel.

    Returns:
        ``(o_lat [B, T, H, R] in q's dtype, lse [B, T, H] fp32)``; rows with no valid slot give zeros and +inf.
    """
    check_inputs(q_lat, latent, indices, softmax_scale)
    batch, seq_len, heads, rank = q_lat.shape
    config = default_config(rank) if config is None else config
    config.check(rank)
    out = torch.empty_like(q_lat)
    lse = torch.empty(batch, seq_len, heads, dtype=torch.float32, device=q_lat.device)
    if seq_len == 0 or batch == 0:
        return out, lse
    if latent.shape[1] == 0:
        raise ValueError("latent has no rows (S = 0) but indices has rows to attend")
    kernel = compiled_kernel(heads, rank, indices.shape[2], SUPPORTED_DTYPES[q_lat.dtype], float(softmax_scale),
                             config)
    with torch.cuda.device(q_lat.device):
        kernel(q_lat, latent, indices, out, lse)
    return out, lse
