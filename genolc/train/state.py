"""Checkpoints: atomic save, exact resume, keep-last-N, and the NaN/Inf guard's error.

A checkpoint is one directory ``<out>/checkpoints/step-NNNNNN`` (``NNNNNN`` = optimizer steps completed)::

    config.json, model.safetensors, tokenizer.json   the model's save_pretrained layout (genolc eval and
                                                     transformers-layout tools read it as a model checkpoint)
    optimizer.pt                                     AdamW state_dict (torch.save; loaded with weights_only=True)
    trainer_state.json                               step, tokens seen, TrainConfig, sampler states, RNG states

It is built under a temporary name beside its final place and renamed in one step (:func:`genolc.fsutil.atomic_dir`),
so a crash or a kill during a save leaves either the new checkpoint whole or no trace of it, and the previous one
untouched; stale temporaries are swept at the next start. Older checkpoints are removed only after the new one is in
place. A save can be a snapshot (every tensor copied to host memory, :func:`snapshot_checkpoint`) and its writing
(:func:`write_snapshot`), so that the trainer writes it while training goes on (genolc/train/background_save.py).
RNG states (python, numpy, torch CPU and CUDA) are stored so that anything random in the model or the loop continues
as in an uninterrupted run; the sampler itself draws windows from ``(seed, step, micro)`` alone.
"""

from __future__ import annotations

import base64
import copy
import json
import random
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from genolc.errors import GenolcError, InputError
from genolc.fsutil import atomic_dir, atomic_write_json
from genolc.parallel.launch import writes_outputs
from genolc.model.config import ModelConfig

STATE_VERSION = 1
CHECKPOINTS_DIRNAME = "checkpoints"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optimizer.pt"
WEIGHTS = "model.safetensors"
_NAME = re.compile(r"^step-(\d{6,})$")

# Called with each file's name right after it is written inside the temporary checkpoint directory. Tests set it
# to raise or to kill the process between writes; it is None otherwise.
after_file_written: Callable[[str], None] | None = None


class NonFiniteLossError(GenolcError):
    """Training produced a NaN or infinite loss or gradient; the last good checkpoint is kept."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoint_root(out: Path) -> Path:
    return Path(out) / CHECKPOINTS_DIRNAME


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first. Temporaries (dot-names) are skipped."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir() and (child / TRAINER_STATE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def resolve_checkpoint(path: Path, option: str) -> Path:
    """The checkpoint ``option`` (e.g. ``--checkpoint``) names: ``path`` itself, or a finetune run's newest one.

    A checkpoint directory (it holds config.json) is returned as given. A finetune run directory (it holds
    checkpoints/ or metrics.jsonl and no config.json) resolves to its newest complete checkpoint, and one line on
    stderr names it; a run without a complete checkpoint is an error. Anything else is returned as given, for the
    model loader to report.
    """
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    root = checkpoint_root(path)
    if not (root.is_dir() or (path / "metrics.jsonl").is_file()):
        return path
    newest = latest_checkpoint(root)
    if newest is None:
        raise InputError(f"{option}: this finetune run directory has no complete checkpoint",
                         where=str(path),
                         fix="let the run save one (it saves at the end, and every --checkpoint-every steps) or "
                             "point at a checkpoint directory")
    if writes_outputs():
        print(f"genolc: {option} {path}: using the run's newest checkpoint {newest}", file=sys.stderr)
    return newest


def sweep_temporaries(root: Path) -> list[Path]:
    """Remove half-written checkpoint directories left by a process killed during a save."""
    removed = []
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(".step-") and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed


def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch CPU (and CUDA when present) generator states as JSON-able values."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": np.asarray(np_state["state"]["key"]).tolist(), "pos": int(np_state["state"]["pos"]),
                  "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"])},
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state({"bit_generator": npst["bit_generator"],
                         "state": {"key": np.asarray(npst["key"], dtype=np.uint32), "pos": npst["pos"]},
                         "has_gauss": npst["has_gauss"], "gauss": npst["gauss"]})
    torch.set_rng_state(_bytes_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        saved = [_bytes_tensor(s) for s in state["cuda"]]
        if len(saved) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(saved)


def _bytes_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def _is_genome_lm(model: torch.nn.Module) -> bool:
    return isinstance(getattr(model, "config", None), ModelConfig)


def save_model(model: torch.nn.Module, directory: Path, tokenizer: Any | None) -> None:
    """Write weights into the (existing, temporary) ``directory``.

    A GenomeLM gets the model package's text-only transformers layout (config.json + model.safetensors, as
    ``save_pretrained`` writes; weights in their training dtype) and genolc's tokenizer.json; any other module a
    flat safetensors of its state_dict.
    """
    _write_weights(directory, model.state_dict(), model.config if _is_genome_lm(model) else None, tokenizer)


def _write_weights(directory: Path, weights: dict[str, torch.Tensor], config: ModelConfig | None,
                   tokenizer: Any | None) -> None:
    if config is not None:
        from genolc.model import write_checkpoint

        write_checkpoint(directory, config, weights, layout="text", max_shard_bytes=5 << 30)
    else:
        tensors = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
        save_file(tensors, str(directory / WEIGHTS))
    if tokenizer is not None:
        from genolc.tokenize import save_tokenizer

        save_tokenizer(tokenizer, directory / "tokenizer.json")


def load_model_weights(model: torch.nn.Module, directory: Path) -> None:
    """Load a checkpoint's weights into ``model`` in place, exactly (stored dtype, strict names and shapes)."""
    if _is_genome_lm(model):
        from genolc.model import load_pretrained

        # Copied into the caller's freshly built model rather than used as is: tensors assigned from safetensors
        # buffers are aligned differently, and vectorised CPU kernels then round differently in the last bit.
        state = load_pretrained(directory).state_dict()
    else:
        state = load_file(str(directory / WEIGHTS))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise InputError(f"checkpoint weights do not fit the model ({str(exc).splitlines()[0]})",
                         where=str(directory), fix="resume with the model the checkpoint was trained with") from None


@dataclass
class Snapshot:
    """A checkpoint's contents copied off the live training state (host copies of every tensor), so that it can be
    written while training goes on (genolc/train/background_save.py)."""

    step: int
    weights: dict[str, torch.Tensor]
    config: ModelConfig | None              # a GenomeLM's (written in the transformers layout); None: flat weights
    optimizer: dict[str, Any]
    trainer_state: dict[str, Any]           # the loop's values, the step and the RNG states: trainer_state.json


def _host_copy(value: Any, reuse: Any = None) -> Any:
    """``value`` with every tensor copied to host memory (into ``reuse``'s tensor at the same place when that has
    its shape and dtype: the previous snapshot's buffers, whose pages are already mapped) and the rest copied."""
    if isinstance(value, torch.Tensor):
        if (isinstance(reuse, torch.Tensor) and reuse.shape == value.shape and reuse.dtype == value.dtype
                and reuse.device.type == "cpu"):
            return reuse.copy_(value.detach())
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        previous = reuse if isinstance(reuse, dict) else {}
        return {key: _host_copy(item, previous.get(key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        previous = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(value) else [None] * len(value)
        return type(value)(_host_copy(item, old) for item, old in zip(value, previous))
    return copy.deepcopy(value)


def snapshot_checkpoint(step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        trainer_state: dict[str, Any], reuse: Snapshot | None = None) -> Snapshot:
    """The checkpoint of ``step`` as it stands now (``trainer_state``: the loop's own resumable values; the step and
    the RNG states are added here); ``reuse``: an earlier snapshot, already written, whose host buffers to fill."""
    state = {"version": STATE_VERSION, "step": step, "rng": capture_rng(), **copy.deepcopy(trainer_state)}
    return Snapshot(step, _host_copy(model.state_dict(), None if reuse is None else reuse.weights),
                    model.config if _is_genome_lm(model) else None,
                    _host_copy(optimizer.state_dict(), None if reuse is None else reuse.optimizer), state)


def write_snapshot(out: Path, snapshot: Snapshot, *, tokenizer: Any | None, keep: int) -> Path:
    """Write ``snapshot`` as ``<out>/checkpoints/step-NNNNNN`` atomically, then prune to the newest ``keep``.
    Returns its path."""
    return _write(out, snapshot.step, snapshot.weights, snapshot.config, snapshot.optimizer, snapshot.trainer_state,
                  tokenizer, keep)


def save_checkpoint(
    out: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    tokenizer: Any | None,
    trainer_state: dict[str, Any],
    keep: int,
) -> Path:
    """Write ``<out>/checkpoints/step-NNNNNN`` atomically, then prune to the newest ``keep``. Returns its path.

    ``trainer_state`` holds the loop's own resumable values (tokens seen, sampler states, config); the step and the
    RNG states are added here. The tensors go to the files as they are copied off the device (no snapshot of the
    whole state in host memory: the weights, then the optimizer's state one tensor at a time).
    """
    state = {"version": STATE_VERSION, "step": step, "rng": capture_rng(), **trainer_state}
    return _write(out, step, model.state_dict(), model.config if _is_genome_lm(model) else None,
                  optimizer.state_dict(), state, tokenizer, keep)


def _write(out: Path, step: int, weights: dict[str, torch.Tensor], config: ModelConfig | None,
           optimizer_state: dict[str, Any], trainer_state: dict[str, Any], tokenizer: Any | None, keep: int) -> Path:
    root = checkpoint_root(out)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    with atomic_dir(final, what="checkpoint directory") as tmp:
        _write_weights(tmp, weights, config, tokenizer)
        _written(WEIGHTS)
        torch.save(optimizer_state, tmp / OPTIMIZER_STATE)
        _written(OPTIMIZER_STATE)
        atomic_write_json(tmp / TRAINER_STATE, trainer_state)
        _written(TRAINER_STATE)
    for _, old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _written(name: str) -> None:
    if after_file_written is not None:
        after_file_written(name)


def read_trainer_state(path: Path) -> dict[str, Any]:
    file = Path(path) / TRAINER_STATE
    try:
        state = json.loads(file.read_text())
    except FileNotFoundError:
        raise InputError("not a genolc training checkpoint (no trainer_state.json)", where=str(path),
                         fix="point at a directory under <out>/checkpoints") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"trainer_state.json is damaged ({exc.msg})", where=str(file),
                         fix="remove this checkpoint to resume from the previous one") from None
    if state.get("version") != STATE_VERSION:
        raise InputError(f"checkpoint state version {state.get('version')!r} is not {STATE_VERSION}", where=str(file),
                         fix="resume with the genolc version that wrote it")
    return state


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    weights: bool = True) -> dict[str, Any]:
    """Restore weights (unless ``weights=False``: the model was loaded from ``path`` already), optimizer and RNG
    states from ``path``; return its trainer state (step, tokens seen, sampler states, config)."""
    state = read_trainer_state(path)
    if weights:
        load_model_weights(model, path)
    try:
        optimizer.load_state_dict(torch.load(path / OPTIMIZER_STATE, map_location="cpu", weights_only=True))
    except (FileNotFoundError, RuntimeError, ValueError) as exc:
        raise InputError(f"cannot restore the optimizer state ({exc})", where=str(path / OPTIMIZER_STATE),
                         fix="resume with the same model and parameter groups, or start a new run") from None
    restore_rng(state["rng"])
    return state
