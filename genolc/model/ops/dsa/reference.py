"""Sparse attention over indexer-selected keys (DSA), in pure torch, plus the dense causal fallback.

Each query ``t`` attends only to the key rows listed in ``indices[b, t]`` (-1 = empty slot), the same rows for every
head. Queries are processed in chunks: a chunk gathers ``[B, chunk, W, H, D]`` keys and values, never the
``[B, T, W, H, D]`` tensor for the whole sequence. With ``recompute`` (the default when gradients are needed) each
chunk's gathered tensors are rebuilt in the backward pass instead of being kept, so training memory stays
O(T * H * D) for activations plus O(T * W) for indices.

When every query selects all of its causal keys (a short sequence; see
``genolc.model.ops.indexer.reference.selects_all_causal``) the result equals ordinary causal attention, which
:func:`dense_causal_attention` computes with ``torch.nn.functional.scaled_dot_product_attention``.

Queries are NoPE (no rotary embedding), as in GLM-5.3-Flash's MLA. A row with no selected key returns zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# Upper bound on the elements of one chunk's gathered keys + values when the chunk size is chosen automatically.
GATHER_BUDGET_ELEMENTS = 1 << 26


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, T, H, D], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q [B, T, H, Dk], k [B, S, H, Dk] and v [B, S, H, Dv] disagree: {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")


def default_query_chunk(batch: int, width: int, heads: int, qk_dim: int, v_dim: int) -> int:
    """A query chunk whose gathered keys and values hold at most ``GATHER_BUDGET_ELEMENTS`` elements."""
    per_query = batch * width * heads * (qk_dim + v_dim)
    return max(1, GATHER_BUDGET_ELEMENTS // max(per_query, 1))


def _attend_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                  softmax_scale: float) -> torch.Tensor:
    """One query chunk: q ``[B, C, H, Dk]``, k/v ``[B, S, H, *]``, indices ``[B, C, W]`` -> ``[B, C, H, Dv]``."""
    valid = indices >= 0
    safe = indices.clamp_min(0)
    batch_ids = torch.arange(q.shape[0], device=q.device)[:, None, None]
    keys = k[batch_ids, safe]  # [B, C, W, H, Dk]
    values = v[batch_ids, safe]  # [B, C, W, H, Dv]
    scores = torch.einsum("bchd,bcwhd->bchw", q, keys) * softmax_scale
    # finfo.min (not -inf) keeps rows with no valid slot finite; they are zeroed below.
    scores = scores.masked_fill(~valid[:, :, None, :], torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(v.dtype)
    probs = probs * valid.any(dim=-1)[:, :, None, None].to(probs.dtype)
    return torch.einsum("bchw,bcwhd->bchd", probs, values)


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                     *, query_chunk: int | None = None, recompute: bool | None = None) -> torch.Tensor:
    """Attention of each query over its selected keys only.

    Args:
        q: ``[B, T, H, Dk]`` queries.
        k: ``[B, S, H, Dk]`` keys.
        v: ``[B, S, H, Dv]`` values.
        indices: ``[B, T, W]`` integer key positions per query, ``-1`` for empty slots; entries of one row must be
            distinct (the indexer guarantees it), each in ``[0, S)``.
        softmax_scale: multiplies ``q . k`` before the softmax.
        query_chunk: queries per chunk (default: see :func:`default_query_chunk`).
        recompute: rebuild each chunk's gathered keys/values in backward rather than storing them
            (default: when gradients are being recorded).

    Returns:
        ``[B, T, H, Dv]``, in ``v``'s dtype (softmax in fp32).
    """
    _check_qkv(q, k, v)
    if indices.dim() != 3 or indices.shape[:2] != q.shape[:2]:
        raise ValueError(f"indices must be [B, T, W] with B, T of q {tuple(q.shape[:2])}, got {tuple(indices.shape)}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be int32 or int64, got {indices.dtype}")
    batch, seq_len, heads, qk_dim = q.shape
    if query_chunk is None:
        query_chunk = default_query_chunk(batch, indices.shape[-1], heads, qk_dim, v.shape[-1])
    if query_chunk < 1:
        raise ValueError(f"query_chunk must be positive, got {query_chunk}")
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if recompute is None:
        recompute = needs_grad
    indices = indices.long()

    outputs = []
    for q0 in range(0, seq_len, query_chunk):
        q1 = min(seq_len, q0 + query_chunk)
        if recompute and needs_grad:
            out = checkpoint(_attend_chunk, q[:, q0:q1], k, v, indices[:, q0:q1], softmax_scale, use_reentrant=False)
        else:
            out = _attend_chunk(q[:, q0:q1], k, v, indices[:, q0:q1], softmax_scale)
        outputs.append(out)
    return torch.cat(outputs, dim=1)


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """Ordinary causal attention: q ``[B, T, H, Dk]``, k ``[B, T, H, Dk]``, v ``[B, T, H, Dv]`` -> ``[B, T, H, Dv]``.

    Query ``t`` sees keys ``0 .. t``. Equals :func:`sparse_attention` whenever every row selects all causal keys.

    Memory is O(T): SDPA's fused kernels never build the ``[T, T]`` score matrix, but they need one head size for
    q, k and v (otherwise SDPA falls back to its quadratic math path). When ``Dk != Dv`` the smaller side is
    zero-padded: zero query/key channels add nothing to ``q . k`` and zero value channels are cut off afterwards.
    """
    _check_qkv(q, k, v)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"causal attention needs as many keys as queries, got T={q.shape[1]} and S={k.shape[1]}")
    qk_dim, v_dim = q.shape[-1], v.shape[-1]
    if qk_dim < v_dim:
        q, k = F.pad(q, (0, v_dim - qk_dim)), F.pad(k, (0, v_dim - qk_dim))
    elif v_dim < qk_dim:
        v = F.pad(v, (0, qk_dim - v_dim))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         scale=softmax_scale)
    return out.transpose(1, 2)[..., :v_dim]

