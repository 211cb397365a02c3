"""Causal-LM classes over transformers' ``glm5_next``, so ``AutoModelForCausalLM`` loads genolc checkpoints.

transformers registers ``glm5_next`` only as a multimodal model (``Glm5NextForConditionalGeneration``, under
``AutoModelForImageTextToText``) and ``glm5_next_text`` only as the headless ``Glm5NextTextModel``; neither is an
``AutoModelForCausalLM``. genolc copies this file into every checkpoint it writes and names these classes in
``config.json``'s ``auto_map``, so that::

    AutoModelForCausalLM.from_pretrained(checkpoint_dir, trust_remote_code=True)

gives the model with its LM head in either layout (or, without ``trust_remote_code``, after
``genolc.glm5_next_causal_lm.register_auto_classes()``). The classes add only the head: every layer is
transformers' own.

- ``Glm5NextTextForCausalLM``: the text layout (flat ``glm5_next_text`` config, weights ``model.*`` + ``lm_head``).
- ``Glm5NextForCausalLM``: the multimodal layout (``glm5_next`` config, weights ``model.language_model.*`` +
  ``lm_head``); the vision tower is neither built nor loaded (``model.visual.*`` weights are skipped).

This file must import nothing but torch and transformers: transformers runs it from the checkpoint directory.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.modeling_outputs import MoeCausalLMOutputWithPast
from transformers.modeling_utils import slice_logits_to_keep
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextConfig, Glm5NextTextConfig
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextPreTrainedModel, Glm5NextTextModel


def _causal_lm_output(head: nn.Linear, loss_function, outputs, labels, vocab_size: int, logits_to_keep, kwargs):
    logits = head(slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep))
    loss = None
    if labels is not None:
        loss = loss_function(logits=logits, labels=labels, vocab_size=vocab_size, **kwargs)
    return MoeCausalLMOutputWithPast(loss=loss, logits=logits, cache=outputs.cache,
                                     hidden_states=outputs.hidden_states, attentions=outputs.attentions,
                                     router_logits=outputs.router_logits)


class Glm5NextTextForCausalLM(Glm5NextPreTrainedModel, GenerationMixin):
    """``Glm5NextTextModel`` plus the LM head: the text layout genolc writes."""

    config_class = Glm5NextTextConfig
    config: Glm5NextTextConfig
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # The text layout never holds a vision tower; a converted release may still carry its weights.
    _keys_to_ignore_on_load_unexpected = [*Glm5NextPreTrainedModel._keys_to_ignore_on_load_unexpected,
                                          r"^model\.visual\."]

    def __init__(self, config: Glm5NextTextConfig):
        super().__init__(config)
        self.model = Glm5NextTextModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache=None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0,
                **kwargs) -> MoeCausalLMOutputWithPast:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        return _causal_lm_output(self.lm_head, self.loss_function, outputs, labels, self.config.vocab_size,
                                 logits_to_keep, kwargs)


class Glm5NextLanguageModelOnly(Glm5NextPreTrainedModel):
    """The multimodal ``Glm5NextModel`` without its vision tower: parameter names stay ``language_model.*``."""

    config_class = Glm5NextConfig
    config: Glm5NextConfig

    def __init__(self, config: Glm5NextConfig):
        super().__init__(config)
        self.language_model = Glm5NextTextModel._from_config(config.text_config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.language_model.embed_tokens = value

    def forward(self, **kwargs):
        return self.language_model(**kwargs)


class Glm5NextForCausalLM(Glm5NextPreTrainedModel, GenerationMixin):
    """The multimodal layout's language model plus the LM head (text in, logits out; no vision tower)."""

    config_class = Glm5NextConfig
    config: Glm5NextConfig
    _tied_weights_keys = {"lm_head.weight": "model.language_model.embed_tokens.weight"}
    _keys_to_ignore_on_load_unexpected = [*Glm5NextPreTrainedModel._keys_to_ignore_on_load_unexpected,
                                          r"^model\.visual\."]

    def __init__(self, config: Glm5NextConfig):
        super().__init__(config)
        self.model = Glm5NextLanguageModelOnly(config)
        self.vocab_size = config.text_config.vocab_size
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.set_input_embeddings(value)

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache=None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0,
                **kwargs) -> MoeCausalLMOutputWithPast:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        return _causal_lm_output(self.lm_head, self.loss_function, outputs, labels,
                                 self.config.text_config.vocab_size, logits_to_keep, kwargs)


def register_auto_classes() -> None:
    """Map glm5_next configs to these classes in ``AutoModelForCausalLM`` for this process.

    ``AutoModelForCausalLM.from_pretrained(dir)`` then needs no ``trust_remote_code``: the classes come from the
    installed genolc instead of the copy in the checkpoint.
    """
    from transformers import AutoModelForCausalLM

    # exist_ok: transformers refuses to remap its own config classes without it.
    AutoModelForCausalLM.register(Glm5NextTextConfig, Glm5NextTextForCausalLM, exist_ok=True)
    AutoModelForCausalLM.register(Glm5NextConfig, Glm5NextForCausalLM, exist_ok=True)
