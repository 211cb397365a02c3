"""The DSA indexer's training signal: KL from the main attention's mass per pool to the indexer's pool distribution.

The indexer's top-k selection has no gradient, so nothing in the language-model loss teaches it which keys matter.
Following DeepSeek-V3.2 (section 2.1) and Megatron-core's ``compute_dsa_indexer_loss``, generalised to k-pools:

For batch row ``b`` and query ``t`` let ``C(t)`` be the candidate pools and ``K(t)`` the keys the main attention
uses:

- ``"dense"`` (warm-up; the layer's main attention is dense causal): ``K(t) = [0, t]`` and ``C(t)`` = every complete
  causal pool, ``{p : (p + 1) * kpool <= t + 1}``.
- ``"sparse"`` (sparse training): ``K(t)`` = the tokens in the query's index row (selected pools and tail) and
  ``C(t)`` = the pools selected in that row.

With ``a_h(t, j) = softmax_{j in K(t)}(scale * q_h(t) . k_h(j))`` the main attention of head ``h`` (fp32):

    m(t, p)   = sum_h sum_{j in pool p} a_h(t, j)                       main attention mass of pool p, all heads
    pi(t, p)  = m(t, p) / sum_{p' in C(t)} m(t, p')                      target, L1-normalised over candidates
    rho(t, p) = softmax_{p in C(t)}(s(t, p))                             indexer distribution over the same pools
    KL(t)     = sum_{p in C(t)} pi(t, p) * (log(pi(t, p) + 1e-10) - log(rho(t, p) + 1e-10))
    loss      = mean of KL(t) over all rows (b, t) with a non-empty C(t)

where ``s(t, p)`` is the indexer score (``genolc.model.ops.indexer.reference.pool_scores``). Main-attention mass on
the query's tail tokens (not a candidate: always selected anyway) counts in each head's softmax but not in ``pi``.
The target carries no gradient (``main_q``/``main_k`` are detached here); gradients reach only the indexer's
queries, head weights and pool keys. No loss coefficient is applied.

At ``kpool = 1`` (every token its own pool, no tail) this is exactly Megatron-core 0.16.1's
``compute_dsa_indexer_loss(index_scores + causal_mask, topk_indices, q, k, scale, loss_coeff=1,
sparse_loss=(mode == "sparse"))``, whose mean runs over all ``B * T`` rows (all have a candidate at ``kpool = 1``).

Work and memory: the sparse target carries no gradient and is linear in T (``topk // kpool`` floats a query), so
it is computed once, without autograd, kept for the backward (``B * T * topk // kpool * 4`` bytes a layer, 2 KiB a
token at the presets' shapes) and not computed again; only the indexer's side (its pool scores and the KL) is
checkpointed and recomputed. The dense target (``[C, q_end // kpool]`` a chunk, quadratic in T over the window) is
computed inside the checkpoint instead, and again in the backward. Queries are taken in chunks for the indexer's
side (``[B, chunk, P, Di]`` gathered pool keys and ``[B, chunk, Hi, P]`` scores, sized near
``CHUNK_BUDGET_ELEMENTS``). The sparse target in MLA's absorbed form (``main_k`` one key head shared by all query
heads, the DSA layer's sparse path) is ``genolc.model.ops.dispatch.sparse_pool_mass``: on CUDA a Triton kernel that
gathers nothing into memory. Otherwise the target is taken in pieces whose logits or gathered keys hold about
``TARGET_BUDGET_ELEMENTS`` (``[B, piece, H, T]`` dense, ``[B, piece, W, H, D]`` or ``[B, piece, W, D]`` sparse).
The working set is about those budgets (at least one query each) plus the kept sparse targets. The sparse mode's
indexer side is ``genolc.model.ops.dispatch.sparse_indexer_kl``: on CUDA one fused Triton program per query each
way, which gathers nothing into memory, keeps 20 bytes a row besides its inputs and needs no checkpoint; elsewhere
the reference (``genolc.model.ops.indexer_kl.reference``), checkpointed. (Until 2026-12-04
one checkpointed chunk held both sides in either mode: the sparse mode took queries in pieces of ~62 at `small`'s
shapes, gathered their keys in torch and computed each target twice.)
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from genolc.model.ops import dispatch
from genolc.model.ops.indexer.layout import complete_pools_visible
from genolc.model.ops.indexer.reference import pool_scores
from genolc.model.ops.indexer_kl.reference import kl_rows

INDEXER_LOSS_MODES = ("dense", "sparse")
# 128M elements: at `small`'s and `base`'s shapes ~2,900 queries a chunk. With 1 << 25 (~745) the sparse loss's
# 32k-query call was bound by the host's launches (215 ms of wall for about 62 ms of kernels at 512k keys, H200,
# benchmarks/results/indexer_kl_2026-12-04/).
CHUNK_BUDGET_ELEMENTS = 1 << 27
TARGET_BUDGET_ELEMENTS = 1 << 26
# 64k query rows (over the batch): the fused sparse op's scratch of scores is then 128 MiB at 512 pool slots a row.
FUSED_QUERY_ROWS = 65536


def _dense_pool_mass(query_start: int, main_q: torch.Tensor, main_k: torch.Tensor, softmax_scale: float,
                     kpool: int, piece: int) -> torch.Tensor:
    """Main attention mass per complete pool ``[B, C, q_end // kpool]`` of the queries ``query_start ..`` of one
    chunk over their causal prefix ``main_k [B, q_end, H, D]``, ``piece`` queries at a time (no autograd)."""
    batch, chunk = main_q.shape[:2]
    q_end = query_start + chunk
    n_pools = q_end // kpool
    key_positions = torch.arange(q_end, device=main_q.device)
    masses = []
    for p0 in range(0, chunk, piece):
        p1 = min(chunk, p0 + piece)
        q = main_q[:, p0:p1].float()
        if main_k.shape[2] == 1:  # one key head shared by all query heads (MLA's absorbed form)
            logits = torch.einsum("bchd,bsd->bhcs", q, main_k[:, :, 0].float()) * softmax_scale
        else:
            logits = torch.einsum("bchd,bshd->bhcs", q, main_k.float()) * softmax_scale
        positions = torch.arange(query_start + p0, query_start + p1, device=main_q.device)
        probs = logits.masked_fill(key_positions[None, :] > positions[:, None], float("-inf")).softmax(dim=-1)
        mass = probs.sum(dim=1)  # [B, piece, q_end]
        masses.append(mass[..., : n_pools * kpool].reshape(batch, p1 - p0, n_pools, kpool).sum(dim=-1))
    return torch.cat(masses, dim=1)


def _sparse_pool_mass(main_q: torch.Tensor, main_k: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                      kpool: int, topk: int, piece: int, main_lse: torch.Tensor | None = None) -> torch.Tensor:
    """Main attention mass per selected pool slot ``[B, C, topk // kpool]`` of one chunk of queries restricted to
    their index rows ``indices [B, C, W]`` (no autograd). With one key head shared by all query heads (MLA's
    absorbed form, the DSA layer's sparse path) this is ``dispatch.sparse_pool_mass``, a Triton kernel on CUDA,
    which reads the attention's ``main_lse [B, C, H]`` when given; per-head keys are gathered ``piece`` queries at a
    time."""
    if main_k.shape[2] == 1:
        return dispatch.sparse_pool_mass(main_q, main_k[:, :, 0], indices, softmax_scale, kpool=kpool, topk=topk,
                                         query_chunk=piece, lse=main_lse).float()
    batch, chunk = main_q.shape[:2]
    batch_ids = torch.arange(batch, device=main_q.device)[:, None, None]
    masses = []
    for p0 in range(0, chunk, piece):
        p1 = min(chunk, p0 + piece)
        rows = indices[:, p0:p1].long()  # per piece: an int64 copy of the whole [B, T, W] is 16 GiB at 1M tokens
        valid = rows >= 0
        keys = main_k[batch_ids, rows.clamp_min(0)]  # [B, piece, W, H, D]
        logits = torch.einsum("bchd,bcwhd->bchw", main_q[:, p0:p1].float(), keys.float()) * softmax_scale
        del keys
        logits = logits.masked_fill(~valid[:, :, None, :], torch.finfo(logits.dtype).min)
        mass = (logits.softmax(dim=-1) * valid[:, :, None, :]).sum(dim=2)  # [B, piece, W]
        masses.append(mass[..., :topk].reshape(batch, p1 - p0, topk // kpool, kpool).sum(dim=-1))
    return torch.cat(masses, dim=1)


def _dense_chunk(query_start: int, main_q: torch.Tensor, main_k: torch.Tensor, index_q: torch.Tensor,
                 head_weights: torch.Tensor, pooled: torch.Tensor, softmax_scale: float, index_softmax_scale: float,
                 kpool: int, piece: int) -> tuple[torch.Tensor, torch.Tensor]:
    """KL of one chunk's queries (``query_start ..``) against every complete causal pool of their prefix
    ``main_k [B, q_end, H, D]``. The target is computed here, inside the checkpoint, and again in the backward: kept
    for it, the chunks' ``[C, q_end // kpool]`` targets would add up to ``T^2 / (2 kpool)`` floats."""
    with torch.no_grad():
        pool_mass = _dense_pool_mass(query_start, main_q, main_k, softmax_scale, kpool, piece)
    batch, chunk, n_pools = pool_mass.shape
    positions = torch.arange(query_start, query_start + chunk, device=index_q.device)
    visible = complete_pools_visible(positions, kpool)
    candidate = torch.arange(n_pools, device=index_q.device)[None, :] < visible[:, None]
    scores = pool_scores(index_q, head_weights, pooled[:, :n_pools], index_softmax_scale)
    kl, has_candidate = kl_rows(pool_mass, scores, candidate.expand(batch, -1, -1))
    return kl.sum(), has_candidate.sum()


def _sparse_chunk(pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor,
                  indices: torch.Tensor, index_softmax_scale: float, kpool: int,
                  topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """KL of one chunk's queries over the pools in their index rows ``indices [B, C, W]``; ``pool_mass``
    ``[B, C, topk // kpool]`` from :func:`_sparse_pool_mass`."""
    kl, has_pool = dispatch.sparse_indexer_kl(pool_mass, index_q, head_weights, pooled, indices, index_softmax_scale,
                                              kpool=kpool, topk=topk)
    return kl.sum(), has_pool.sum()


def default_chunks(mode: str, batch: int, keys_len: int, heads: int, qk_dim: int, key_heads: int,
                   index_heads: int, index_dim: int, kpool: int, width: int) -> tuple[int, int]:
    """``(query_chunk, target_piece)``: queries per checkpointed chunk of the indexer's side, whose pool keys,
    scores and softmax temporaries hold about ``CHUNK_BUDGET_ELEMENTS`` elements, and queries per piece of the
    target, whose gathered keys or logits hold about ``TARGET_BUDGET_ELEMENTS`` (each at least 1)."""
    pools = keys_len // kpool if mode == "dense" else width // kpool
    # A query's indexer side: its pools' fp32 keys (Di each), the per-head dots before and after the ReLU (2 Hi) and
    # about eight pool-sized fp32 temporaries of the scores, softmax and KL. Its target: three [H, keys] tensors
    # (logits, masked, probabilities), or the gathered key rows and three [H, W] ones.
    per_query_indexer = batch * pools * (index_dim + 2 * index_heads + 8)
    per_query_target = batch * (3 * heads * keys_len if mode == "dense" else width * (key_heads * qk_dim + 3 * heads))
    return (max(1, CHUNK_BUDGET_ELEMENTS // max(per_query_indexer, 1)),
            max(1, TARGET_BUDGET_ELEMENTS // max(per_query_target, 1)))


def window_kl_rows(batch: int, window_len: int, kpool: int) -> int:
    """Rows ``(b, t)`` of a ``[batch, window_len]`` window that have a candidate pool: ``t + 1 >= kpool``.

    In both modes a query has candidates exactly when it sees a complete pool (the selection keeps a visible pool
    whenever there is one), so this is the loss's denominator, known before any chunk of the window runs.
    """
    return batch * max(0, window_len - kpool + 1)


def indexer_kl_loss(mode: str, *, main_q: torch.Tensor, main_k: torch.Tensor, softmax_scale: float,
                    index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor,
                    index_softmax_scale: float, kpool: int, topk: int, indices: torch.Tensor | None = None,
                    main_lse: torch.Tensor | None = None, query_chunk: int | None = None,
                    target_piece: int | None = None, query_offset: int = 0,
                    row_count: int | None = None) -> torch.Tensor:
    """The indexer KL loss (see the module docstring for the formula), a scalar fp32 tensor.

    For one chunk of a window (queries at positions ``query_offset ..``; keys, pools and index rows cover the
    window up to the chunk's last query) pass the window's :func:`window_kl_rows` as ``row_count``: the result is
    then the chunk's share of the window's loss, and the chunks' shares add up to it.

    Args:
        mode: ``"dense"`` or ``"sparse"``.
        main_q: ``[B, T, H, Dk]`` main-attention queries (NoPE); detached here.
        main_k: ``[B, S, H, Dk]`` main-attention keys (``S = query_offset + T``), or ``[B, S, 1, Dk]`` one key head
            shared by every query
            head (MLA's absorbed form: ``main_q`` = q_lat, ``main_k`` = the latent; same scores, so the same
            loss, with an H-times smaller gather); detached here.
        softmax_scale: the main attention's scale.
        index_q: ``[B, T, Hi, Di]`` indexer queries.
        head_weights: ``[B, T, Hi]`` indexer head weights (times ``Hi ** -0.5``).
        pooled: ``[B, S // kpool, Di]`` indexer pool keys.
        index_softmax_scale: the indexer's scale inside the ReLU.
        kpool, topk: the indexer's pool size and token budget.
        indices: ``[B, T, W]`` the layer's index rows (layout of ``genolc.model.ops.indexer.reference``, absolute
            positions); required for ``"sparse"``.
        main_lse: ``[B, T, H]`` the main attention's natural-log log-sum-exp over each index row (+inf for a row
            with none), as its forward returned it; ``"sparse"`` with one key head only. The target then reads it
            instead of forming the softmax's normaliser again (one pass over the row less on CUDA).
        query_chunk: queries per chunk of the indexer's side (checkpointed on the reference path), target_piece:
            queries per piece of the no-grad target (defaults: :func:`default_chunks`, and ``FUSED_QUERY_ROWS`` over
            the batch for the fused sparse op; a piece never spans two chunks).
        query_offset: absolute position of the first query (0 for a whole window).
        row_count: the denominator (default: this call's rows with a candidate).
    """
    if mode not in INDEXER_LOSS_MODES:
        raise ValueError(f"indexer loss mode must be one of {INDEXER_LOSS_MODES}, got {mode!r}")
    batch, seq_len = main_q.shape[:2]
    keys_len = query_offset + seq_len
    if main_q.dim() != 4 or main_k.dim() != 4 or main_k.shape[2] not in (1, main_q.shape[2]) or (
            (main_k.shape[0], main_k.shape[1], main_k.shape[3]) != (batch, keys_len, main_q.shape[3])):
        raise ValueError(f"main_q must be [B, T, H, D] and main_k [B, offset + T, H or 1, D], got "
                         f"{tuple(main_q.shape)} and {tuple(main_k.shape)} (offset {query_offset})")
    batch, seq_len, heads, qk_dim = main_q.shape
    if index_q.dim() != 4 or index_q.shape[:2] != (batch, seq_len) or head_weights.shape != index_q.shape[:3]:
        raise ValueError(f"index_q must be [B={batch}, T={seq_len}, Hi, Di] and head_weights [B, T, Hi], got "
                         f"{tuple(index_q.shape)} and {tuple(head_weights.shape)}")
    if kpool < 1 or topk < kpool or topk % kpool:
        raise ValueError(f"topk ({topk}) must be a positive multiple of kpool ({kpool})")
    if pooled.shape != (batch, keys_len // kpool, index_q.shape[-1]):
        raise ValueError(f"pooled must be [B={batch}, (offset + T) // kpool={keys_len // kpool}, "
                         f"Di={index_q.shape[-1]}], got {tuple(pooled.shape)}")
    if mode == "sparse":
        if indices is None or indices.dim() != 3 or indices.shape[:2] != (batch, seq_len) or indices.shape[-1] < topk:
            got = None if indices is None else tuple(indices.shape)
            raise ValueError(f"sparse indexer loss needs indices [B={batch}, T={seq_len}, W >= {topk}], got {got}")
    if main_lse is not None and (mode != "sparse" or main_k.shape[2] != 1 or main_lse.shape != (batch, seq_len, heads)):
        raise ValueError(f"main_lse is the sparse attention's [B={batch}, T={seq_len}, H={heads}] log-sum-exp with one "
                         f"key head; got {tuple(main_lse.shape)} in {mode!r} mode with {main_k.shape[2]} key heads. "
                         f"Pass main_lse=None in dense mode or with per-head keys")
    main_q, main_k = main_q.detach(), main_k.detach()

    default_chunk, default_piece = default_chunks(mode, batch, keys_len, heads, qk_dim, main_k.shape[2],
                                                  index_q.shape[2], index_q.shape[3], kpool,
                                                  topk if indices is None else indices.shape[-1])
    # The fused sparse op's backward forms the scores again from its inputs (a checkpoint would only run its
    # forward twice), and its scratch is K floats a query row: calls of FUSED_QUERY_ROWS rows.
    fused = mode == "sparse" and dispatch.fused_indexer_kl(index_q, head_weights, pooled)
    fused_chunk = max(1, FUSED_QUERY_ROWS // max(batch, 1))
    query_chunk = (fused_chunk if fused else default_chunk) if query_chunk is None else query_chunk
    target_piece = default_piece if target_piece is None else target_piece
    if query_chunk < 1 or target_piece < 1:
        raise ValueError(f"query_chunk and target_piece must be positive, got {query_chunk} and {target_piece}")
    recompute = not fused and torch.is_grad_enabled() and any(t.requires_grad for t in (index_q, head_weights,
                                                                                        pooled))

    total = torch.zeros((), dtype=torch.float32, device=main_q.device)
    rows = torch.zeros((), dtype=torch.long, device=main_q.device)
    if keys_len // kpool == 0:
        return total  # no complete pool anywhere: no row has a candidate
    for q0 in range(0, seq_len, query_chunk):
        q1 = min(seq_len, q0 + query_chunk)
        if mode == "dense":
            args = (query_offset + q0, main_q[:, q0:q1], main_k[:, :query_offset + q1], index_q[:, q0:q1],
                    head_weights[:, q0:q1], pooled, softmax_scale, index_softmax_scale, kpool, target_piece)
            fn = _dense_chunk
        else:
            # The sparse target is linear in T (topk // kpool floats a query): computed once, kept for the
            # backward as the checkpoint's input, not computed again there.
            with torch.no_grad():
                pool_mass = _sparse_pool_mass(main_q[:, q0:q1], main_k, indices[:, q0:q1], softmax_scale, kpool,
                                              topk, target_piece,
                                              None if main_lse is None else main_lse[:, q0:q1].detach())
            args = (pool_mass, index_q[:, q0:q1], head_weights[:, q0:q1], pooled, indices[:, q0:q1],
                    index_softmax_scale, kpool, topk)
            fn = _sparse_chunk
        kl_sum, n_rows = checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args)
        total = total + kl_sum
        rows = rows + n_rows
    if row_count is not None:
        return total / max(row_count, 1)
    return total / rows.clamp_min(1).to(total.dtype)
