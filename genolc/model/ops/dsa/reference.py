"""Sparse attention over indexer-selected keys (DSA), in pure torch.

Two forms of the same attention:

- :func:`sparse_latent_attention`, MLA's absorbed ("MQA") form, which the DSA layer runs: every head attends over
  the shared normalised latent rows ``c [B, S, R]`` (keys and values at once) with a query already multiplied into
  latent space, ``q_lat[h] = q[h] @ W_k[h]``; the layer maps the result back with ``W_v[h]``. Gathers
  ``[B, chunk, W, R]`` per query chunk, one row per slot for all heads.
- :func:`sparse_attention`, the per-head ("non-absorbed") form over keys ``[B, S, H, Dk]`` and values
  ``[B, S, H, Dv]``: the readable definition the latent form is tested against.

Each query ``t`` attends only to the key rows listed in ``indices[b, t]`` (-1 = empty slot), the same rows for every
head. Queries are processed in chunks: a chunk gathers ``[B, chunk, W, H, D]`` keys and values, never the
``[B, T, W, H, D]`` tensor for the whole sequence. With ``recompute`` (the default when gradients are needed) each
chunk's gathered tensors are rebuilt in the backward pass instead of being kept, so training memory stays
O(T * H * D) for activations plus O(T * W) for indices. Index rows may be int32 or int64; each chunk converts its
own rows (never the whole ``[B, T, W]`` tensor, 16 GiB as int64 at 1M tokens and W = 2051).

When every query selects all of its causal keys (a short sequence; see
``genolc.model.ops.indexer.layout.selects_all_causal``) the result equals ordinary causal attention, which
:func:`genolc.model.ops.dsa.dense.dense_causal_attention` computes with SDPA.

Queries are NoPE (no rotary embedding), as in GLM-5.3-Flash's MLA. A row with no selected key returns zeros.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

# Upper bound on the elements of one chunk's gathered keys + values when the chunk size is chosen automatically.
GATHER_BUDGET_ELEMENTS = 1 << 26


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
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
    safe = indices.long().clamp_min(0)
    batch_ids = torch.arange(q.shape[0], device=q.device)[:, None, None]
    keys = k[batch_ids, safe]  # [B, C, W, H, Dk]
    values = v[batch_ids, safe]  # [B, C, W, H, Dv]
    scores = torch.einsum("bchd,bcwhd->bchw", q, keys) * softmax_scale
    # finfo.min (not -inf) keeps rows with no valid slot finite; they are zeroed below.
    scores = scores.masked_fill(~valid[:, :, None, :], torch.finfo(scores.dtype).min)
    # At least fp32 (fp64 stays fp64: its finfo.min would overflow to -inf in fp32 and an empty row give NaN).
    probs = scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype)
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
    check_qkv(q, k, v)
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

    outputs = []
    for q0 in range(0, seq_len, query_chunk):
        q1 = min(seq_len, q0 + query_chunk)
        if recompute and needs_grad:
            out = checkpoint(_attend_chunk, q[:, q0:q1], k, v, indices[:, q0:q1], softmax_scale, use_reentrant=False)
        else:
            out = _attend_chunk(q[:, q0:q1], k, v, indices[:, q0:q1], softmax_scale)
        outputs.append(out)
    return torch.cat(outputs, dim=1)


def check_latent_inputs(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor) -> None:
    """ValueError unless q_lat ``[B, T, H, R]``, latent ``[B, S, R]`` and indices ``[B, T, W]`` int32/int64 agree."""
    if q_lat.dim() != 4 or latent.dim() != 3:
        raise ValueError(f"q_lat must be [B, T, H, R] and latent [B, S, R], got {tuple(q_lat.shape)} and "
                         f"{tuple(latent.shape)}")
    if q_lat.shape[0] != latent.shape[0] or q_lat.shape[-1] != latent.shape[-1]:
        raise ValueError(f"q_lat [B, T, H, R] and latent [B, S, R] disagree on B or R: {tuple(q_lat.shape)}, "
                         f"{tuple(latent.shape)}")
    if indices.dim() != 3 or indices.shape[:2] != q_lat.shape[:2]:
        raise ValueError(f"indices must be [B, T, W] with B, T of q_lat {tuple(q_lat.shape[:2])}, got "
                         f"{tuple(indices.shape)}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be int32 or int64, got {indices.dtype}")


def default_latent_query_chunk(batch: int, width: int, heads: int, rank: int) -> int:
    """A query chunk whose gathered latent rows plus scores hold at most ``GATHER_BUDGET_ELEMENTS`` elements."""
    per_query = batch * width * (rank + heads)
    return max(1, GATHER_BUDGET_ELEMENTS // max(per_query, 1))


def _attend_latent_chunk(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                         softmax_scale: float) -> torch.Tensor:
    """One query chunk: q_lat ``[B, C, H, R]``, latent ``[B, S, R]``, indices ``[B, C, W]`` -> ``[B, C, H, R]``."""
    rows, valid, scores = _latent_scores(q_lat, latent, indices, softmax_scale)   # one gathered row for every head
    # finfo.min (not -inf) keeps rows with no valid slot finite; they are zeroed below.
    scores = scores.masked_fill(~valid[:, :, None, :], torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(rows.dtype)
    probs = probs * valid.any(dim=-1)[:, :, None, None].to(probs.dtype)
    return torch.einsum("bchw,bcwr->bchr", probs, rows)


def sparse_latent_attention(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                            *, query_chunk: int | None = None, recompute: bool | None = None,
                            kept: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Absorbed-MLA sparse attention: every head of query ``t`` attends over the latent rows ``indices[b, t]``.

    With ``W = kv_b_proj.weight.view(H, Dk + Dv, R)``, ``q_lat[b, t, h] = q[b, t, h] @ W[h, :Dk]`` makes
    ``q_lat . c[s]`` equal ``q . k[s]`` exactly, and ``o_lat[b, t, h] @ W[h, Dk:].T`` equals the per-head output,
    so this is :func:`sparse_attention` with ``k = c @ W_k.T``, ``v = c @ W_v.T`` never formed.

    Args:
        q_lat: ``[B, T, H, R]`` queries in latent space.
        latent: ``[B, S, R]`` the shared normalised KV latent (keys and values of every head).
        indices: ``[B, T, W]`` int32 or int64 latent rows per query, ``-1`` for empty slots, shared by all heads;
            entries of one row distinct, each in ``[0, S)``.
        softmax_scale: multiplies ``q_lat . c`` before the softmax (the per-head ``Dk ** -0.5``).
        query_chunk: queries per chunk (default: see :func:`default_latent_query_chunk`).
        recompute: rebuild each chunk's gathered rows in backward rather than storing them (default: when
            gradients are being recorded).
        kept: ``(o_lat, lse)`` that :func:`sparse_latent_attention_forward` gave for these inputs in an earlier
            pass: returned as they are, nothing recomputed, with the gradient of that forward
            (:class:`KeptLatentAttention`).

    Returns:
        ``o_lat [B, T, H, R]`` in ``latent``'s dtype (softmax in fp32); a row with no valid slot gives zeros.
    """
    check_latent_inputs(q_lat, latent, indices)
    if kept is not None:
        check_kept(q_lat, *kept)
        return KeptLatentAttention.apply(q_lat, latent, indices, softmax_scale, *kept)
    batch, seq_len, heads, rank = q_lat.shape
    if query_chunk is None:
        query_chunk = default_latent_query_chunk(batch, indices.shape[-1], heads, rank)
    if query_chunk < 1:
        raise ValueError(f"query_chunk must be positive, got {query_chunk}")
    needs_grad = torch.is_grad_enabled() and (q_lat.requires_grad or latent.requires_grad)
    if recompute is None:
        recompute = needs_grad
    # Mixed inputs (a bf16 einsum output next to an fp32 norm output) meet in the wider dtype.
    common = torch.promote_types(q_lat.dtype, latent.dtype)
    q_lat, rows = q_lat.to(common), latent.to(common)

    outputs = []
    for q0 in range(0, seq_len, query_chunk):
        q1 = min(seq_len, q0 + query_chunk)
        if recompute and needs_grad:
            out = checkpoint(_attend_latent_chunk, q_lat[:, q0:q1], rows, indices[:, q0:q1], softmax_scale,
                             use_reentrant=False)
        else:
            out = _attend_latent_chunk(q_lat[:, q0:q1], rows, indices[:, q0:q1], softmax_scale)
        outputs.append(out)
    if not outputs:
        return q_lat.new_zeros(q_lat.shape, dtype=latent.dtype)
    return torch.cat(outputs, dim=1).to(latent.dtype)


def sparse_latent_attention_forward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                    softmax_scale: float, *, query_chunk: int | None = None
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward the kernels store (no gradient): ``(o_lat [B, T, H, R]`` in latent's dtype, ``lse [B, T, H]``
    fp32), lse the natural-log log-sum-exp of ``softmax_scale * q_lat . c`` over each row's valid slots and +inf for
    a row with none. ``o_lat`` equals :func:`sparse_latent_attention`'s."""
    check_latent_inputs(q_lat, latent, indices)
    batch, seq_len, heads, rank = q_lat.shape
    if query_chunk is None:
        query_chunk = default_latent_query_chunk(batch, indices.shape[-1], heads, rank)
    accum = torch.promote_types(torch.promote_types(q_lat.dtype, latent.dtype), torch.float32)
    out = torch.zeros(q_lat.shape, dtype=latent.dtype, device=q_lat.device)
    lse = torch.full((batch, seq_len, heads), float("inf"), dtype=torch.float32, device=q_lat.device)
    with torch.no_grad():
        for q0 in range(0, seq_len, query_chunk):
            q1 = min(seq_len, q0 + query_chunk)
            rows, valid, scores = _latent_scores(q_lat[:, q0:q1].to(accum), latent.to(accum), indices[:, q0:q1],
                                                 softmax_scale)
            row_lse = scores.logsumexp(dim=-1)
            has_any = valid.any(dim=-1)[:, :, None]
            probs = torch.where(has_any[..., None], (scores - row_lse[..., None]).exp(), 0)
            out[:, q0:q1] = torch.einsum("bchw,bcwr->bchr", probs, rows).to(out.dtype)
            lse[:, q0:q1] = torch.where(has_any, row_lse, float("inf")).float()
    return out, lse


def _latent_scores(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, softmax_scale: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One query chunk's gathered rows ``[B, C, W, R]``, slot mask ``[B, C, W]`` and scaled scores ``[B, C, H, W]``
    (-inf at empty slots)."""
    valid = indices >= 0
    batch_ids = torch.arange(q_lat.shape[0], device=q_lat.device)[:, None, None]
    rows = latent[batch_ids, indices.long().clamp_min(0)]
    scores = torch.einsum("bchr,bcwr->bchw", q_lat, rows) * softmax_scale
    return rows, valid, scores.masked_fill(~valid[:, :, None, :], float("-inf"))


def check_kept(q_lat: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """ValueError unless ``(out, lse)`` are a forward's outputs for queries shaped like ``q_lat``."""
    if out.shape != q_lat.shape or lse.shape != q_lat.shape[:3] or lse.dtype != torch.float32:
        raise ValueError(f"the kept forward must be o_lat {list(q_lat.shape)} and fp32 lse {list(q_lat.shape[:3])}, "
                         f"got {tuple(out.shape)} and {tuple(lse.shape)} {lse.dtype}")
    if out.device != q_lat.device or lse.device != q_lat.device:
        raise ValueError(f"the kept forward is on {out.device} / {lse.device}, the queries on {q_lat.device}")


def sparse_latent_attention_backward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                     out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                                     softmax_scale: float, *, query_chunk: int | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' backward from a stored forward, in torch: ``(d_q_lat, d_latent)`` in q_lat's and latent's
    dtypes. ``P = exp(scale * Q C^T - lse)``, ``delta = rowsum(O * dO)``, ``dS = P * (dO C^T - delta) * scale``,
    ``dQ = dS C``, ``dC[s] += dS[:, s]^T Q + P[:, s]^T dO`` (fp32 or wider throughout)."""
    batch, seq_len, heads, rank = q_lat.shape
    if query_chunk is None:
        query_chunk = default_latent_query_chunk(batch, indices.shape[-1], heads, rank)
    accum = torch.promote_types(torch.promote_types(q_lat.dtype, latent.dtype), torch.float32)
    d_q = torch.zeros(q_lat.shape, dtype=accum, device=q_lat.device)
    d_latent = torch.zeros(latent.shape, dtype=accum, device=latent.device)
    rows_all = latent.to(accum)
    for q0 in range(0, seq_len, query_chunk):
        q1 = min(seq_len, q0 + query_chunk)
        q = q_lat[:, q0:q1].to(accum)
        grad = d_out[:, q0:q1].to(accum)
        rows, valid, scores = _latent_scores(q, rows_all, indices[:, q0:q1], softmax_scale)
        probs = (scores - lse[:, q0:q1, :, None].to(accum)).exp()      # 0 at empty slots and for lse = +inf
        delta = (out[:, q0:q1].to(accum) * grad).sum(-1)
        d_scores = probs * (torch.einsum("bchr,bcwr->bchw", grad, rows) - delta[..., None]) * softmax_scale
        d_q[:, q0:q1] = torch.einsum("bchw,bcwr->bchr", d_scores, rows)
        d_rows = torch.einsum("bchw,bchr->bcwr", d_scores, q) + torch.einsum("bchw,bchr->bcwr", probs, grad)
        d_rows = d_rows * valid[..., None]
        safe = indices[:, q0:q1].long().clamp_min(0)
        d_latent.scatter_add_(1, safe.reshape(batch, -1, 1).expand(-1, -1, rank), d_rows.reshape(batch, -1, rank))
    return d_q.to(q_lat.dtype), d_latent.to(latent.dtype)


class KeptLatentAttention(torch.autograd.Function):
    """``apply(q_lat, latent, indices, softmax_scale, out, lse)``: a forward an earlier pass computed (``out``,
    ``lse``) returned as it is, with the gradient :func:`sparse_latent_attention_backward` computes from it."""

    @staticmethod
    def forward(ctx, q_lat, latent, indices, softmax_scale, out, lse):
        ctx.save_for_backward(q_lat, latent, indices, out, lse)
        ctx.softmax_scale = softmax_scale
        # A new tensor object over the kept storage: autograd attaches this op to it, not to the caller's tensor.
        return out.detach()

    @staticmethod
    def backward(ctx, d_out):
        q_lat, latent, indices, out, lse = ctx.saved_tensors
        d_q, d_latent = sparse_latent_attention_backward(q_lat, latent, indices, out, lse, d_out, ctx.softmax_scale)
        return d_q, d_latent, None, None, None, None


def check_pool_mass_lse(lse: torch.Tensor, q_lat: torch.Tensor) -> None:
    """ValueError unless ``lse`` can stand for the pool mass's own log-sum-exp: the attention forward's fp32
    natural-log ``lse``, ``[B, T, H]`` of ``q_lat``, on its device (a bf16 one would skew every head's mass)."""
    if tuple(lse.shape) != tuple(q_lat.shape[:3]) or lse.device != q_lat.device or lse.dtype != torch.float32:
        raise ValueError(f"lse must be the attention forward's [B, T, H] = {list(q_lat.shape[:3])} float32 tensor on "
                         f"{q_lat.device}, got {tuple(lse.shape)} {lse.dtype} on {lse.device}; pass the lse "
                         f"sparse_latent_attention_forward returned for these queries, or none")


def sparse_pool_mass(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, softmax_scale: float, *,
                     kpool: int, topk: int, query_chunk: int | None = None,
                     lse: torch.Tensor | None = None) -> torch.Tensor:
    """The sparse attention's mass on each selected pool, summed over heads, without autograd: the DSA indexer
    loss's target (``genolc.model.indexer_loss``).

    ``m[b, t, p] = sum_h sum_{j in slots p*kpool .. p*kpool + kpool - 1} a_h(t, j)`` with ``a_h(t, .)`` the softmax of
    ``softmax_scale * q_lat[b, t, h] . c[j]`` over all the row's valid slots (the tail slots after ``topk`` take part
    in the softmax, not in any pool). Empty slots, and every slot of a row with none valid, get no mass.

    Args:
        q_lat, latent, indices, softmax_scale: as :func:`sparse_latent_attention` (index rows in the layout of
            ``genolc.model.ops.indexer.layout``: ``topk // kpool`` pools of ``kpool`` slots, then the tail).
        kpool, topk: the indexer's pool size and token budget (``topk`` a multiple of ``kpool``, at most W).
        query_chunk: queries per piece (default :func:`default_latent_query_chunk`).
        lse: the attention forward's ``[B, T, H]`` natural-log log-sum-exp over each row's valid slots (+inf for a
            row with none), as :func:`sparse_latent_attention_forward` returns it; given, the softmax's normaliser
            is read rather than formed again (the Triton kernel then skips its first pass over the row).

    Returns:
        ``[B, T, topk // kpool]`` fp32 (fp64 for fp64 inputs), products and sums in at least fp32.
    """
    check_latent_inputs(q_lat, latent, indices)
    batch, seq_len, heads, rank = q_lat.shape
    if kpool < 1 or topk % kpool or not kpool <= topk <= indices.shape[-1]:
        raise ValueError(f"topk ({topk}) must be a positive multiple of kpool ({kpool}) and at most the index rows' "
                         f"width {indices.shape[-1]}")
    if lse is not None:
        check_pool_mass_lse(lse, q_lat)
    if query_chunk is None:
        query_chunk = default_latent_query_chunk(batch, indices.shape[-1], heads, rank)
    accum = torch.promote_types(torch.promote_types(q_lat.dtype, latent.dtype), torch.float32)
    masses = []
    with torch.no_grad():
        rows_all = latent.to(accum)
        for q0 in range(0, seq_len, query_chunk):
            q1 = min(seq_len, q0 + query_chunk)
            _, _, scores = _latent_scores(q_lat[:, q0:q1].to(accum), rows_all, indices[:, q0:q1], softmax_scale)
            if lse is None:
                row_lse = scores.logsumexp(dim=-1, keepdim=True)
            else:
                row_lse = lse[:, q0:q1, :, None].to(accum)
            # A row with no valid slot has lse = -inf here, +inf from the forward: its probabilities are set to 0,
            # not exp(nan).
            probs = torch.where(row_lse.isfinite(), (scores - row_lse).exp(), 0.0)
            mass = probs.sum(dim=2)[..., :topk]                                              # [B, C, topk]
            masses.append(mass.reshape(batch, q1 - q0, topk // kpool, kpool).sum(dim=-1))
    if not masses:
        return torch.zeros(batch, 0, topk // kpool, dtype=accum, device=q_lat.device)
    return torch.cat(masses, dim=1)
