"""The model's configuration: one frozen dataclass whose field names mirror transformers' ``Glm5NextTextConfig``.

Keeping the names identical makes ``from_hf`` / ``to_hf`` a near-identity and lets anyone reading a published
``config.json`` find the same knob here. Two layouts exist on disk:

- text-only (flat): the text fields at the top level of ``config.json`` (``model_type: glm5_next_text``);
- multimodal: ``{"model_type": "glm5_next", "text_config": {...}, "vision_config": {...}}`` as written by
  ``Glm5NextForConditionalGeneration``; only ``text_config`` matters to genolc.

Per-layer schedules (``layer_types``, ``mlp_layer_types``, ``indexer_types``) are tuples so the config stays
hashable; ``to_hf`` writes them back as lists.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genolc.errors import ConfigError, InputError

LAYER_TYPES = ("linear_attention", "indexed_attention")
MLP_LAYER_TYPES = ("dense", "sparse")
INDEXER_TYPES = ("full", "shared")

class ModelConfigError(ConfigError, ValueError):
    """An inconsistent model configuration; a ValueError too, so shape checks can be caught either way."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a GLM-5.3-Flash text decoder. Defaults are transformers' published GLM-5.3-Flash defaults."""

    vocab_size: int = 154880
    hidden_size: int = 4096
    intermediate_size: int = 12288
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 45
    num_attention_heads: int = 64
    num_key_value_heads: int = 64
    n_shared_experts: int = 1
    n_routed_experts: int = 288
    routed_scaling_factor: float = 2.5
    kv_lora_rank: int = 512
    q_lora_rank: int = 1536
    qk_rope_head_dim: int = 0
    v_head_dim: int = 256
    qk_nope_head_dim: int = 256
    n_group: int = 1
    topk_group: int = 1
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: int = 1048576
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-5
    pad_token_id: int | None = 154820
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_dropout: float = 0.0
    index_topk: int = 2048
    index_head_dim: int = 128
    index_n_heads: int = 32
    index_kpool: int = 16
    index_kpool_always_select_tail: bool = True
    swiglu_limit: float = 10.0
    linear_head_dim: int = 128
    linear_num_heads: int = 64
    linear_conv_kernel_dim: int = 4
    linear_lower_bound: float | None = -5.0
    hc_mult: int = 4
    hc_eps: float = 1e-6
    hc_sinkhorn_iters: int = 20
    router_aux_loss_coef: float = 0.001
    # Empty tuples mean "transformers' default schedule for num_hidden_layers" and are filled in __post_init__.
    layer_types: tuple[str, ...] = field(default=())
    mlp_layer_types: tuple[str, ...] = field(default=())
    indexer_types: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n = self.num_hidden_layers
        if not isinstance(n, int) or n < 1:
            raise ModelConfigError(f"num_hidden_layers must be a positive integer, got {n!r}", where="model config")
        # Same defaults as Glm5NextTextConfig: every 4th layer DSA, first three layers dense, every indexer full.
        if not self.layer_types:
            object.__setattr__(self, "layer_types", tuple(
                "indexed_attention" if i % 4 == 3 else "linear_attention" for i in range(n)))
        if not self.mlp_layer_types:
            object.__setattr__(self, "mlp_layer_types", tuple(["dense"] * min(3, n) + ["sparse"] * (n - min(3, n))))
        if not self.indexer_types:
            object.__setattr__(self, "indexer_types", ("full",) * n)
        for name in ("layer_types", "mlp_layer_types", "indexer_types"):
            object.__setattr__(self, name, tuple(
                "indexed_attention" if v == "full_attention" else v for v in getattr(self, name)))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        self._validate()

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def index_width(self) -> int:
        """Width W of a DSA index row: the top ``index_topk`` tokens plus, optionally, the incomplete tail pool."""
        return self.index_topk + (self.index_kpool - 1 if self.index_kpool_always_select_tail else 0)

    @property
    def dsa_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "indexed_attention")

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.mlp_layer_types) if t == "sparse")

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def _validate(self) -> None:
        where = "model config"

        def fail(what: str, fix: str | None = None) -> None:
            raise ModelConfigError(what, where=where, fix=fix)

        positive = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
                    "num_key_value_heads", "n_routed_experts", "kv_lora_rank", "q_lora_rank", "v_head_dim",
                    "qk_nope_head_dim", "n_group", "topk_group", "num_experts_per_tok", "index_topk",
                    "index_head_dim", "index_n_heads", "index_kpool", "linear_head_dim", "linear_num_heads",
                    "linear_conv_kernel_dim", "hc_mult", "hc_sinkhorn_iters")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                fail(f"{name} must be a positive integer, got {value!r}")
        if self.n_shared_experts < 0 or self.qk_rope_head_dim < 0:
            fail("n_shared_experts and qk_rope_head_dim must be >= 0")
        n = self.num_hidden_layers
        for name, allowed in (("layer_types", LAYER_TYPES), ("mlp_layer_types", MLP_LAYER_TYPES),
                              ("indexer_types", INDEXER_TYPES)):
            values = getattr(self, name)
            if len(values) != n:
                fail(f"{name} has {len(values)} entries but num_hidden_layers is {n}",
                     fix=f"give one entry per layer ({', '.join(allowed)})")
            bad = sorted({v for v in values if v not in allowed})
            if bad:
                fail(f"{name} has unknown value(s) {bad}", fix=f"use only {', '.join(allowed)}")
        if self.num_key_value_heads != self.num_attention_heads:
            fail(f"num_key_value_heads ({self.num_key_value_heads}) must equal num_attention_heads "
                 f"({self.num_attention_heads}) in MLA")
        if self.qk_rope_head_dim != 0:
            fail(f"DSA layers are NoPE but qk_rope_head_dim is {self.qk_rope_head_dim}", fix="set qk_rope_head_dim to 0")
        if self.index_topk % self.index_kpool:
            fail(f"index_topk ({self.index_topk}) must be divisible by index_kpool ({self.index_kpool})")
        if self.n_routed_experts % self.n_group:
            fail(f"n_routed_experts ({self.n_routed_experts}) must be divisible by n_group ({self.n_group})")
        if self.n_group > 1 and self.n_routed_experts // self.n_group < 2:
            fail("grouped routing scores each group by its top-2 experts, so every group needs >= 2 experts")
        if self.topk_group > self.n_group:
            fail(f"topk_group ({self.topk_group}) must be <= n_group ({self.n_group})")
        if self.num_experts_per_tok > self.topk_group * (self.n_routed_experts // self.n_group):
            fail(f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds the experts reachable in "
                 f"{self.topk_group} of {self.n_group} group(s)")
        if self.hidden_act != "silu":
            fail(f"hidden_act {self.hidden_act!r} is not supported", fix="GLM-5.3-Flash uses 'silu'")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            fail(f"pad_token_id {self.pad_token_id} is outside the vocabulary (size {self.vocab_size})",
                 fix="set pad_token_id to the tokenizer's pad id or None")
        seen_full = False
        for i, (layer, indexer) in enumerate(zip(self.layer_types, self.indexer_types)):
            if layer != "indexed_attention":
                continue
            if indexer == "full":
                seen_full = True
            elif not seen_full:
                fail(f"layer {i} is a 'shared' DSA layer but no earlier DSA layer runs a 'full' indexer",
                     fix="make the first DSA layer's indexer_types entry 'full'")

    @classmethod
    def from_hf(cls, source: dict | str | Path) -> "ModelConfig":
        """Build from a transformers ``config.json`` (a dict, a file, or a directory holding one).

        Accepts the flat text-only layout and the multimodal layout (``text_config``), plus the legacy spellings
        transformers itself accepts (``linear_attn_config``, ``index_topk_pattern``/``index_topk_freq``/
        ``index_skip_topk_offset``).
        """
        where = "config"
        if isinstance(source, (str, Path)):
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            where = str(path)
            if not path.is_file():
                raise InputError("config.json not found", where=str(path), fix="point at a checkpoint directory")
            try:
                source = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise InputError(f"config.json is not valid JSON ({exc.msg}, line {exc.lineno})", where=where)
        if not isinstance(source, dict):
            raise InputError("a model config must be a JSON object", where=where)
        data = dict(source)
        if isinstance(data.get("text_config"), dict):
            data = dict(data["text_config"])
        return cls._from_text_dict(data, where)

    @classmethod
    def _from_text_dict(cls, data: dict, where: str) -> "ModelConfig":
        data = dict(data)
        linear = data.pop("linear_attn_config", None)
        if isinstance(linear, dict):
            for ours, theirs in (("linear_head_dim", "head_dim"), ("linear_num_heads", "num_heads"),
                                 ("linear_conv_kernel_dim", "short_conv_kernel_size"),
                                 ("linear_lower_bound", "gate_lower_bound")):
                if theirs in linear:
                    data[ours] = linear[theirs]
            if linear.get("safe_gate", True) and data.get("linear_lower_bound", -5.0) is None:
                data["linear_lower_bound"] = -5.0
        pattern = data.pop("index_topk_pattern", None)
        freq = max(int(data.pop("index_topk_freq", 1) or 1), 1)
        offset = int(data.pop("index_skip_topk_offset", 2))
        n_layers = int(data.get("num_hidden_layers", cls.num_hidden_layers))
        if not data.get("indexer_types"):
            if pattern is not None:
                data["indexer_types"] = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(
                    pattern, str) else list(pattern)
            else:
                data["indexer_types"] = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared"
                                         for i in range(n_layers)]
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in names:
                kwargs[key] = tuple(value) if isinstance(value, list) and key != "eos_token_id" else value
            elif key == "num_local_experts":
                kwargs.setdefault("n_routed_experts", value)
        for key in ("layer_types", "mlp_layer_types", "indexer_types"):
            if kwargs.get(key) is None:
                kwargs.pop(key, None)
        try:
            return cls(**kwargs)
        except ModelConfigError as exc:
            raise ModelConfigError(exc.what, where=where, fix=exc.fix) from None
        except TypeError as exc:
            raise ModelConfigError(f"invalid model config ({exc})", where=where) from None

    def to_hf(self, layout: str = "text", vision_config: dict | None = None) -> dict:
        """The ``config.json`` dict: ``layout='text'`` (flat, ``glm5_next_text``) or ``'multimodal'``.

        The multimodal layout nests the text fields under ``text_config``; ``vision_config`` is written only when
        given (transformers then builds its default vision tower when loading).
        """
        text: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            text[f.name] = list(value) if isinstance(value, tuple) else value
        text["model_type"] = "glm5_next_text"
        if layout == "text":
            return {"architectures": ["Glm5NextForConditionalGeneration"], **text}
        if layout == "multimodal":
            out: dict[str, Any] = {
                "architectures": ["Glm5NextForConditionalGeneration"],
                "model_type": "glm5_next",
                "tie_word_embeddings": self.tie_word_embeddings,
                "text_config": text,
            }
            if vision_config is not None:
                out["vision_config"] = dict(vision_config)
            return out
        raise ModelConfigError(f"unknown checkpoint layout {layout!r}", where="to_hf", fix="use 'text' or 'multimodal'")
