"""What the two TileLang backward kernels of the DSA sparse attention share (backward.py: one block per query;
backward_slabs.py: one block per (query, key slab)): their launch config, its default, their input checks, two
constants of their math and the TileLang macros of one step over a block of slots. Kept apart so that backward.py
can hand long key ranges to backward_slabs.py, which builds on these, without an import cycle."""

from dataclasses import dataclass

import torch

from genolc.model.ops.dsa.tilelang.forward import LOG2_E, check_inputs, padded_heads

# Finite stand-in for lse = +inf (log2 units): exp2(score - 2^30) underflows to exactly 0 for any finite score.
EMPTY_ROW_LSE = 2.0 ** 30
# Components per vector atomic (red.global.add.v4.f32): R must be a multiple of it (it is: R % 16 == 0).
ATOMIC_VECTOR = 4


@dataclass(frozen=True)
class BackwardConfig:
    """Launch shape of the backward: slots per step, pipeline depth of the gather, threads per block, and the number
    of rank slices the dC tile is computed and scattered in (fewer live fp32 registers per slice)."""

    block_slots: int = 32
    num_stages: int = 2
    threads: int = 128
    rank_parts: int = 2

    def check(self, rank: int) -> None:
        """ValueError unless every GEMM tiles: the ``[16, slots]``, ``[16, R]`` and ``[slots, R / rank_parts]``
        outputs split their N extent over the warps in MMA tiles of 8, and ``slots`` is a multiple of 16 (the K
        extent of ``dS @ C``)."""
        warps = self.threads // 32
        if self.threads not in (128, 256) or self.block_slots not in (32, 64):
            raise ValueError(f"threads must be 128/256 and block_slots 32/64, got {self}")
        if not 1 <= self.num_stages <= 3:
            raise ValueError(f"num_stages must be in [1, 3], got {self.num_stages}")
        if not 1 <= self.rank_parts <= 8 or rank % self.rank_parts != 0:
            raise ValueError(f"rank_parts must be in [1, 8] and divide R ({rank}), got {self.rank_parts}")
        part = rank // self.rank_parts
        if self.block_slots % (8 * warps) != 0 or part % (8 * warps) != 0:
            raise ValueError(f"block_slots ({self.block_slots}) and R / rank_parts ({part}) must be multiples of "
                             f"8 * warps = {8 * warps} for {self.threads} threads")

    def shared_bytes(self, heads: int, rank: int, itemsize: int = 2) -> int:
        """Shared memory the kernel asks for (Q, dO, gathered tiles, P and dS tiles, the fp32 dC slice)."""
        heads_pad = padded_heads(heads)
        return (2 * heads_pad * rank * itemsize + self.num_stages * self.block_slots * rank * itemsize
                + 2 * heads_pad * self.block_slots * itemsize + self.block_slots * (rank // self.rank_parts) * 4)


DEFAULT_BACKWARD_CONFIG = BackwardConfig()


def default_backward_config(rank: int) -> BackwardConfig:
    """32 slots, 2 stages, 128 threads, and the fewest rank slices of <= 128 columns: what ptxas (sm_90a, nvcc 13)
    compiles without spilling at R = 256 (2 slices, 182 registers) and R = 384 (3 slices, 254 registers; 1 slice
    spills 360 bytes, 64-slot blocks 452). Timed on the H200 against 13 other configs for `base` and 6 for `small`
    (benchmarks/results/dsa_backward_configs_2026-12-02.json, 32k queries over 512k keys, medians of 5): none was
    more than 0.6 % faster (`base` 79.6 ms, the nearest 79.3-80.1; `small` 52.3 ms, the others 52.0-52.8). With the
    keys cut to 32k, so that d_latent's fp32 rows and the gathered rows mostly stay in L2, the same kernel takes
    53.8 ms (`base`) and 32.1 ms (`small`): where its memory traffic lands, not the launch shape, sets its time."""
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


def slot_step_macros(heads_pad: int, block_slots: int, part: int, softmax_scale: float):
    """The TileLang macros both backward kernels run on one step of ``block_slots`` gathered latent rows:

    ``probabilities_and_dq(...)``: ``S = Q C^T`` and ``dP = dO C^T`` on tensor cores, ``P`` (masked by
    ``slot_valid``) and ``dS`` in place of them, both staged to shared memory in bf16, and ``dQ += dS C``;
    ``dc_slice(..., column)``: ``dC = dS^T Q + P^T dO`` for the ``part`` latent columns from ``column`` into the fp32
    fragment ``acc_dkv``, staged to ``dkv_shared`` for the kernel's own scatter.
    Imports TileLang when called (kernel build time only)."""
    import tilelang.language as T

    scale = float(softmax_scale)
    scale_log2 = scale * LOG2_E

    @T.macro
    def probabilities_and_dq(q_shared, do_shared, kv_shared, slot_valid, lse_log2, delta, scores, d_probs, p_shared,
                             ds_shared, acc_dq):
        T.gemm(q_shared, kv_shared, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullCol, clear_accum=True)
        T.gemm(do_shared, kv_shared, d_probs, transpose_B=True, policy=T.GemmWarpPolicy.FullCol, clear_accum=True)
        for h, j in T.Parallel(heads_pad, block_slots):
            scores[h, j] = T.if_then_else(slot_valid[j], T.exp2(scores[h, j] * scale_log2 - lse_log2[h]), 0)
        for h, j in T.Parallel(heads_pad, block_slots):
            d_probs[h, j] = scores[h, j] * (d_probs[h, j] - delta[h]) * scale
        T.copy(scores, p_shared)
        T.copy(d_probs, ds_shared)
        T.gemm(ds_shared, kv_shared, acc_dq, policy=T.GemmWarpPolicy.FullCol)

    @T.macro
    def dc_slice(q_shared, do_shared, p_shared, ds_shared, acc_dkv, dkv_shared, column):
        T.gemm(ds_shared, q_shared[0:heads_pad, column:column + part], acc_dkv, transpose_A=True,
               policy=T.GemmWarpPolicy.FullCol, clear_accum=True)
        T.gemm(p_shared, do_shared[0:heads_pad, column:column + part], acc_dkv, transpose_A=True,
               policy=T.GemmWarpPolicy.FullCol)
        T.copy(acc_dkv, dkv_shared)

    return probabilities_and_dq, dc_slice
