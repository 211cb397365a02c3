"""Memory and parallelism transforms, applied to a built model from outside, in one fixed order.

The model stays plain (no optimisation flags in its constructor); the trainer calls :func:`apply_transforms` once
after building or loading it and before creating the optimizer. Order, and why:

1. recompute (here, :func:`apply_recompute`): per-decoder-layer activation checkpointing. First, because every
   later transform must see the checkpointed layer boundaries: what is replayed defines what is kept.
2. mHC replay (later issue): recompute of the hyper-connection stream mixing inside a layer, layered on 1.
3. activation offload (later issue): moves the layer-boundary tensors that 1 still keeps to host memory; it
   wraps the checkpointed layers, so it comes after them.
4. compile (:func:`apply_compile`, ``--compile``, on by default on CUDA): torch.compile of the per-token glue
   inside each layer (hyper-connection mixing, RMS norms, KDA's short convolution), module by module. It wraps
   only those leaf modules, never a decoder layer, so the layer-level wrappers of 1 (which the trainer may add
   later, when a length's step strategy asks for recompute) and of 5 compose with it in any order; the token
   mixers' and experts' own kernels (fla, TileLang, Triton, grouped GEMMs) stay outside the compiled regions.
5. context parallel (genolc.parallel.apply.apply_context_parallel, applied by the trainer with the process mesh
   it builds): shards the sequence dimension across ranks; it goes last because it changes the shapes every
   earlier transform sees only at run time, not their placement.

The chunk-recurrent step (genolc/train/chunked.py) is not a transform: it is a step strategy
(genolc/train/strategy.py) that drives the model's chunk interface, and composes with 1 (recompute inside a chunk).

Transforms patch module instances, never module classes or parameter names, so checkpoints saved after a transform
load into a plain model and vice versa.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from genolc.model.cache import LayerCache
from genolc.train.config import TrainConfig

_RECOMPUTE_FLAG = "_genolc_recompute"


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers: the first ``nn.ModuleList`` named ``layers`` (depth-first)."""
    for name, module in model.named_modules():
        if name.split(".")[-1] == "layers" and isinstance(module, nn.ModuleList):
            return module
    raise ValueError(f"{type(model).__name__} has no nn.ModuleList named 'layers' to checkpoint")


def _checkpointed_forward(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():
        return original(*args, **kwargs)
    calls = 0

    def run(*run_args: Any, **run_kwargs: Any) -> Any:
        # The backward's replay of a chunk's layer must not write the chunk cache: an entry it wrote would hold the
        # replay's whole graph (every recomputed activation of the layer) until the chunk's backward ends, so with
        # --chunk and --recompute all layers' activations were alive at once (tiny on CPU: 2.1x the plan).
        nonlocal calls
        calls += 1
        cache = run_kwargs.get("cache")
        if calls > 1 and isinstance(cache, LayerCache):
            run_kwargs = {**run_kwargs, "cache": cache.replay()}
        return original(*run_args, **run_kwargs)

    # Non-reentrant: supports keyword arguments and tensors that do not require grad, and nests with autocast.
    return checkpoint(run, *args, use_reentrant=False, **kwargs)


def apply_recompute(model: nn.Module) -> int:
    """Checkpoint every decoder layer: its activations are dropped after forward and recomputed in backward.

    Each layer instance's ``forward`` is replaced by one that runs the original under
    ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` whenever gradients are enabled (evaluation under
    ``torch.no_grad`` runs it plainly). Parameter names and results are unchanged; each layer's forward runs twice
    per training step. Applying twice is a no-op. Returns the number of layers wrapped.
    """
    layers = decoder_layers(model)
    wrapped = 0
    for layer in layers:
        if getattr(layer, _RECOMPUTE_FLAG, False):
            continue
        # Bind the class's forward to the instance so hooks and the outer __call__ still run once per call.
        original = type(layer).forward.__get__(layer, type(layer))
        layer.forward = functools.partial(_checkpointed_forward, original)
        setattr(layer, _RECOMPUTE_FLAG, True)
        wrapped += 1
    return wrapped


def compile_cache_dir() -> Path:
    """Where torch.compile keeps what it generated, so later runs load it rather than compile again: the user's
    cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``genolc/torchinductor``), unless
    ``$TORCHINDUCTOR_CACHE_DIR`` says otherwise (torch's own default is under /tmp, which a reboot empties)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "genolc" / "torchinductor"


def _compiled(method: Callable[..., Any]) -> Callable[..., Any]:
    import torch._dynamo

    # Every instance of a class shares one compiled graph per input variant (grad on or off, chunk length, a
    # short-conv tail or not), but a deep model can still pass dynamo's default of 8 variants per code object.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(method)


# Per-token modules whose methods are compiled: many small memory-bound kernels each in eager mode (the H200
# profile of issue 14: mHC's 4x4 stream mixing as batched GEMMs, fp32 casts, norms), one or two fused ones compiled.
_COMPILED_METHODS = {"HyperConnection": ("forward", "merge"), "RMSNorm": ("forward",),
                     "GatedRMSNorm": ("forward",), "KimiDeltaAttention": ("short_conv",)}
_COMPILE_FLAG = "_genolc_compiled"


def apply_compile(model: nn.Module) -> int:
    """torch.compile the per-token glue: every module instance of the classes in ``_COMPILED_METHODS`` gets those
    methods replaced by compiled ones (results equal to rounding; the first call of each input variant compiles,
    later runs load from :func:`compile_cache_dir`). Applying twice is a no-op. Returns the instances compiled."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache_dir()))
    compiled = 0
    for module in model.modules():
        methods = _COMPILED_METHODS.get(type(module).__name__)
        if not methods or getattr(module, _COMPILE_FLAG, False):
            continue
        for name in methods:
            # The class's function bound to this instance: hooks and __call__ stay eager around it.
            setattr(module, name, _compiled(getattr(type(module), name).__get__(module, type(module))))
        setattr(module, _COMPILE_FLAG, True)
        compiled += 1
    return compiled


def compile_wanted(config: TrainConfig, device_type: str) -> bool:
    """``--compile auto`` compiles on CUDA only: on CPU the generated C++ costs more time to build than it saves."""
    return config.compile == "on" or (config.compile == "auto" and device_type == "cuda")


def apply_transforms(model: nn.Module, config: TrainConfig, device_type: str = "cpu") -> list[str]:
    """Apply the configured transforms in the documented order; returns what was applied, for the run log."""
    applied = []
    if config.recompute:
        applied.append(f"recompute({apply_recompute(model)} layers)")
    if compile_wanted(config, device_type):
        applied.append(f"compile({apply_compile(model)} modules, cache {compile_cache_dir()})")
    return applied
