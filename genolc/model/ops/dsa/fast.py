"""Fused sparse attention (DSA) in Triton: forward and backward read K/V rows by index, nothing gathered in memory.

Same contract as :func:`genolc.model.ops.dsa.reference.sparse_attention` (q ``[B, T, H, Dk]``, k ``[B, S, H, Dk]``,
v ``[B, S, H, Dv]``, indices ``[B, T, W]`` with -1 for empty slots, shared by all heads; a row with no valid slot
returns zeros). One program handles one (query, head): it walks the index row in blocks of ``BLOCK_W`` slots,
loads those key rows straight from ``k`` (256 contiguous bytes per row at Dk=128, bf16), and keeps an online
softmax in fp32; forward stores the log-sum-exp per (query, head) for backward.

Backward recomputes the probabilities from q, k and the stored log-sum-exp, accumulates dq in registers and adds
dk, dv into fp32 buffers with atomics (``[B, S, H, D]`` each; a key row picked by many queries gets many adds).

Why per-head rows and CUDA-core arithmetic: with per-head keys (the layer's non-absorbed MLA form) every gathered
key element serves exactly one (query, head) pair, two FLOPs per two bytes read, far below the H200's ~200 FLOP/byte
balance point, so the op is bound by gather bandwidth and tensor cores would not help. The absorbed MLA form (keys
shared by all heads) would let H query rows share one gathered tile; it needs a change of the layer's call.

This op never falls back to dense attention: bad shapes or dtypes raise ValueError. Triton is imported at call time.
"""

from __future__ import annotations

import functools

import torch

from genolc.model.ops.dsa.reference import _check_qkv

BLOCK_W = 64


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def sparse_fwd_kernel(q_ptr, k_ptr, v_ptr, idx_ptr, o_ptr, lse_ptr, softmax_scale,
                          sqb, sqt, sqh, skb, sks, skh, svb, svs, svh, sib, sit, sob, sot, soh, slb, slt,
                          WIDTH: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                          BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                          BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        b = tl.program_id(2).to(tl.int64)
        dk = tl.arange(0, BLOCK_DK)
        dv = tl.arange(0, BLOCK_DV)
        q = tl.load(q_ptr + b * sqb + t * sqt + h * sqh + dk, mask=dk < DK, other=0.0).to(tl.float32)
        q = q * softmax_scale
        m = float("-inf")
        l = 0.0
        acc = tl.zeros((BLOCK_DV,), dtype=tl.float32)
        for w0 in range(0, WIDTH, BLOCK):
            slots = w0 + tl.arange(0, BLOCK)
            rows = tl.load(idx_ptr + b * sib + t * sit + slots, mask=slots < WIDTH, other=-1).to(tl.int64)
            valid = rows >= 0
            safe = tl.where(valid, rows, 0)
            keys = tl.load(k_ptr + b * skb + safe[:, None] * sks + h * skh + dk[None, :],
                           mask=valid[:, None] & (dk[None, :] < DK), other=0.0).to(tl.float32)
            scores = tl.sum(keys * q[None, :], axis=1)
            scores = tl.where(valid, scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=0))
            # Guard exp(-inf - -inf) while no valid slot has been seen yet.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(scores - m_safe)
            alpha = tl.exp(m - m_safe)
            values = tl.load(v_ptr + b * svb + safe[:, None] * svs + h * svh + dv[None, :],
                             mask=valid[:, None] & (dv[None, :] < DV), other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * values, axis=0)
            l = l * alpha + tl.sum(p, axis=0)
            m = m_new
        has_any = l > 0.0
        out = tl.where(has_any, acc / tl.where(has_any, l, 1.0), 0.0)
        tl.store(o_ptr + b * sob + t * sot + h * soh + dv, out.to(o_ptr.dtype.element_ty), mask=dv < DV)
        # +inf for an empty row makes every recomputed probability exp(s - inf) = 0 in backward.
        lse = tl.where(has_any, m + tl.log(tl.where(has_any, l, 1.0)), float("inf"))
        tl.store(lse_ptr + b * slb + t * slt + h, lse)

    @triton.jit
    def sparse_bwd_kernel(q_ptr, k_ptr, v_ptr, idx_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr,
                          softmax_scale,
                          sqb, sqt, sqh, skb, sks, skh, svb, svs, svh, sib, sit, sdb, sdt, sdh, slb, slt,
                          sgkb, sgks, sgkh, sgvb, sgvs, sgvh,
                          WIDTH: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                          BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                          BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        b = tl.program_id(2).to(tl.int64)
        dk = tl.arange(0, BLOCK_DK)
        dv = tl.arange(0, BLOCK_DV)
        q = tl.load(q_ptr + b * sqb + t * sqt + h * sqh + dk, mask=dk < DK, other=0.0).to(tl.float32)
        d_out = tl.load(do_ptr + b * sdb + t * sdt + h * sdh + dv, mask=dv < DV, other=0.0).to(tl.float32)
        lse = tl.load(lse_ptr + b * slb + t * slt + h)
        delta = tl.load(delta_ptr + b * slb + t * slt + h)
        d_q = tl.zeros((BLOCK_DK,), dtype=tl.float32)
        for w0 in range(0, WIDTH, BLOCK):
            slots = w0 + tl.arange(0, BLOCK)
            rows = tl.load(idx_ptr + b * sib + t * sit + slots, mask=slots < WIDTH, other=-1).to(tl.int64)
            valid = rows >= 0
            safe = tl.where(valid, rows, 0)
            key_mask = valid[:, None] & (dk[None, :] < DK)
            value_mask = valid[:, None] & (dv[None, :] < DV)
            keys = tl.load(k_ptr + b * skb + safe[:, None] * sks + h * skh + dk[None, :],
                           mask=key_mask, other=0.0).to(tl.float32)
            values = tl.load(v_ptr + b * svb + safe[:, None] * svs + h * svh + dv[None, :],
                             mask=value_mask, other=0.0).to(tl.float32)
            scores = tl.sum(keys * q[None, :], axis=1) * softmax_scale
            p = tl.where(valid, tl.exp(scores - lse), 0.0)
            d_p = tl.sum(values * d_out[None, :], axis=1)
            d_s = p * (d_p - delta) * softmax_scale
            d_q += tl.sum(d_s[:, None] * keys, axis=0)
            tl.atomic_add(dk_ptr + b * sgkb + safe[:, None] * sgks + h * sgkh + dk[None, :],
                          d_s[:, None] * q[None, :], mask=key_mask, sem="relaxed")
            tl.atomic_add(dv_ptr + b * sgvb + safe[:, None] * sgvs + h * sgvh + dv[None, :],
                          p[:, None] * d_out[None, :], mask=value_mask, sem="relaxed")
        tl.store(dq_ptr + b * sqb + t * sqt + h * sqh + dk, d_q.to(dq_ptr.dtype.element_ty), mask=dk < DK)

    return sparse_fwd_kernel, sparse_bwd_kernel


def _block(dim: int) -> int:
    import triton

    return max(16, triton.next_power_of_2(dim))


def sparse_attention_forward(q, k, v, indices, softmax_scale):
    """Forward only: returns ``(out [B, T, H, Dv] in v's dtype, lse [B, T, H] fp32)``."""
    fwd, _ = _kernels()
    batch, seq_len, heads, qk_dim = q.shape
    value_dim = v.shape[-1]
    out = torch.empty(batch, seq_len, heads, value_dim, dtype=v.dtype, device=q.device)
    lse = torch.empty(batch, seq_len, heads, dtype=torch.float32, device=q.device)
    if seq_len == 0:
        return out, lse
    fwd[(seq_len, heads, batch)](
        q, k, v, indices, out, lse, softmax_scale,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), indices.stride(0), indices.stride(1),
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        WIDTH=indices.shape[-1], DK=qk_dim, DV=value_dim, BLOCK_DK=_block(qk_dim), BLOCK_DV=_block(value_dim),
        BLOCK=BLOCK_W, num_warps=4)
    return out, lse


class SparseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, indices, softmax_scale):
        out, lse = sparse_attention_forward(q, k, v, indices, softmax_scale)
        ctx.save_for_backward(q, k, v, indices, out, lse)
        ctx.softmax_scale = softmax_scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        _, bwd = _kernels()
        q, k, v, indices, out, lse = ctx.saved_tensors
        batch, seq_len, heads, qk_dim = q.shape
        value_dim = v.shape[-1]
        d_out = d_out.contiguous()
        delta = (out.float() * d_out.float()).sum(-1)               # [B, T, H] = rowsum(P * dP)
        d_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        d_k = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
        d_v = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
        if seq_len > 0:
            bwd[(seq_len, heads, batch)](
                q, k, v, indices, d_out, lse, delta, d_q, d_k, d_v, ctx.softmax_scale,
                q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                v.stride(0), v.stride(1), v.stride(2), indices.stride(0), indices.stride(1),
                d_out.stride(0), d_out.stride(1), d_out.stride(2), lse.stride(0), lse.stride(1),
                d_k.stride(0), d_k.stride(1), d_k.stride(2), d_v.stride(0), d_v.stride(1), d_v.stride(2),
                WIDTH=indices.shape[-1], DK=qk_dim, DV=value_dim, BLOCK_DK=_block(qk_dim),
                BLOCK_DV=_block(value_dim), BLOCK=BLOCK_W,
                num_warps=4)
        return d_q, d_k.to(k.dtype), d_v.to(v.dtype), None, None


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                     *, query_chunk: int | None = None, recompute: bool | None = None) -> torch.Tensor:
    """Drop-in for ``reference.sparse_attention`` on CUDA tensors (fused Triton forward and backward).

    Args as the reference; ``query_chunk`` and ``recompute`` are accepted for signature compatibility and ignored
    (the kernel never materialises gathered keys, and backward always recomputes probabilities from the stored
    log-sum-exp). Returns ``[B, T, H, Dv]`` in v's dtype.
    """
    if not (q.is_cuda and k.is_cuda and v.is_cuda and indices.is_cuda):
        raise ValueError("genolc.model.ops.dsa.fast needs CUDA tensors; use reference.sparse_attention on CPU")
    q, k, v, indices = prepare_inputs(q, k, v, indices)
    check_kernel_inputs(q, k, v, indices)
    return SparseAttention.apply(q, k, v, indices, softmax_scale)


KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def prepare_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the kernels are handed for the layer's ``(q, k, v, indices)``. Pure torch (CPU-runnable; the CPU
    tests check it).

    q, k, v get one dtype, as autocast would give attention's operands (the autocast dtype when it is on, else
    the widest); q is made contiguous because backward writes dq with q's strides into a contiguous buffer; k and
    v (the layer's split views of one projection) keep their strides unless the last one is not 1.
    """
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        common = torch.get_autocast_dtype(device_type)
    else:
        common = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q = q.to(common).contiguous()
    k, v = (t.to(common) for t in (k, v))
    k, v, indices = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v, indices))
    return q, k, v, indices


def check_kernel_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor) -> None:
    """ValueError unless the fused kernels can take these: shapes as the reference, q, k, v one dtype of
    ``KERNEL_DTYPES``, q contiguous, k and v with a contiguous last dimension, indices ``[B, T, W]`` int32/int64
    with a contiguous last dimension. Shared by :func:`sparse_attention` and the CPU tests."""
    _check_qkv(q, k, v)
    if indices.dim() != 3 or indices.shape[:2] != q.shape[:2]:
        raise ValueError(f"indices must be [B, T, W] with B, T of q {tuple(q.shape[:2])}, got {tuple(indices.shape)}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be int32 or int64, got {indices.dtype}")
    if q.dtype not in KERNEL_DTYPES or q.dtype != k.dtype or k.dtype != v.dtype:
        raise ValueError(f"q, k, v must share one dtype of {KERNEL_DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.is_contiguous():
        raise ValueError(f"q must be contiguous (backward writes dq with q's strides), got strides {q.stride()}")
    for name, tensor in (("k", k), ("v", v), ("indices", indices)):
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dimension, got strides {tensor.stride()}")
