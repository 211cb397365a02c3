"""Sparse latent attention (DSA, absorbed MLA form) backward in TileLang, and the TileLang autograd op.

Contract (the same as ``dsa_triton.sparse_latent_attention_backward``):

    q_lat    [B, T, H, R]  bf16 or fp16, contiguous      latent  [B, S, R]  q's dtype, contiguous
    indices  [B, T, W]     int32, contiguous (-1 = empty slot, shared by all heads)
    out      [B, T, H, R]  the forward's o_lat            lse     [B, T, H]  fp32 natural log, +inf for empty rows
    d_out    [B, T, H, R]  gradient of o_lat
    returns  (d_q_lat [B, T, H, R] in q's dtype, d_latent [B, S, R] in latent's dtype)

    P = exp(scale * Q C^T - lse);  delta = rowsum(O * dO);  dP = dO C^T;  dS = P * (dP - delta) * scale
    dQ = dS C;  dC[s] += dS[:, s]^T Q + P[:, s]^T dO   for every selected row s (fp32 atomics, cast at the end)

The autograd op's backward (:func:`chosen_backward`) runs this module's kernel below ``SLABBED_FROM_ROWS`` latent
rows and the slab-ordered kernel of backward_slabs.py from there on, where its scatter stays in L2.

Design (mirrors forward.py). One thread block per query token (grid T x B). The block holds its H query rows and
their dO rows in shared memory, zero-padded to a multiple of 16 heads (the M extent of an MMA tile), computes
``delta`` itself in fp32 (no fp32 [B, T, H] copies of O and dO), and walks the index row in blocks of
``block_slots`` slots. Per block: gather the latent rows into shared memory (software-pipelined), two GEMMs for
``S = Q C^T`` and ``dP = dO C^T`` into fp32 fragments, ``P`` and ``dS`` elementwise, then ``dQ += dS C`` (fp32
``[H_pad, R]`` fragment kept for the whole row), and ``dC = dS^T Q + P^T dO`` in ``rank_parts`` column slices (an
fp32 ``[block_slots, R / rank_parts]`` fragment), each staged through shared memory and added into an fp32
``[B, S, R]`` buffer with 16-byte vector atomics (``atomic_addx4``: ``atom.global.add.v4.f32`` on sm_90, a quarter
of the scalar atomic instructions; consecutive threads take consecutive 16 bytes of one row). Masked slots (-1, or
past W in the last block) get P = 0 and issue no atomics.

What limits it: the scatter. Every (query, slot) adds one fp32 row of R into d_latent: T * W * R * 4 bytes of
read-modify-write traffic at the L2 (3.2 TB at 1M tokens, W = 2051, R = 384), against T * W * R * 2 gathered bytes
and 10 * T * W * H * R FLOPs. Its bound is the L2's fp32 adds, not the number of requests: one bulk reduction
(``cp.reduce.async.bulk ... add.f32``) per row slice instead of 32 vector atomics ran no faster on the H200
(benchmarks/results/dsa_backward_bulk_scatter_2026-12-03/; the code is in the commit that added that folder).
Registers: the dQ accumulator alone is 16 * R fp32 over 128 threads (48 a thread at R = 384), so dC is sliced;
ptxas (sm_90a) for the default configs: H=8/R=256 182 registers, H=12/R=384 254, no spills. Shared memory at
R = 384: Q and dO 24 KiB, two gathered 32-slot stages 48 KiB, the fp32 dC slice 16 KiB (~89 KiB; 254 registers x 128
threads also leaves room for two blocks per SM).

Empty rows: lse = +inf gives P = 0, hence dQ = 0 and no contribution to d_latent. The exponent uses a finite
stand-in for +inf (``EMPTY_ROW_LSE``) so fast-math ``exp2`` never sees an infinity.

Kernels are compiled per ``(H, R, W, dtype, softmax_scale, BackwardConfig)`` and cached for the process; B, T and S
are dynamic. TileLang is imported only when a kernel is built. Unsupported inputs raise ValueError; nothing falls
back to another implementation.
"""

# No ``from __future__ import annotations``: TileLang evaluates the prim_func's tensor annotations, which name
# build_backward_prim_func's local dynamic dimensions.
import torch

from genolc.model.ops.dsa import triton as dsa_triton
from genolc.model.ops.dsa.tilelang import backward_slabs
from genolc.model.ops.dsa.tilelang import forward as tilelang_forward
from genolc.model.ops.dsa.tilelang.backward_config import (ATOMIC_VECTOR, DEFAULT_BACKWARD_CONFIG, EMPTY_ROW_LSE,
                                                           BackwardConfig, check_backward_inputs,
                                                           default_backward_config, slot_step_macros)
from genolc.model.ops.dsa.tilelang.forward import LOG2_E, SUPPORTED_DTYPES, check_inputs, padded_heads

def build_backward_prim_func(heads: int, rank: int, width: int, dtype: str, softmax_scale: float,
                             config: BackwardConfig = DEFAULT_BACKWARD_CONFIG):
    """The TileLang ``prim_func`` for one ``(H, R, W, dtype, scale)``; arguments
    (Q, Latent, Indices, Out, Lse, DOut, DQ, DLatent) with DLatent fp32 ``[B, S, R]``, zeroed by the caller."""
    import tilelang.language as T

    config.check(rank)
    block_slots, num_stages, threads = config.block_slots, config.num_stages, config.threads
    heads_pad = padded_heads(heads)
    num_blocks = -(-width // block_slots)
    part = rank // config.rank_parts
    part_offsets = [part * index for index in range(config.rank_parts)]
    probabilities_and_dq, dc_slice = slot_step_macros(heads_pad, block_slots, part, softmax_scale)
    accum = "float32"
    batch = T.dynamic("batch")
    seq_len = T.dynamic("seq_len")
    kv_len = T.dynamic("kv_len")

    @T.prim_func
    def sparse_latent_bwd(
        Q: T.Tensor([batch, seq_len, heads, rank], dtype),
        Latent: T.Tensor([batch, kv_len, rank], dtype),
        Indices: T.Tensor([batch, seq_len, width], "int32"),
        Out: T.Tensor([batch, seq_len, heads, rank], dtype),
        Lse: T.Tensor([batch, seq_len, heads], accum),
        DOut: T.Tensor([batch, seq_len, heads, rank], dtype),
        DQ: T.Tensor([batch, seq_len, heads, rank], dtype),
        DLatent: T.Tensor([batch, kv_len, rank], accum),
    ):
        with T.Kernel(seq_len, batch, threads=threads) as (t, b):
            q_shared = T.alloc_shared([heads_pad, rank], dtype)
            do_shared = T.alloc_shared([heads_pad, rank], dtype)
            kv_shared = T.alloc_shared([block_slots, rank], dtype)
            p_shared = T.alloc_shared([heads_pad, block_slots], dtype)
            ds_shared = T.alloc_shared([heads_pad, block_slots], dtype)
            dkv_shared = T.alloc_shared([block_slots, part], accum)
            scores = T.alloc_fragment([heads_pad, block_slots], accum)
            d_probs = T.alloc_fragment([heads_pad, block_slots], accum)
            acc_dq = T.alloc_fragment([heads_pad, rank], accum)
            acc_dkv = T.alloc_fragment([block_slots, part], accum)
            delta = T.alloc_fragment([heads_pad], accum)
            lse_log2 = T.alloc_fragment([heads_pad], accum)
            slot_valid = T.alloc_fragment([block_slots], "bool")

            for h, r in T.Parallel(heads_pad, rank):
                q_shared[h, r] = T.if_then_else(h < heads, Q[b, t, T.min(h, heads - 1), r], T.cast(0, dtype))
                do_shared[h, r] = T.if_then_else(h < heads, DOut[b, t, T.min(h, heads - 1), r], T.cast(0, dtype))
            # delta = rowsum(O * dO) in fp32, each thread summing the rows it owns in the score layout (a block
            # reduce over the [H_pad, R] dQ layout fails to lower in TileLang 0.1.15 for H_pad = 32).
            for h in T.Parallel(heads_pad):
                delta[h] = 0
                for r in T.serial(rank):
                    delta[h] += T.if_then_else(
                        h < heads, T.cast(Out[b, t, T.min(h, heads - 1), r], accum) * T.cast(do_shared[h, r], accum), 0)
            T.fill(acc_dq, 0)
            for h in T.Parallel(heads_pad):
                lse_log2[h] = T.if_then_else(h < heads, Lse[b, t, T.min(h, heads - 1)], T.infinity(accum))
                lse_log2[h] = T.if_then_else(lse_log2[h] < T.infinity(accum), lse_log2[h] * LOG2_E, EMPTY_ROW_LSE)

            for blk in T.Pipelined(num_blocks, num_stages=num_stages):
                # Slots past W (last block) re-read slot W - 1 and -1 slots read row 0: both masked below.
                for j, r in T.Parallel(block_slots, rank):
                    kv_shared[j, r] = Latent[b, T.max(Indices[b, t, T.min(blk * block_slots + j, width - 1)], 0), r]
                for j in T.Parallel(block_slots):
                    slot_valid[j] = T.if_then_else(blk * block_slots + j < width,
                                                   Indices[b, t, T.min(blk * block_slots + j, width - 1)] >= 0, False)
                probabilities_and_dq(q_shared, do_shared, kv_shared, slot_valid, lse_log2, delta, scores, d_probs,
                                     p_shared, ds_shared, acc_dq)
                # dC in rank slices (a Python loop: unrolled while the kernel is built), so the fp32 tile in
                # registers is [slots, R / rank_parts], not [slots, R].
                for lo in part_offsets:
                    dc_slice(q_shared, do_shared, p_shared, ds_shared, acc_dkv, dkv_shared, lo)
                    for j, v in T.Parallel(block_slots, part // ATOMIC_VECTOR):
                        if blk * block_slots + j < width:
                            if Indices[b, t, T.min(blk * block_slots + j, width - 1)] >= 0:
                                T.atomic_addx4(
                                    DLatent[b, Indices[b, t, T.min(blk * block_slots + j, width - 1)],
                                            lo + v * ATOMIC_VECTOR],
                                    dkv_shared[j, v * ATOMIC_VECTOR])

            for h, r in T.Parallel(heads_pad, rank):
                if h < heads:
                    DQ[b, t, h, r] = acc_dq[h, r]

    return sparse_latent_bwd


def compiled_backward_kernel(heads: int, rank: int, width: int, dtype: str, softmax_scale: float,
                             config: BackwardConfig = DEFAULT_BACKWARD_CONFIG):
    """The compiled backward kernel for one shape key (compiled on first use, then reused for the process)."""
    return tilelang_forward.compile_once(build_backward_prim_func, heads, rank, width, dtype, softmax_scale, config)


def sparse_latent_attention_backward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                     out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                                     softmax_scale: float, *, config: BackwardConfig | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of :func:`tilelang_forward.sparse_latent_attention_forward` (the Triton backward's contract).

    Args:
        q_lat, latent, indices, softmax_scale: the forward's inputs (see the module docstring for shapes).
        out: ``[B, T, H, R]`` the forward's o_lat; lse: ``[B, T, H]`` its fp32 natural-log log-sum-exp.
        d_out: ``[B, T, H, R]`` gradient of o_lat (cast to q's dtype and made contiguous here).
        config: launch shape (default :func:`default_backward_config`).

    Returns:
        ``(d_q_lat [B, T, H, R] in q's dtype, d_latent [B, S, R] in latent's dtype)``.
    """
    d_out = d_out.to(q_lat.dtype).contiguous()
    check_backward_inputs(q_lat, latent, indices, out, lse, d_out, softmax_scale)
    batch, seq_len, heads, rank = q_lat.shape
    config = default_backward_config(rank) if config is None else config
    config.check(rank)
    d_q = torch.empty_like(q_lat)
    d_latent = torch.zeros(latent.shape, dtype=torch.float32, device=latent.device)
    if seq_len > 0 and batch > 0:
        if latent.shape[1] == 0:
            raise ValueError("latent has no rows (S = 0) but indices has rows to attend")
        kernel = compiled_backward_kernel(heads, rank, indices.shape[2], SUPPORTED_DTYPES[q_lat.dtype],
                                          float(softmax_scale), config)
        with torch.cuda.device(q_lat.device):
            kernel(q_lat, latent, indices, out, lse, d_out, d_q, d_latent)
    return d_q, d_latent.to(latent.dtype)


# From this many latent rows on the backward runs in key slabs (backward_slabs.py). Measured on the H200 at 32k queries
# (benchmarks/results/dsa_backward_hybrid_2026-12-02/), this kernel against the slab one in 32k-row slabs: `base`
# 72.6 / 60.8 ms at 128k keys, 77.3 / 64.8 at 256k, 79.6 / 72.3 at 512k; `small` 45.5 / 36.1, 50.1 / 37.7,
# 52.3 / 40.9. With 32k keys this kernel's atomics stay in L2 (53.9 and 32.1 ms) and it keeps its two pipeline
# stages, which the slab kernel cannot have; 64k was not timed, so the two may cross below 128k.
SLABBED_FROM_ROWS = 4 * 32768


def chosen_backward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, d_out: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward the TileLang op runs (arguments and returns as :func:`sparse_latent_attention_backward`): in
    key slabs from ``SLABBED_FROM_ROWS`` latent rows on, else one block per query."""
    if latent.shape[1] >= SLABBED_FROM_ROWS:
        return backward_slabs.sparse_latent_attention_backward_slabs(q_lat, latent, indices, out, lse, d_out,
                                                                     softmax_scale)
    return sparse_latent_attention_backward(q_lat, latent, indices, out, lse, d_out, softmax_scale)


# The kernel pair for dsa_triton.SparseLatentAttention (TileLang forward and backward).
TILELANG_KERNELS = (tilelang_forward.sparse_latent_attention_forward, chosen_backward)


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
                            *, query_chunk: int | None = None, recompute: bool | None = None,
                            kept: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Drop-in for ``dsa_triton.sparse_latent_attention`` on CUDA bf16/fp16 tensors (TileLang forward and backward).

    Args as the reference; ``query_chunk`` and ``recompute`` are accepted for signature compatibility and ignored
    (nothing is gathered into memory; backward recomputes probabilities from the stored log-sum-exp). ``kept``: the
    forward kernel's ``(o_lat, lse)`` for these inputs from an earlier pass (only the backward runs). fp32 inputs
    raise ValueError (the Triton op takes them). Returns ``o_lat [B, T, H, R]`` in the kernels' common dtype.
    """
    if not (q_lat.is_cuda and latent.is_cuda and indices.is_cuda):
        raise ValueError("the TileLang sparse attention needs CUDA tensors; use reference.sparse_latent_attention "
                         "on CPU")
    q_lat, latent, indices = prepare_tilelang_inputs(q_lat, latent, indices)
    check_inputs(q_lat, latent, indices, softmax_scale)
    return dsa_triton.SparseLatentAttention.apply(q_lat, latent, indices, softmax_scale,
                                                  dsa_triton.with_kept_forward(TILELANG_KERNELS, q_lat, kept))


def sparse_latent_attention_forward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                    softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The TileLang forward kernel on the layer's operands as :func:`sparse_latent_attention` prepares them:
    ``(o_lat, lse)``, no autograd (an earlier pass's forward for ``kept``)."""
    q_lat, latent, indices = prepare_tilelang_inputs(q_lat, latent, indices)
    check_inputs(q_lat, latent, indices, softmax_scale)
    return tilelang_forward.sparse_latent_attention_forward(q_lat, latent, indices, softmax_scale)
