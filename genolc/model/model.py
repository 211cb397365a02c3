"""``GenomeLM``: the GLM-5.3-Flash text decoder over a genome vocabulary.

Layout (names match transformers' ``Glm5NextTextModel`` + ``lm_head`` so checkpoints map one to one):

    embed_tokens -> expand to hc_mult streams -> layers[i] -> mean over streams -> norm -> lm_head

Each decoder layer wraps two blocks in hyper-connections (``attn_hc``, ``ffn_hc``): the token mixer
(``self_attn``: KDA for "linear_attention", DSA for "indexed_attention") after ``input_layernorm``, then the
feed-forward (``mlp``: SwiGLU for "dense", MoE for "sparse") after ``post_attention_layernorm``. DSA layers whose
``indexer_types`` entry is "shared" reuse the index rows of the most recent "full" DSA layer.

The model is plain: no recompute, offload, kernel or parallelism switches here (genolc/train/apply.py applies them
from outside).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from genolc.model.cache import ChunkCache, LayerCache
from genolc.model.config import ModelConfig
from genolc.model.layers.dsa import DSAIndexer
from genolc.model.layers.kda import ForgetGate, KimiDeltaAttention
from genolc.model.layers.mhc import HyperConnection, collapse_streams, expand_streams
from genolc.model.layers.moe import Experts, MoE, SwiGLUMLP, TopKRouter
from genolc.model.layers.norm import GatedRMSNorm, RMSNorm

INDEXER_LOSS_MODES = (None, "dense", "sparse")


@dataclass
class ModelOutput:
    logits: torch.Tensor | None                                              # [B, T, V]; None if not asked for
    aux_losses: dict[str, torch.Tensor] = field(default_factory=dict)        # 'moe_balance', 'indexer_kl'
    tokens_per_expert: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [E] long


def _dsa_attention_class():
    # Imported on first use: the DSA layer is its own module and pulls in the indexer ops.
    from genolc.model.layers.dsa import DSAAttention

    return DSAAttention


class DecoderLayer(nn.Module):
    """One layer: ``forward(streams [B, T, N, D], shared_indices, indexer_loss, cache) -> (streams, indices,
    indexer_kl, moe_out)``; ``cache`` (genolc.model.cache.LayerCache): the streams are one chunk of a window."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attention_type = config.layer_types[layer_idx]
        self.mlp_type = config.mlp_layer_types[layer_idx]
        self.shares_indices = (self.attention_type == "indexed_attention"
                               and config.indexer_types[layer_idx] == "shared")
        if self.attention_type == "linear_attention":
            self.self_attn = KimiDeltaAttention(config, layer_idx)
        else:
            self.self_attn = _dsa_attention_class()(config, layer_idx)
        if self.mlp_type == "sparse":
            self.mlp = MoE(config)
        else:
            self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, config.swiglu_limit)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn_hc = HyperConnection(config)
        self.ffn_hc = HyperConnection(config)

    def forward(self, streams: torch.Tensor, shared_indices: torch.Tensor | None = None,
                indexer_loss: str | None = None, cache: LayerCache | None = None, routing_only: bool = False):
        """``routing_only``: the layer's output is not read (the last layer of a chunked step's fill pass). It runs
        its token mixer (whose cache entries later chunks read) and stops at its feed-forward's router, whose counts
        the window's balance loss needs: the streams it returns are those after the token mixer, and a MoE layer's
        output holds only its counts."""
        post, comb, block_in, streams = self.attn_hc(streams)
        block_in = self.input_layernorm(block_in)
        indices = indexer_kl = None
        if self.attention_type == "linear_attention":
            block_out = self.self_attn(block_in, cache=cache)
        else:
            dsa = self.self_attn(block_in, shared_indices=shared_indices if self.shares_indices else None,
                                 indexer_loss=indexer_loss, cache=cache)
            block_out, indices, indexer_kl = dsa.hidden, dsa.indices, dsa.indexer_kl
        streams = self.attn_hc.merge(block_out, post, comb, streams)
        if routing_only and self.mlp_type != "sparse":
            return streams, indices, indexer_kl, None

        post, comb, block_in, streams = self.ffn_hc(streams)
        block_in = self.post_attention_layernorm(block_in)
        if routing_only:
            return streams, indices, indexer_kl, self.mlp.routing_counts(block_in)
        moe_out = None
        if self.mlp_type == "sparse":
            moe_out = self.mlp(block_in, cache=cache)
            block_out = moe_out.hidden
        else:
            block_out = self.mlp(block_in)
        streams = self.ffn_hc.merge(block_out, post, comb, streams)
        return streams, indices, indexer_kl, moe_out


class GenomeLM(nn.Module):
    """``forward(input_ids [B, T], *, indexer_loss=None, cache=None, logits=True) -> ModelOutput``.

    ``cache`` (:class:`genolc.model.cache.ChunkCache`): ``input_ids`` are positions ``cache.start ..`` of a longer
    window; the logits equal those positions' logits of the whole window, and each auxiliary loss is this chunk's
    share of the window's (see genolc/model/cache.py).

    ``indexer_loss``: None (no indexer signal), ``"dense"`` (warm-up: dense attention, indexer KL) or
    ``"sparse"`` (sparse attention, indexer KL with the indexer detached from the LM loss); the modes are the DSA
    layer's. ``aux_losses['moe_balance']`` and ``aux_losses['indexer_kl']`` are means over the layers that have
    them (absent when no layer does); coefficients belong to the trainer.

    ``logits=False`` (a chunked step's fill pass, genolc/train/chunked.py, which keeps only what the chunk leaves in
    ``cache`` and its MoE counts): no logits (``ModelOutput.logits`` None), and the last layer stops at its router,
    its experts, merge and the LM head not run; ``aux_losses['moe_balance']`` then leaves that layer out.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, *, indexer_loss: str | None = None,
                cache: ChunkCache | None = None, logits: bool = True) -> ModelOutput:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T]; got {tuple(input_ids.shape)}")
        if indexer_loss not in INDEXER_LOSS_MODES:
            raise ValueError(f"indexer_loss must be one of {INDEXER_LOSS_MODES}; got {indexer_loss!r}")
        if cache is not None and (len(cache.layers) != len(self.layers)
                                  or cache.start + input_ids.shape[1] > cache.window_len):
            raise ValueError(f"the chunk cache has {len(cache.layers)} layers for a {len(self.layers)}-layer model, "
                             f"or positions {cache.start}..{cache.start + input_ids.shape[1]} run past its window "
                             f"of {cache.window_len}")
        streams = expand_streams(self.embed_tokens(input_ids), self.config.hc_mult)
        full_indices = None
        balance, indexer_kls, tokens_per_expert = [], [], {}
        last = len(self.layers) - 1
        for layer in self.layers:
            # Without logits nothing reads the last layer's output: it stops at its router (DecoderLayer.forward).
            stops = {} if logits or layer.layer_idx != last else {"routing_only": True}
            streams, indices, indexer_kl, moe_out = layer(
                streams, shared_indices=full_indices, indexer_loss=indexer_loss,
                cache=None if cache is None else cache.layers[layer.layer_idx], **stops)
            if indices is not None and not layer.shares_indices:
                full_indices = indices
            if indexer_kl is not None:
                indexer_kls.append(indexer_kl)
            if moe_out is not None:
                if moe_out.balance_loss is not None:
                    balance.append(moe_out.balance_loss)
                tokens_per_expert[layer.layer_idx] = moe_out.tokens_per_expert
        aux_losses = {}
        if balance:
            aux_losses["moe_balance"] = torch.stack(balance).mean()
        if indexer_kls:
            aux_losses["indexer_kl"] = torch.stack(indexer_kls).mean()
        output = self.lm_head(self.norm(collapse_streams(streams))) if logits else None
        return ModelOutput(logits=output, aux_losses=aux_losses, tokens_per_expert=tokens_per_expert)


def init_weights(model: GenomeLM) -> None:
    """Initialise like transformers' Glm5Next: normal(0, initializer_range) projections, FLA-style forget gate."""
    std = model.config.initializer_range
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, (RMSNorm, GatedRMSNorm)):
            nn.init.ones_(module.weight)
        elif isinstance(module, nn.LayerNorm) and module.elementwise_affine:
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, DSAIndexer):
            # transformers' initial values: no position bias; a gate weighing a pool's tokens by softmax(sum(hidden)).
            nn.init.zeros_(module.index_kpool_compress_ape)
            nn.init.ones_(module.index_kpool_compress_gate)
        elif isinstance(module, HyperConnection):
            nn.init.normal_(module.fn, std=0.02)
            nn.init.zeros_(module.base)
            nn.init.ones_(module.scale)
        elif isinstance(module, Experts):
            nn.init.normal_(module.gate_up_proj, std=std)
            nn.init.normal_(module.down_proj, std=std)
        elif isinstance(module, TopKRouter):
            nn.init.normal_(module.weight, std=std)
            nn.init.zeros_(module.e_score_correction_bias)
    for module in model.modules():
        # After the generic pass, which would otherwise overwrite the gate's projections' neighbours.
        if isinstance(module, ForgetGate):
            _init_forget_gate(module)


def _init_forget_gate(gate) -> None:
    with torch.no_grad():
        if gate.lower_bound is not None:
            gate.A_log.zero_()
        else:
            gate.A_log.copy_(torch.empty_like(gate.A_log).uniform_(1.0, 16.0).log())
        # dt in [1e-3, 1e-1] log-uniformly, stored through an inverse softplus (FLA / Mamba initialisation).
        dt = torch.empty_like(gate.dt_bias).uniform_(torch.tensor(1e-3).log().item(),
                                                      torch.tensor(1e-1).log().item()).exp().clamp_min(1e-4)
        gate.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))


def materialize(model: GenomeLM, device: torch.device | str) -> GenomeLM:
    """A model built on the meta device given storage on ``device`` and initialised once by :func:`init_weights`
    (the layers' constructors would each initialise their weights first, in their own way, only to be
    overwritten: for ``base`` that doubled a 1.9B-parameter CPU initialisation)."""
    model = model.to_empty(device=device)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight      # to_empty gives each parameter its own storage
    init_weights(model)
    return model


def build_model(config: ModelConfig, *, device: torch.device | str | None = None,
                dtype: torch.dtype | None = None) -> GenomeLM:
    """A freshly initialised :class:`GenomeLM` on ``device`` (default CPU; on the meta device: shapes only, nothing
    initialised). On a GPU it is built on the meta device and initialised there once (:func:`materialize`)."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model needs a ModelConfig, got {type(config).__name__}")
    target = torch.device(device if device is not None else "cpu")
    if target.type == "cpu":
        # Constructed in place, as before the meta path existed: the constructors' own random draws come first, so
        # a seed gives the CPU weights it always gave (tests and recorded CPU runs compare against them).
        model = GenomeLM(config)
        init_weights(model)
    else:
        with torch.device("meta"):
            model = GenomeLM(config)
        if target.type != "meta":
            model = materialize(model, target)
    if dtype is not None:
        model = model.to(dtype)
    return model


def resize_vocab(model: GenomeLM, new_vocab_size: int, *, pad_token_id: int | None = None) -> GenomeLM:
    """Give ``model`` a new vocabulary of ``new_vocab_size`` tokens (e.g. a text checkpoint -> genome tokens).

    Kept: every weight except the input embedding and the LM head. The first ``min(old, new)`` rows of both are
    kept too (they rarely mean the same token, but keeping them costs nothing and makes shrinking-then-growing
    lossless for those rows); new rows are drawn like a fresh model's (normal, initializer_range). The config's
    ``vocab_size`` and ``pad_token_id`` (default: kept if it still fits, else None) are updated.
    """
    config = model.config
    if not isinstance(new_vocab_size, int) or new_vocab_size < 1:
        raise ValueError(f"new_vocab_size must be a positive integer, got {new_vocab_size!r}")
    if pad_token_id is None and config.pad_token_id is not None and config.pad_token_id < new_vocab_size:
        pad_token_id = config.pad_token_id
    new_config = config.replace(vocab_size=new_vocab_size, pad_token_id=pad_token_id)
    old_embed, old_head = model.embed_tokens.weight, model.lm_head.weight
    keep = min(config.vocab_size, new_vocab_size)
    std = config.initializer_range
    device, dtype = old_embed.device, old_embed.dtype
    embed = nn.Embedding(new_vocab_size, config.hidden_size, padding_idx=pad_token_id, device=device, dtype=dtype)
    head = nn.Linear(config.hidden_size, new_vocab_size, bias=False, device=device, dtype=dtype)
    with torch.no_grad():
        nn.init.normal_(embed.weight, std=std)
        nn.init.normal_(head.weight, std=std)
        embed.weight[:keep] = old_embed[:keep]
        head.weight[:keep] = old_head[:keep]
        if pad_token_id is not None and pad_token_id >= keep:
            embed.weight[pad_token_id].zero_()
    model.embed_tokens = embed
    model.lm_head = head
    if new_config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.config = new_config
    return model
