"""DeepSeek Sparse Attention (DSA): NoPE MLA attention over the keys a k-pool indexer selects.

GLM-5.3-Flash's "indexed_attention" layers. Parameter and submodule names match transformers'
``Glm5NextTextAttention`` / ``Glm5NextTextIndexer`` so state dicts map one to one:

    q_a_proj, q_a_layernorm, q_b_proj               query: hidden -> q_lora_rank (RMSNorm) -> H * qk_head_dim
    kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj   keys/values: hidden -> kv_lora_rank (RMSNorm) -> H * (Dk + Dv)
    o_proj                                          H * Dv -> hidden
    indexer.{wq_b, wk, k_norm, weights_proj,        the indexer ("full" layers only); its queries reuse the MLA
             index_kpool_compress_ape,              query latent ``q_resid``
             index_kpool_compress_gate}

``indexer_types[layer_idx]`` is ``"full"`` (run the indexer) or ``"shared"`` (no indexer; reuse the index rows of
the previous full layer, passed in as ``shared_indices``).

Sparse attention runs in MLA's absorbed ("MQA") form on every device: keys and values are the shared normalised
latent ``c = kv_a_layernorm(kv_a_proj_with_mqa(hidden)[..., :R]) [B, T, R]``; with
``W = kv_b_proj.weight.view(H, Dk + Dv, R)`` the queries move into latent space, ``q_lat = q @ W[:, :Dk]``
(``q_lat . c == q . k`` exactly), attention returns ``o_lat [B, T, H, R]`` and ``o_lat @ W[:, Dk:].T`` is the
per-head output. Per-head keys and values ``[B, T, H, D]`` are built only on the dense path (``indexer_loss="dense"``
or a sequence short enough that every query selects all causal keys), which runs SDPA. This needs NoPE
(``ModelConfig`` rejects ``qk_rope_head_dim > 0`` for DSA layers; rotary keys would not factor through ``c``).

The ops are module attributes (``select_op``, ``sparse_attention_op``, ``dense_attention_op``). Selection and sparse
attention default to ``genolc.model.ops.dispatch`` (``select_indices``, ``sparse_latent_attention``): the
pure-torch references for CPU tensors, the Triton kernels for CUDA tensors; no flag here chooses an implementation.
``sparse_attention_op`` has ``sparse_latent_attention``'s signature ``(q_lat, latent, indices, softmax_scale,
kept=None)``; ``sparse_attention_forward_op`` is ``sparse_latent_attention_forward`` (a pass that keeps its forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from genolc.model.cache import ATTENTION_LSE, ATTENTION_OUT, SELECTION, LayerCache, append_rows
from genolc.model.config import ModelConfig, ModelConfigError
from genolc.model.indexer_loss import INDEXER_LOSS_MODES, indexer_kl_loss, window_kl_rows
from genolc.model.layers.norm import RMSNorm
from genolc.model.ops.dispatch import select_indices, sparse_latent_attention, sparse_latent_attention_forward
from genolc.model.ops.dsa.dense import dense_causal_attention
from genolc.model.ops.indexer.layout import index_rows, index_width, selected_pools, selects_all_causal
from genolc.model.ops.indexer.pooling import pool_keys


@dataclass
class DSAOutput:
    """What a DSA layer returns.

    hidden: ``[B, T, D]`` the attention block's output (after ``o_proj``).
    indices: ``[B, T, W]`` index rows the layer attended with (-1 = empty): int32 on CUDA (the fast indexer's
        ``out_dtype``; half the memory of int64, 8 GiB at 1M tokens and W = 2051), int64 on CPU; a "shared" layer
        passes on the rows it was given, in their dtype. Pass them to the next "shared" layer. Under
        ``indexer_loss="dense"`` the attention was dense, but these are still the indexer's choice.
    indexer_kl: scalar indexer KL loss when ``indexer_loss`` was given and the layer has an indexer, else None.
    """

    hidden: torch.Tensor
    indices: torch.Tensor
    indexer_kl: torch.Tensor | None


@dataclass
class IndexerFeatures:
    """The indexer's differentiable intermediates for one sequence batch.

    queries: ``[B, T, Hi, Di]``; head_weights: ``[B, T, Hi]`` (times ``Hi ** -0.5``); pooled: ``[B, T // kpool, Di]``.
    """

    queries: torch.Tensor
    head_weights: torch.Tensor
    pooled: torch.Tensor


def index_dtype(device: torch.device) -> torch.dtype:
    """The dtype of DSA index rows on ``device``: int32 on CUDA (what the fast kernels take), int64 elsewhere (the
    reference ops' indexing dtype)."""
    return torch.int32 if device.type == "cuda" else torch.int64


def indexer_grad(indexer_loss: str | None):
    """The grad mode the indexer runs in: off without an ``indexer_loss`` mode (inference, LM-only training), as is
    otherwise; with a mode its inputs come through :func:`indexer_inputs` detached, so only its KL trains it."""
    return torch.set_grad_enabled(torch.is_grad_enabled() and indexer_loss is not None)


def indexer_inputs(indexer_loss: str | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` as the indexer reads them: detached under an ``indexer_loss`` mode (the LM loss never reaches
    the indexer, nor its KL the layers below)."""
    return tuple(t if indexer_loss is None else t.detach() for t in tensors)


class DSAIndexer(nn.Module):
    """The k-pool lightning indexer (``Glm5NextTextIndexer``'s parameters); see genolc/model/ops/indexer."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.index_n_heads
        self.head_dim = config.index_head_dim
        self.kpool = config.index_kpool
        self.topk = config.index_topk
        self.select_tail = config.index_kpool_always_select_tail
        self.softmax_scale = self.head_dim ** -0.5
        self.wq_b = nn.Linear(config.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(config.hidden_size, self.n_heads, bias=False)
        # transformers' initial values: no position bias; a gate weighing a pool's tokens by softmax(sum(hidden)).
        self.index_kpool_compress_ape = nn.Parameter(torch.zeros(self.kpool, self.head_dim))
        self.index_kpool_compress_gate = nn.Parameter(torch.ones(self.head_dim, config.hidden_size))

    def key_rows(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token indexer keys ``[B, T, Di]`` (normalised) and their pool gate logits ``[B, T, Di]``: what later
        positions read of ``hidden [B, T, D]`` (genolc/parallel/dsa_cp.py gathers them across ranks)."""
        return self.k_norm(self.wk(hidden)), nn.functional.linear(hidden, self.index_kpool_compress_gate)

    def pool(self, keys: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
        """``[B, T // kpool, Di]``: every complete pool of :meth:`key_rows` that start at a pool boundary."""
        return pool_keys(keys, gate_logits, self.index_kpool_compress_ape, self.kpool)

    def features(self, hidden: torch.Tensor, q_resid: torch.Tensor,
                 cache: LayerCache | None = None) -> IndexerFeatures:
        """hidden ``[B, T, D]`` and the MLA query latent q_resid ``[B, T, q_lora_rank]`` -> :class:`IndexerFeatures`.

        With ``cache`` (one chunk of a window) ``pooled`` covers every complete pool up to the chunk's last token:
        the earlier pools from ``cache.past["pooled"]``, the pool straddling the chunk's start completed from the
        keys and gate logits of its earlier tokens (``pool_tail_keys`` / ``pool_tail_gates``).
        """
        batch, seq_len = hidden.shape[:2]
        queries = self.wq_b(q_resid).view(batch, seq_len, self.n_heads, self.head_dim)
        keys, gate_logits = self.key_rows(hidden)
        head_weights = self.weights_proj(hidden).float() * self.n_heads ** -0.5
        if cache is None:
            return IndexerFeatures(queries, head_weights, self.pool(keys, gate_logits))
        keys = append_rows(cache.past.get("pool_tail_keys"), keys)
        gate_logits = append_rows(cache.past.get("pool_tail_gates"), gate_logits)
        new_pools = self.pool(keys, gate_logits)
        complete = new_pools.shape[1] * self.kpool
        cache.present["pooled"] = new_pools
        cache.present["pool_tail_keys"] = keys[:, complete:]
        cache.present["pool_tail_gates"] = gate_logits[:, complete:]
        return IndexerFeatures(queries, head_weights, append_rows(cache.past.get("pooled"), new_pools))


class DSAAttention(nn.Module):
    """``forward(hidden [B, T, D], shared_indices=None, indexer_loss=None) -> DSAOutput`` (training / prefill).

    No padding mask: a sequence is a whole window starting at position 0, or one chunk of a window whose earlier
    positions' rows come in a :class:`genolc.model.cache.LayerCache`.
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        if config.layer_types[layer_idx] != "indexed_attention":
            raise ModelConfigError(f"layer {layer_idx} is {config.layer_types[layer_idx]!r}, not 'indexed_attention'",
                                   where="DSAAttention")
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.softmax_scale = self.qk_head_dim ** -0.5
        self.topk = config.index_topk
        self.kpool = config.index_kpool
        self.select_tail = config.index_kpool_always_select_tail
        self.width = index_width(self.topk, self.kpool, self.select_tail)
        hidden, bias = config.hidden_size, config.attention_bias

        self.q_a_proj = nn.Linear(hidden, config.q_lora_rank, bias=bias)
        self.q_a_layernorm = RMSNorm(config.q_lora_rank, eps=config.rms_norm_eps)
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.num_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, config.kv_lora_rank + config.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, eps=config.rms_norm_eps)
        self.kv_b_proj = nn.Linear(config.kv_lora_rank,
                                   self.num_heads * (config.qk_nope_head_dim + self.v_head_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_head_dim, hidden, bias=bias)
        self.indexer = DSAIndexer(config) if config.indexer_types[layer_idx] == "full" else None

        self.select_op = select_indices
        self.sparse_attention_op = sparse_latent_attention
        self.sparse_attention_forward_op = sparse_latent_attention_forward
        self.dense_attention_op = dense_causal_attention

    def _select(self, features: IndexerFeatures, cache: LayerCache | None = None) -> torch.Tensor:
        options = {"out_dtype": index_dtype(features.queries.device)}
        if cache is not None:
            options.update(query_offset=cache.start, window_len=cache.window_len)
        with torch.no_grad():
            return self.select_op(features.queries.detach(), features.head_weights.detach(),
                                  features.pooled.detach(), kpool=self.kpool, topk=self.topk,
                                  select_tail=self.select_tail, softmax_scale=self.indexer.softmax_scale,
                                  **options)

    def _kept_rows(self, kept: torch.Tensor, cache: LayerCache, hidden: torch.Tensor) -> torch.Tensor:
        """The index rows of pools an earlier pass chose for this chunk (``cache.selection``), in ``_select``'s
        dtype."""
        expected = (hidden.shape[0], hidden.shape[1], self.topk // self.kpool)
        if tuple(kept.shape) != expected:
            raise ValueError(f"DSA layer {self.layer_idx}: the kept selection is {tuple(kept.shape)}, not "
                             f"[B, T, topk // kpool] = {list(expected)}")
        return index_rows(kept.to(hidden.device), query_offset=cache.start, kpool=self.kpool,
                          select_tail=self.select_tail, dtype=index_dtype(hidden.device))

    def _sparse_attention(self, q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                          cache: LayerCache | None, want_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(o_lat, lse)``, ``lse`` None unless known or ``want_lse``. With ``cache.attention`` (the forward an
        earlier pass over this chunk kept) only its gradient is left to compute, and with ``cache.keep_attention``
        outside autograd the forward's ``(o_lat, lse)`` go to ``cache.present`` for a later pass. ``want_lse`` (the
        sparse indexer loss's target reads it) runs the forward op and hands its outputs to the op as kept: the
        same kernels, the log-sum-exp in the open."""
        if cache is not None and cache.attention is not None:
            return (self.sparse_attention_op(q_lat, latent, indices, self.softmax_scale, kept=cache.attention),
                    cache.attention[1])
        if cache is not None and cache.keep_attention and not torch.is_grad_enabled():
            o_lat, lse = self.sparse_attention_forward_op(q_lat, latent, indices, self.softmax_scale)
            cache.present[ATTENTION_OUT], cache.present[ATTENTION_LSE] = o_lat, lse
            return o_lat, lse
        if want_lse:
            with torch.no_grad():
                kept = self.sparse_attention_forward_op(q_lat, latent, indices, self.softmax_scale)
            return self.sparse_attention_op(q_lat, latent, indices, self.softmax_scale, kept=kept), kept[1]
        return self.sparse_attention_op(q_lat, latent, indices, self.softmax_scale), None

    def latent_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        """The normalised latent ``c [B, T, R]`` of ``hidden [B, T, D]``: every key and value of these positions
        (genolc/parallel/dsa_cp.py gathers it across ranks)."""
        return self.kv_a_layernorm(self.kv_a_proj_with_mqa(hidden)[..., : self.kv_lora_rank])

    def _key_value_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj``'s weight split per head: ``W_k [H, Dk, R]`` and ``W_v [H, Dv, R]`` (views)."""
        weight = self.kv_b_proj.weight.view(self.num_heads, self.qk_head_dim + self.v_head_dim, self.kv_lora_rank)
        return weight[:, : self.qk_head_dim], weight[:, self.qk_head_dim:]

    def forward(self, hidden: torch.Tensor, shared_indices: torch.Tensor | None = None,
                indexer_loss: str | None = None, cache: LayerCache | None = None) -> DSAOutput:
        """Args:
            hidden: ``[B, T, D]`` normed input of the attention block.
            shared_indices: ``[B, T, W]`` index rows of the previous full layer; required by "shared" layers,
                ignored by "full" ones.
            indexer_loss: None (inference / LM-only training: the indexer runs without grad), ``"dense"`` (warm-up:
                dense causal main attention, KL trains the indexer) or ``"sparse"`` (sparse main attention, KL over
                the selected pools). With a mode the indexer sees detached inputs, so its KL trains only the
                indexer and the LM loss never reaches it.
            cache: ``hidden`` is one chunk of a window (genolc.model.cache): queries attend over the latent rows
                of the earlier positions in ``cache.past["latent"]`` too, index rows hold absolute positions, and
                ``indexer_kl`` is this chunk's share of the window's loss (None when ``cache.aux`` is off). Given
                ``cache.selection`` (the pools an earlier pass over this chunk chose), queries attend to those and
                the indexer runs only for its loss (not at all without an ``indexer_loss`` mode); with
                ``cache.keep_selection`` the layer writes the pools it attended to into ``cache.present``. Sparse
                attention's forward is kept and reused the same way (``keep_attention``, ``attention``).
        """
        if hidden.dim() != 3:
            raise ValueError(f"hidden must be [B, T, D], got {tuple(hidden.shape)}")
        if indexer_loss is not None and indexer_loss not in INDEXER_LOSS_MODES:
            raise ModelConfigError(f"unknown indexer_loss {indexer_loss!r}", where=f"DSA layer {self.layer_idx}",
                                   fix=f"use None or one of {', '.join(INDEXER_LOSS_MODES)}")
        batch, seq_len = hidden.shape[:2]
        start = 0 if cache is None else cache.start
        keys_len = start + seq_len

        q_resid = self.q_a_layernorm(self.q_a_proj(hidden))
        queries = self.q_b_proj(q_resid).view(batch, seq_len, self.num_heads, self.qk_head_dim)
        latent = self.latent_rows(hidden)                                                    # [B, T, R]
        if cache is not None:
            cache.present["latent"] = latent
            latent = append_rows(cache.past.get("latent"), latent)                           # [B, start + T, R]
            if latent.shape[1] != keys_len:
                raise ValueError(f"DSA layer {self.layer_idx}: the cache holds {latent.shape[1] - seq_len} latent "
                                 f"rows before a chunk starting at {start}")

        features = None
        if self.indexer is not None:
            kept = None if cache is None else cache.selection
            # With the pools an earlier pass chose, the indexer runs only for its own loss.
            if kept is None or indexer_loss is not None:
                with indexer_grad(indexer_loss):
                    features = self.indexer.features(*indexer_inputs(indexer_loss, hidden, q_resid), cache)
            indices = self._select(features, cache) if kept is None else self._kept_rows(kept, cache, hidden)
            if cache is not None and cache.keep_selection:
                cache.present[SELECTION] = selected_pools(indices, self.topk, self.kpool).to(torch.int32)
        else:
            if shared_indices is None:
                raise ValueError(f"DSA layer {self.layer_idx} is 'shared' and needs shared_indices from the previous "
                                 "full DSA layer")
            if shared_indices.shape != (batch, seq_len, self.width):
                raise ValueError(f"shared_indices must be [B={batch}, T={seq_len}, W={self.width}], got "
                                 f"{tuple(shared_indices.shape)}")
            indices = shared_indices

        wants_kl = features is not None and indexer_loss is not None and (cache is None or cache.aux)
        main_lse = None
        if indexer_loss == "dense" or selects_all_causal(keys_len, self.topk, self.kpool, self.select_tail):
            kv = self.kv_b_proj(latent).view(batch, keys_len, self.num_heads, -1)
            keys, values = kv.split([self.qk_head_dim, self.v_head_dim], dim=-1)
            attended = self.dense_attention_op(queries, keys, values, self.softmax_scale)
            main_q, main_k = queries, keys
        else:
            key_weight, value_weight = self._key_value_weights()
            q_lat = torch.einsum("bthd,hdr->bthr", queries, key_weight)
            o_lat, main_lse = self._sparse_attention(q_lat, latent, indices, cache, want_lse=wants_kl)
            attended = torch.einsum("bthr,hvr->bthv", o_lat, value_weight)
            # The KL's scores from the latent as one key head shared by all heads: equal to q . k.
            main_q, main_k = q_lat, latent[:, :, None, :]
        output = self.o_proj(attended.reshape(batch, seq_len, self.num_heads * self.v_head_dim))

        kl = None
        if wants_kl:
            window = {} if cache is None else {
                "query_offset": start, "row_count": window_kl_rows(batch, cache.window_len, self.kpool)}
            kl = indexer_kl_loss(indexer_loss, main_q=main_q, main_k=main_k, softmax_scale=self.softmax_scale,
                                 index_q=features.queries, head_weights=features.head_weights,
                                 pooled=features.pooled, index_softmax_scale=self.indexer.softmax_scale,
                                 kpool=self.kpool, topk=self.topk, indices=indices, main_lse=main_lse, **window)
        return DSAOutput(hidden=output, indices=indices, indexer_kl=kl)
