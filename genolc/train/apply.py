"""Memory and parallelism transforms, applied to a built model from outside, in one fixed order.

The model stays plain (no optimisation flags in its constructor); the trainer calls :func:`apply_transforms` once
after building or loading it and before creating the optimizer. Order, and why:

1. recompute (here, :func:`apply_recompute`): per-decoder-layer activation checkpointing. First, because every
   later transform must see the checkpointed layer boundaries: what is replayed defines what is kept.
2. mHC replay (later issue): recompute of the hyper-connection stream mixing inside a layer, layered on 1.
3. activation offload (later issue): moves the layer-boundary tensors that 1 still keeps to host memory; it
   wraps the checkpointed layers, so it comes after them.
4. context parallel (genolc.parallel.apply.apply_context_parallel, applied by the trainer with the process mesh
   it builds): shards the sequence dimension across ranks; it goes last because it changes the shapes every
   earlier transform sees only at run time, not their placement.
(torch.compile, when used, would follow all of these, as in torchtitan.)

The chunk-recurrent step (genolc/train/chunked.py) is not a transform: it is a step strategy
(genolc/train/strategy.py) that drives the model's chunk interface, and composes with 1 (recompute inside a chunk).

Transforms patch module instances, never module classes or parameter names, so checkpoints saved after a transform
load into a plain model and vice versa.
"""

from __future__ import annotations

import functools
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


def apply_transforms(model: nn.Module, config: TrainConfig) -> list[str]:
    """Apply the configured transforms in the documented order; returns what was applied, for the run log."""
    applied = []
    if config.recompute:
        applied.append(f"recompute({apply_recompute(model)} layers)")
    return applied
