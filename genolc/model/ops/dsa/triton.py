"""Fused sparse attention (DSA) in MLA's absorbed form, Triton forward and backward; nothing gathered in memory.

Same contract as :func:`genolc.model.ops.dsa.reference.sparse_latent_attention`: q_lat ``[B, T, H, R]``, the shared
latent ``c [B, S, R]`` (keys and values of every head), indices ``[B, T, W]`` int32/int64 with -1 for empty slots,
shared by all heads; a row with no valid slot returns zeros.

Forward: one program per (query t, batch b, head block). It holds the query's heads as the M dimension of
tensor-core dots, ``Q [BLOCK_H, BLOCK_R]`` (H padded to >= 16, R to a power of two, masked), and walks the index
row in blocks of ``BLOCK_W`` slots: gather ``C [BLOCK_W, BLOCK_R]`` by index, ``S = Q @ C.T`` in fp32, online
softmax per head row, ``acc += P @ C``. Stores ``o_lat`` and the natural-log log-sum-exp per head (+inf for an
empty row, so every recomputed probability there is exp(s - inf) = 0).

Backward: one program per (t, b, head block) recomputes ``P = exp(S * scale - lse)``, computes
``delta = rowsum(O * dO)`` itself in fp32 (no [B, T, H] fp32 copies of O and dO), ``dP = dO @ C.T``,
``dS = P * (dP - delta) * scale``, ``dQ += dS @ C`` in registers and ``dC = dS.T @ Q + P.T @ dO`` for the block's
rows, added with fp32 atomics into ``[B, S, R]`` (one atomic row per (query, slot), not per head), cast to the
latent's dtype at the end.

Costs (T queries, W slots, H heads, R latent rank): forward ~4*T*W*H*R FLOPs (S and P @ C), backward ~10*T*W*H*R
(S, dP, dQ, two dC products), gathered bytes T*W*R*2 per pass (bf16) plus T*W*R*4 of fp32 atomics in backward.

Tile choices: ``BLOCK_H`` = H padded to a power of two >= 16 (tl.dot's minimum M) and capped at 32 so 64-head
configs split into head blocks instead of holding a 64 x 512 fp32 accumulator. Forward ``BLOCK_W`` = 64 slots for
``BLOCK_R <= 256`` and 32 at 512 (base R = 384 pads to 512), num_warps = 4 / 8: the gathered tile stays at 16K
elements. Backward keeps Q, dO, the dQ accumulator and a ``[BLOCK_W, BLOCK_R]`` fp32 dC tile live at once, so it
uses ``BLOCK_W`` = 32 (16 at ``BLOCK_R`` = 512) and num_warps = 8 to keep that under ~128 fp32 registers a thread.

Offsets are int64 (``T * H * R`` passes 2^31 at 1M tokens for base). fp32 inputs use IEEE dots (no TF32), bf16/fp16
inputs the tensor cores with fp32 accumulation. This op never falls back to dense attention or to the reference:
bad shapes, dtypes or layouts raise ValueError. Triton is imported at call time.

Only NoPE MLA is supported (``ModelConfig`` rejects ``qk_rope_head_dim > 0`` for DSA layers): with rotary dims the
keys would not factor through the latent and a per-head path would be needed again.
"""

from __future__ import annotations

import functools

import torch

from genolc.model.ops.dsa.reference import check_kept, check_latent_inputs, check_pool_mass_lse

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_BLOCK_H = 32


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def latent_fwd_kernel(q_ptr, c_ptr, idx_ptr, o_ptr, lse_ptr, softmax_scale,
                          seq_len, scb, scs, sib, sit,
                          HEADS: tl.constexpr, RANK: tl.constexpr, WIDTH: tl.constexpr,
                          BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
                          PRECISION: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        b = tl.program_id(1).to(tl.int64)
        heads = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
        ranks = tl.arange(0, BLOCK_R)
        head_ok = heads < HEADS
        rank_ok = ranks < RANK
        # q_lat, o_lat [B, T, H, R] and lse [B, T, H] are contiguous (prepare_inputs / fresh buffers).
        row = b * seq_len + t
        tile = row * HEADS * RANK + heads[:, None].to(tl.int64) * RANK + ranks[None, :]
        tile_ok = head_ok[:, None] & rank_ok[None, :]
        q = tl.load(q_ptr + tile, mask=tile_ok, other=0.0)
        m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
        l = tl.zeros((BLOCK_H,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_H, BLOCK_R), dtype=tl.float32)
        for w0 in range(0, WIDTH, BLOCK_W):
            slots = w0 + tl.arange(0, BLOCK_W)
            rows = tl.load(idx_ptr + b * sib + t * sit + slots, mask=slots < WIDTH, other=-1).to(tl.int64)
            valid = rows >= 0
            safe = tl.where(valid, rows, 0)
            kv = tl.load(c_ptr + b * scb + safe[:, None] * scs + ranks[None, :],
                         mask=valid[:, None] & rank_ok[None, :], other=0.0)
            scores = tl.dot(q, tl.trans(kv), input_precision=PRECISION) * softmax_scale
            scores = tl.where(valid[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            # Guard exp(-inf - -inf) while a head row has seen no valid slot yet.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(scores - m_safe[:, None])
            alpha = tl.exp(m - m_safe)
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv, input_precision=PRECISION)
            m = m_new
        has_any = l > 0.0
        out = tl.where(has_any[:, None], acc / tl.where(has_any, l, 1.0)[:, None], 0.0)
        tl.store(o_ptr + tile, out.to(o_ptr.dtype.element_ty), mask=tile_ok)
        lse = tl.where(has_any, m + tl.log(tl.where(has_any, l, 1.0)), float("inf"))
        tl.store(lse_ptr + row * HEADS + heads, lse, mask=head_ok)

    @triton.jit
    def latent_bwd_kernel(q_ptr, c_ptr, idx_ptr, o_ptr, do_ptr, lse_ptr, dq_ptr, dc_ptr, softmax_scale,
                          seq_len, scb, scs, sib, sit, sgb, sgs,
                          HEADS: tl.constexpr, RANK: tl.constexpr, WIDTH: tl.constexpr,
                          BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
                          PRECISION: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        b = tl.program_id(1).to(tl.int64)
        heads = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
        ranks = tl.arange(0, BLOCK_R)
        head_ok = heads < HEADS
        rank_ok = ranks < RANK
        row = b * seq_len + t
        tile = row * HEADS * RANK + heads[:, None].to(tl.int64) * RANK + ranks[None, :]
        tile_ok = head_ok[:, None] & rank_ok[None, :]
        q = tl.load(q_ptr + tile, mask=tile_ok, other=0.0)
        d_out = tl.load(do_ptr + tile, mask=tile_ok, other=0.0)
        out = tl.load(o_ptr + tile, mask=tile_ok, other=0.0)
        delta = tl.sum(out.to(tl.float32) * d_out.to(tl.float32), axis=1)  # rowsum(P * dP) per head
        # Padded heads get lse = +inf: their probabilities are exactly 0.
        lse = tl.load(lse_ptr + row * HEADS + heads, mask=head_ok, other=float("inf"))
        d_q = tl.zeros((BLOCK_H, BLOCK_R), dtype=tl.float32)
        for w0 in range(0, WIDTH, BLOCK_W):
            slots = w0 + tl.arange(0, BLOCK_W)
            rows = tl.load(idx_ptr + b * sib + t * sit + slots, mask=slots < WIDTH, other=-1).to(tl.int64)
            valid = rows >= 0
            safe = tl.where(valid, rows, 0)
            row_mask = valid[:, None] & rank_ok[None, :]
            kv = tl.load(c_ptr + b * scb + safe[:, None] * scs + ranks[None, :], mask=row_mask, other=0.0)
            scores = tl.dot(q, tl.trans(kv), input_precision=PRECISION) * softmax_scale
            p = tl.where(valid[None, :], tl.exp(scores - lse[:, None]), 0.0)
            d_p = tl.dot(d_out, tl.trans(kv), input_precision=PRECISION)
            d_s = p * (d_p - delta[:, None]) * softmax_scale
            d_s_in = d_s.to(kv.dtype)
            d_q += tl.dot(d_s_in, kv, input_precision=PRECISION)
            d_kv = tl.dot(tl.trans(d_s_in), q, input_precision=PRECISION)
            d_kv += tl.dot(tl.trans(p.to(kv.dtype)), d_out, input_precision=PRECISION)
            tl.atomic_add(dc_ptr + b * sgb + safe[:, None] * sgs + ranks[None, :], d_kv, mask=row_mask,
                          sem="relaxed")
        tl.store(dq_ptr + tile, d_q.to(dq_ptr.dtype.element_ty), mask=tile_ok)

    return latent_fwd_kernel, latent_bwd_kernel


def next_power_of_2(n: int) -> int:
    """The smallest power of two at or above ``n`` (1 for ``n <= 1``): the kernels' tile extents."""
    return 1 << max(0, (n - 1).bit_length())


def tile_sizes(heads: int, rank: int) -> dict[str, int]:
    """The launch's tiles for H heads and latent rank R (see the module docstring for why these)."""
    block_h = min(MAX_BLOCK_H, max(16, next_power_of_2(heads)))
    block_r = max(16, next_power_of_2(rank))
    return {"BLOCK_H": block_h, "BLOCK_R": block_r,
            "fwd_block_w": 64 if block_r <= 256 else 32, "fwd_warps": 4 if block_r <= 256 else 8,
            "bwd_block_w": 32 if block_r <= 256 else 16, "bwd_warps": 8}


def _precision(dtype: torch.dtype) -> str:
    # tf32 is Triton's default for fp32 dots; "ieee" keeps fp32 inputs exact. Ignored for bf16/fp16 tiles.
    return "ieee" if dtype == torch.float32 else "tf32"


def sparse_latent_attention_forward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                    softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward only, on inputs that passed :func:`check_kernel_inputs`.

    Returns ``(o_lat [B, T, H, R] in q_lat's dtype, lse [B, T, H] fp32)``: the natural-log log-sum-exp of the
    scaled scores ``softmax_scale * q_lat . c`` over each row's valid slots, +inf for a row with none.
    """
    fwd, _ = _kernels()
    batch, seq_len, heads, rank = q_lat.shape
    out = torch.empty(q_lat.shape, dtype=q_lat.dtype, device=q_lat.device)
    lse = torch.empty(batch, seq_len, heads, dtype=torch.float32, device=q_lat.device)
    if seq_len == 0 or batch == 0:
        return out, lse
    tiles = tile_sizes(heads, rank)
    grid = (seq_len, batch, -(-heads // tiles["BLOCK_H"]))
    fwd[grid](q_lat, latent, indices, out, lse, softmax_scale, seq_len,
              latent.stride(0), latent.stride(1), indices.stride(0), indices.stride(1),
              HEADS=heads, RANK=rank, WIDTH=indices.shape[-1], BLOCK_H=tiles["BLOCK_H"],
              BLOCK_R=tiles["BLOCK_R"], BLOCK_W=tiles["fwd_block_w"], PRECISION=_precision(q_lat.dtype),
              num_warps=tiles["fwd_warps"])
    return out, lse


def sparse_latent_attention_backward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                     out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                                     softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of :func:`sparse_latent_attention_forward`: ``(d_q_lat [B, T, H, R], d_latent [B, S, R])``."""
    _, bwd = _kernels()
    batch, seq_len, heads, rank = q_lat.shape
    d_out = d_out.to(q_lat.dtype).contiguous()
    d_q = torch.empty(q_lat.shape, dtype=q_lat.dtype, device=q_lat.device)
    d_latent = torch.zeros(latent.shape, dtype=torch.float32, device=latent.device)
    if seq_len > 0 and batch > 0:
        tiles = tile_sizes(heads, rank)
        grid = (seq_len, batch, -(-heads // tiles["BLOCK_H"]))
        bwd[grid](q_lat, latent, indices, out, d_out, lse, d_q, d_latent, softmax_scale, seq_len,
                  latent.stride(0), latent.stride(1), indices.stride(0), indices.stride(1),
                  d_latent.stride(0), d_latent.stride(1),
                  HEADS=heads, RANK=rank, WIDTH=indices.shape[-1], BLOCK_H=tiles["BLOCK_H"],
                  BLOCK_R=tiles["BLOCK_R"], BLOCK_W=tiles["bwd_block_w"], PRECISION=_precision(q_lat.dtype),
                  num_warps=tiles["bwd_warps"])
    return d_q, d_latent.to(latent.dtype)


class SparseLatentAttention(torch.autograd.Function):
    """Autograd over a pair of sparse-latent-attention kernels; inputs must have passed :func:`check_kernel_inputs`.

    ``apply(q_lat, latent, indices, softmax_scale, kernels=TRITON_KERNELS)``: ``kernels`` is ``(forward,
    backward)`` with the contracts of :func:`sparse_latent_attention_forward` and
    :func:`sparse_latent_attention_backward` (the TileLang pair in ``tilelang.backward`` shares them).
    """

    @staticmethod
    def forward(ctx, q_lat, latent, indices, softmax_scale, kernels=None):
        forward_kernel, backward_kernel = kernels or TRITON_KERNELS
        out, lse = forward_kernel(q_lat, latent, indices, softmax_scale)
        ctx.save_for_backward(q_lat, latent, indices, out, lse)
        ctx.softmax_scale = softmax_scale
        ctx.backward_kernel = backward_kernel
        return out

    @staticmethod
    def backward(ctx, d_out):
        q_lat, latent, indices, out, lse = ctx.saved_tensors
        d_q, d_latent = ctx.backward_kernel(q_lat, latent, indices, out, lse, d_out, ctx.softmax_scale)
        return d_q, d_latent, None, None, None


TRITON_KERNELS = (sparse_latent_attention_forward, sparse_latent_attention_backward)


def with_kept_forward(kernels: tuple, q_lat: torch.Tensor, kept: tuple[torch.Tensor, torch.Tensor] | None) -> tuple:
    """``kernels`` with its forward replaced, when ``kept`` is given, by the ``(o_lat, lse)`` an earlier pass's
    forward kernel left for these inputs (checked against ``q_lat`` as the kernels take it): the op then runs only
    its backward."""
    if kept is None:
        return kernels
    out, lse = kept
    check_kept(q_lat, out, lse)
    if out.dtype != q_lat.dtype or not out.is_contiguous() or not lse.is_contiguous():
        raise ValueError(f"the kept o_lat must be contiguous {q_lat.dtype} like the kernels' queries, and lse "
                         f"contiguous; got {out.dtype}")

    def kept_forward(*_inputs):
        # A new tensor object over the kept storage: autograd attaches the op to it, not to the caller's tensor.
        return out.detach(), lse

    return kept_forward, kernels[1]


def sparse_latent_attention(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                            *, query_chunk: int | None = None, recompute: bool | None = None,
                            kept: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Drop-in for ``reference.sparse_latent_attention`` on CUDA tensors (fused Triton forward and backward).

    Args as the reference; ``query_chunk`` and ``recompute`` are accepted for signature compatibility and ignored
    (the kernels gather nothing into memory, and backward recomputes probabilities from the stored log-sum-exp).
    ``kept``: :func:`sparse_latent_attention_forward`'s outputs for these inputs from an earlier pass (returned, only
    the backward runs). Returns ``o_lat [B, T, H, R]`` in the kernels' common dtype (see :func:`prepare_inputs`).
    """
    if not (q_lat.is_cuda and latent.is_cuda and indices.is_cuda):
        raise ValueError("genolc.model.ops.dsa.triton needs CUDA tensors; use reference.sparse_latent_attention on CPU")
    q_lat, latent, indices = prepare_inputs(q_lat, latent, indices)
    check_kernel_inputs(q_lat, latent, indices)
    return SparseLatentAttention.apply(q_lat, latent, indices, softmax_scale,
                                       with_kept_forward(TRITON_KERNELS, q_lat, kept))


def prepare_inputs(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the kernels are handed for the layer's ``(q_lat, latent, indices)``. Pure torch (CPU-runnable; the CPU
    tests check it).

    q_lat and latent get one dtype, as autocast would give attention's operands (the autocast dtype when it is on,
    else the wider of the two: under autocast the layer's latent comes out of an fp32-weighted RMSNorm next to a
    bf16 q_lat), and are made contiguous (both are fresh per-layer tensors, so this is normally free); indices keep
    their dtype and strides unless the last stride is not 1.
    """
    device_type = q_lat.device.type
    if torch.is_autocast_enabled(device_type):
        common = torch.get_autocast_dtype(device_type)
    else:
        common = torch.promote_types(q_lat.dtype, latent.dtype)
    q_lat = q_lat.to(common).contiguous()
    latent = latent.to(common).contiguous()
    if indices.dim() > 0 and indices.stride(-1) != 1:
        indices = indices.contiguous()
    return q_lat, latent, indices


def check_kernel_inputs(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor) -> None:
    """ValueError unless the fused kernels can take these: shapes as the reference, q_lat and latent one dtype of
    ``KERNEL_DTYPES`` and contiguous, indices ``[B, T, W]`` int32/int64 with a contiguous last dimension. Shared by
    :func:`sparse_latent_attention` and the CPU tests."""
    check_latent_inputs(q_lat, latent, indices)
    if q_lat.dtype not in KERNEL_DTYPES or q_lat.dtype != latent.dtype:
        raise ValueError(f"q_lat and latent must share one dtype of {KERNEL_DTYPES}, got {q_lat.dtype} and "
                         f"{latent.dtype}")
    if not q_lat.is_contiguous() or not latent.is_contiguous():
        raise ValueError(f"q_lat and latent must be contiguous, got strides {q_lat.stride()} and {latent.stride()}")
    if indices.stride(-1) != 1:
        raise ValueError(f"indices needs a contiguous last dimension, got strides {indices.stride()}")
    if q_lat.shape[-1] > 1024:
        raise ValueError(f"latent rank {q_lat.shape[-1]} exceeds the kernels' 1024 (one register tile per row)")


# The pool mass's (slots a step, warps) when set; benchmarks/bench_indexer_kl.py --pool-mass-launch times others.
POOL_MASS_LAUNCH: tuple[int, int] | None = None
# 64 slots a step at every rank, with the forward's warps. On the H200, 64k queries over 512k keys given the lse
# (benchmarks/results/indexer_kl_lse_2026-12-05/call6_e00ec37/): `base` (R = 384, padded to 512) 25.6 ms against
# 36.2 at the forward's 32 slots, the same at 4 warps and 128 slots 31.6; `small` 13.6 ms at 64 slots and 4 warps,
# 13.9 at 8, 13.6 at 128 slots, 20.0 at 32.
POOL_MASS_BLOCK_W = 64


def pool_mass_launch(heads: int, rank: int) -> tuple[int, int]:
    """The pool mass kernel's (``BLOCK_W``, warps) for H heads and latent rank R."""
    if POOL_MASS_LAUNCH is not None:
        return POOL_MASS_LAUNCH
    return POOL_MASS_BLOCK_W, tile_sizes(heads, rank)["fwd_warps"]


@functools.cache
def _pool_mass_kernel():
    from genolc.model.ops.dsa import pool_mass_kernel

    return pool_mass_kernel.pool_mass_kernel


def pool_mass_unsupported(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, kpool: int) -> str | None:
    """Why :func:`sparse_pool_mass` cannot take these operands (None when it can): tensors that
    :func:`check_kernel_inputs` accepts (on CUDA, or on CPU under Triton's interpreter), and a pool size that is a
    power of two up to the kernel's slot block."""
    try:
        check_kernel_inputs(q_lat, latent, indices)
    except ValueError as error:
        return str(error)
    block_w, _ = pool_mass_launch(q_lat.shape[2], q_lat.shape[3])
    if kpool & (kpool - 1) or kpool > block_w:
        return f"kpool {kpool} (a power of two up to {block_w})"
    return None


def sparse_pool_mass(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, softmax_scale: float, *,
                     kpool: int, topk: int, lse: torch.Tensor | None = None) -> torch.Tensor:
    """``reference.sparse_pool_mass`` in one Triton program per (query, batch row): a first pass over the index row
    finds each head's log-sum-exp as the forward kernel does (skipped when the attention forward's ``lse`` is
    given), a second over the pool slots adds each slot's probability over heads and each pool's ``kpool`` slots.
    Nothing is gathered into memory (the reference gathers ``[B, C, W, R]`` per piece). Operands as
    :func:`pool_mass_unsupported` accepts them (ValueError otherwise); returns ``[B, T, topk // kpool]`` fp32."""
    unsupported = pool_mass_unsupported(q_lat, latent, indices, kpool)
    if unsupported:
        raise ValueError(f"the Triton pool mass does not take {unsupported}; use reference.sparse_pool_mass")
    if topk % kpool or not kpool <= topk <= indices.shape[-1]:
        raise ValueError(f"topk ({topk}) must be a positive multiple of kpool ({kpool}) and at most the index rows' "
                         f"width {indices.shape[-1]}")
    batch, seq_len, heads, rank = q_lat.shape
    if lse is not None:
        check_pool_mass_lse(lse, q_lat)
        lse = lse.contiguous()
    out = torch.zeros(batch, seq_len, topk // kpool, dtype=torch.float32, device=q_lat.device)
    if seq_len == 0 or batch == 0:
        return out
    tiles = tile_sizes(heads, rank)
    block_w, warps = pool_mass_launch(heads, rank)
    _pool_mass_kernel()[(seq_len, batch)](
        q_lat, latent, indices, out if lse is None else lse, out, softmax_scale, seq_len,
        latent.stride(0), latent.stride(1), indices.stride(0), indices.stride(1),
        HEADS=heads, RANK=rank, WIDTH=indices.shape[-1], TOPK=topk, KPOOL=kpool, BLOCK_H=tiles["BLOCK_H"],
        BLOCK_R=tiles["BLOCK_R"], BLOCK_W=block_w, PRECISION=_precision(q_lat.dtype),
        HAS_LSE=lse is not None, num_warps=warps)
    return out
