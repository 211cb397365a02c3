"""Checkpoints in transformers' layouts: load, save, convert.

Two layouts, both ``config.json`` + safetensors (one ``model.safetensors``, or shards listed by
``model.safetensors.index.json``):

- multimodal (``Glm5NextForConditionalGeneration``): text config under ``text_config``; weights
  ``model.language_model.*`` and ``lm_head.weight``; ``model.visual.*`` (the vision tower) is ignored.
- text-only (flat): text config at the top level; weights ``model.*`` and ``lm_head.weight``. genolc writes this.

transformers has no causal-LM class for either layout, so genolc writes one beside the weights
(:mod:`genolc.glm5_next_causal_lm`, copied as ``glm5_next_causal_lm.py``) and names it in ``config.json``
(``architectures`` and ``auto_map``): ``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` then
loads either layout with its LM head. Checkpoints written before (no ``auto_map``) still load here unchanged.

Loading also understands the original GLM release spellings that transformers renames on load (per-expert
``mlp.experts.<e>.{gate,up,down}_proj.weight``, separate ``q/k/v_conv1d``, ``self_attn.f_a_proj`` ...,
``hc_attn_fn`` ...), and skips multi-token-prediction layers (index >= num_hidden_layers). Anything else that does
not fit -- a missing weight, an unknown one, a wrong shape -- is one clear InputError naming the keys.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import genolc
from genolc.errors import InputError
from genolc.fsutil import atomic_dir, atomic_write_json
from genolc.model.config import ModelConfig
from genolc.model.model import GenomeLM, build_model

WEIGHTS_NAME = "model.safetensors"
CAUSAL_LM_CODE = "glm5_next_causal_lm.py"
# The class transformers' AutoModelForCausalLM builds for each layout (defined in CAUSAL_LM_CODE).
_CAUSAL_LM_CLASS = {"text": "Glm5NextTextForCausalLM", "multimodal": "Glm5NextForCausalLM"}
INDEX_NAME = "model.safetensors.index.json"
LAYOUTS = ("text", "multimodal")
_PREFIX = {"text": "model.", "multimodal": "model.language_model."}
# Parameters transformers keeps in fp32 whatever the checkpoint dtype; loading with a dtype leaves them alone.
_FP32_PARAMS = re.compile(r"(e_score_correction_bias|\.gate\.weight|conv1d\.weight|dt_bias|A_log|_hc\.base|_hc\.scale)$")
_LEGACY_RENAMES = [
    (re.compile(r"self_attn\.(f_a_proj|f_b_proj|dt_bias|A_log)"), r"self_attn.forget_gate.\1"),
    (re.compile(r"hc_(attn|ffn)_(fn|base|scale)$"), r"\1_hc.\2"),
]
_LEGACY_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_LEGACY_CONV = re.compile(r"^(layers\.\d+\.self_attn)\.(q|k|v)_conv1d\.weight$")
_LAYER_INDEX = re.compile(r"^layers\.(\d+)\.")


def _weight_files(directory: Path) -> list[Path]:
    index = directory / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InputError("the safetensors index is not valid (needs a 'weight_map')", where=str(index))
        files = [directory / name for name in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise InputError(f"shard(s) listed in the index are missing: {', '.join(missing[:5])}", where=str(index),
                             fix="copy the complete checkpoint")
        return files
    single = directory / WEIGHTS_NAME
    if single.is_file():
        return [single]
    raise InputError(f"no {WEIGHTS_NAME} or {INDEX_NAME}", where=str(directory),
                     fix="point at a checkpoint directory written by genolc or transformers")


def read_checkpoint(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    """Read ``(config, raw tensors by stored name, raw config.json)`` from a checkpoint directory."""
    directory = Path(path)
    if not directory.is_dir():
        raise InputError("checkpoint directory not found", where=str(directory))
    config_path = directory / "config.json"
    if not config_path.is_file():
        refuse_run_directory(directory)
    config = ModelConfig.from_hf(config_path)
    raw_config = json.loads(config_path.read_text())
    tensors: dict[str, torch.Tensor] = {}
    for file in _weight_files(directory):
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    if key.startswith("model.visual.") or key.startswith("visual."):
                        continue
                    tensors[key] = handle.get_tensor(key)
        except Exception as exc:  # safetensors raises its own error types for truncated/corrupt files
            raise InputError(f"cannot read safetensors file ({exc})", where=str(file),
                             fix="re-download or re-save the checkpoint") from None
    return config, tensors, raw_config


def refuse_run_directory(directory: Path) -> None:
    """A `genolc finetune` run directory is a common mistake for a checkpoint: name the checkpoint it holds."""
    saved = sorted(p.parent for p in directory.glob("checkpoints/step-*/config.json"))
    if saved:
        raise InputError("this is a finetune run directory, not a checkpoint", where=str(directory),
                         fix=f"point at one of its checkpoints, e.g. the newest: {saved[-1]}")


def to_genolc_names(tensors: dict[str, torch.Tensor], config: ModelConfig, where: str) -> dict[str, torch.Tensor]:
    """Map stored names (either layout, legacy spellings included) to GenomeLM's state-dict names."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    convs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        if key == "lm_head.weight":
            out[key] = tensor
            continue
        name = key
        for prefix in ("model.language_model.", "language_model.model.", "model."):
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        layer = _LAYER_INDEX.match(name)
        if (layer and int(layer.group(1)) >= config.num_hidden_layers) or ".shared_head." in name:
            continue  # multi-token-prediction layers: not part of the decoder
        for pattern, replacement in _LEGACY_RENAMES:
            name = pattern.sub(replacement, name)
        if match := _LEGACY_EXPERT.match(name):
            experts.setdefault(match.group(1), {}).setdefault(match.group(3), {})[int(match.group(2))] = tensor
        elif match := _LEGACY_CONV.match(name):
            convs.setdefault(match.group(1), {})[match.group(2)] = tensor
        else:
            out[name] = tensor
    for base, parts in experts.items():
        if set(parts) != {"gate_proj", "up_proj", "down_proj"} or len({len(p) for p in parts.values()}) != 1:
            raise InputError(f"incomplete per-expert weights under {base}", where=where)
        count = len(parts["gate_proj"])
        if sorted(parts["gate_proj"]) != list(range(count)):
            raise InputError(f"expert indices under {base} are not 0..{count - 1}", where=where)
        gate = torch.stack([parts["gate_proj"][e] for e in range(count)])
        up = torch.stack([parts["up_proj"][e] for e in range(count)])
        out[f"{base}.gate_up_proj"] = torch.cat([gate, up], dim=1)
        out[f"{base}.down_proj"] = torch.stack([parts["down_proj"][e] for e in range(count)])
    for base, parts in convs.items():
        if set(parts) != {"q", "k", "v"}:
            raise InputError(f"incomplete q/k/v conv weights under {base}", where=where)
        out[f"{base}.conv1d.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def _describe(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" ... ({len(keys)} in all)" if len(keys) > limit else "")


def load_pretrained(path: str | Path, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype | None = None) -> GenomeLM:
    """A :class:`GenomeLM` from a checkpoint directory in either transformers layout.

    Tensors keep their stored dtype unless ``dtype`` is given; then every floating weight is converted except
    the ones transformers keeps in fp32 (router, correction bias, KDA conv and decay parameters, mHC base/scale).
    """
    config, tensors, _ = read_checkpoint(path)
    return model_from_tensors(config, tensors, where=str(path), device=device, dtype=dtype)


def model_from_tensors(config: ModelConfig, tensors: dict[str, torch.Tensor], *, where: str,
                       device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> GenomeLM:
    """A :class:`GenomeLM` from stored tensors (any layout's names), with clear errors for any mismatch."""
    state = to_genolc_names(tensors, config, where)
    model = build_model(config, device="meta")
    expected = model.state_dict()
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
        state.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_describe(missing)}")
        if unexpected:
            parts.append(f"unexpected {_describe(unexpected)}")
        raise InputError(f"checkpoint weights do not match its config.json: {'; '.join(parts)}", where=where,
                         fix="check that config.json belongs to these weights (layer_types, mlp_layer_types, "
                             "indexer_types, num_hidden_layers)")
    wrong = [f"{k} {tuple(state[k].shape)} (config needs {tuple(v.shape)})" for k, v in expected.items()
             if tuple(state[k].shape) != tuple(v.shape)]
    if wrong:
        raise InputError(f"checkpoint tensor shapes do not match its config.json: {_describe(wrong, 5)}",
                         where=where, fix="check hidden_size, head counts, ranks and vocab_size in config.json")
    for key, tensor in state.items():
        if dtype is not None and tensor.is_floating_point() and not _FP32_PARAMS.search(key):
            state[key] = tensor.to(dtype)
    model.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=not config.tie_word_embeddings,
                          assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model


def _shards(state: dict[str, torch.Tensor], max_shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    return shards


def transformers_config(config: ModelConfig, layout: str, vision_config: dict | None = None) -> dict:
    """``config.json`` for ``layout``: the model fields plus the causal-LM class transformers' auto classes load."""
    out = config.to_hf(layout, vision_config=vision_config)
    causal_lm = _CAUSAL_LM_CLASS[layout]
    if layout == "text":
        out["architectures"] = [causal_lm]
    out["auto_map"] = {"AutoModelForCausalLM": f"{Path(CAUSAL_LM_CODE).stem}.{causal_lm}"}
    return out


def write_checkpoint(directory: Path, config: ModelConfig, state: dict[str, torch.Tensor], *, layout: str,
                     max_shard_bytes: int, vision_config: dict | None = None) -> None:
    """Write ``config.json`` + safetensors for GenomeLM-named tensors into an existing directory."""
    if layout not in LAYOUTS:
        raise InputError(f"unknown checkpoint layout {layout!r}", where="--layout", fix="use 'text' or 'multimodal'")
    stored = {}
    for name, tensor in state.items():
        if name == "lm_head.weight":
            if config.tie_word_embeddings:
                continue
            stored[name] = tensor
        else:
            stored[_PREFIX[layout] + name] = tensor
    stored = {k: v.detach().to("cpu").contiguous() for k, v in stored.items()}
    atomic_write_json(directory / "config.json", transformers_config(config, layout, vision_config))
    shutil.copyfile(Path(genolc.__file__).parent / CAUSAL_LM_CODE, directory / CAUSAL_LM_CODE)
    shards = _shards(stored, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in stored.values())
    atomic_write_json(directory / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})


def save_pretrained(model: GenomeLM, path: str | Path, tokenizer=None, *, dtype: torch.dtype | None = None,
                    layout: str = "text", max_shard_bytes: int = 5 << 30, vision_config: dict | None = None) -> None:
    """Write ``model`` to ``path`` atomically: config.json, safetensors (sharded above ``max_shard_bytes``) and,
    with a tokenizer, genolc's tokenizer.json. ``dtype`` converts floating weights (fp32-kept ones excepted).

    Both layouts load in transformers with their LM head through ``AutoModelForCausalLM`` (with
    ``trust_remote_code=True``: see the module docstring). Natively, the text layout loads as the headless
    ``Glm5NextTextModel``; the multimodal layout as ``Glm5NextForConditionalGeneration`` (with a random vision tower
    of ``vision_config``, transformers' default when None).
    """
    state = {}
    for key, tensor in model.state_dict().items():
        if dtype is not None and tensor.is_floating_point() and not _FP32_PARAMS.search(key):
            tensor = tensor.to(dtype)
        state[key] = tensor
    with atomic_dir(path, what="checkpoint directory") as tmp:
        write_checkpoint(tmp, model.config, state, layout=layout, max_shard_bytes=max_shard_bytes,
                         vision_config=vision_config)
        if tokenizer is not None:
            from genolc.tokenize import save_tokenizer

            save_tokenizer(tokenizer, tmp / "tokenizer.json")


def convert_checkpoint(source: str | Path, destination: str | Path, *, layout: str = "text",
                       max_shard_bytes: int = 5 << 30) -> dict:
    """Rewrite a checkpoint in ``layout`` (weights unchanged; legacy names normalised; vision weights dropped).

    A multimodal source's ``vision_config`` is carried into a multimodal destination so transformers can still
    build the model (its vision tower then starts from random weights). ``tokenizer.json`` is copied when present.
    Returns a summary (layout, tensor count, parameter count).
    """
    if layout not in LAYOUTS:
        raise InputError(f"unknown checkpoint layout {layout!r}", where="--layout", fix="use 'text' or 'multimodal'")
    source, destination = Path(source), Path(destination)
    if source.resolve() == destination.resolve():
        raise InputError("source and destination are the same directory", where=str(source),
                         fix="write the converted checkpoint somewhere else")
    config, tensors, raw_config = read_checkpoint(source)
    model = model_from_tensors(config, tensors, where=str(source))
    state = model.state_dict()
    vision = raw_config.get("vision_config") if layout == "multimodal" else None
    with atomic_dir(destination, what="checkpoint directory") as tmp:
        write_checkpoint(tmp, config, state, layout=layout, max_shard_bytes=max_shard_bytes, vision_config=vision)
        if (source / "tokenizer.json").is_file():
            shutil.copyfile(source / "tokenizer.json", tmp / "tokenizer.json")
    return {"layout": layout, "tensors": len(state), "parameters": sum(p.numel() for p in model.parameters())}
