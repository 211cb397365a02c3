"""Memory and parallelism transforms, applied to a built model from outside, in one fixed order.

The model stays plain (no optimisation flags in its constructor); the trainer calls :func:`apply_transforms` once
after building or loading it and before creating the optimizer. Order, and why:

1. recompute (here, :func:`apply_recompute`): per-decoder-layer activation checkpointing. First, because every
   later transform must see the checkpointed layer boundaries: what is replayed defines what is kept.
2. mHC replay (later issue): recompute of the hyper-connection stream mixing inside a layer, layered on 1.
3. activation offload (later issue): moves the layer-boundary tensors that 1 still keeps to host memory; it
   wraps the checkpointed layers, so it comes after them.
4. compile (:func:`apply_compile`, ``--compile``, on by default on CUDA): torch.compile of the per-token glue
   inside each layer (hyper-connection mixing, RMS norms, KDA's short convolution), module by module. It replaces
   methods of those small modules only, never a decoder layer's or a token mixer's forward, so 1's wrappers (which
   the trainer may add later, when a length's step strategy asks for recompute) and 5's patches compose with it
   in any order; the token mixers' and experts' own kernels (fla, TileLang, Triton, grouped GEMMs) stay outside
   the compiled regions.
5. context parallel (genolc.parallel.apply.apply_context_parallel, applied by the trainer with the process mesh
   it builds): shards the sequence dimension across ranks; it goes last because it changes the shapes every
   earlier transform sees only at run time, not their placement.

Beside them, before compile: the residual streams' dtype (:func:`apply_stream_dtype`, ``--stream-dtype``), which
casts the embedding's output and gives the merges and the stream norms subclasses that keep the streams' dtype, so
that every stream pass after it reads and writes bf16.

The chunk-recurrent step (genolc/train/chunked.py) is not a transform: it is a step strategy
(genolc/train/strategy.py) that drives the model's chunk interface, and composes with 1 (recompute inside a chunk).

Transforms patch module instances (a method, or the instance's class for a subclass that adds no state), never
module classes or parameter names, so checkpoints saved after a transform load into a plain model and vice versa.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from genolc.errors import InputError
from genolc.fsutil import genolc_cache_dir
from genolc.model.cache import LayerCache
from genolc.model.layers.mhc import HyperConnection, merge_streams
from genolc.model.layers.norm import RMSNorm
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
    return genolc_cache_dir() / "torchinductor"


def _compiled_methods() -> dict[type, tuple[str, ...]]:
    # Per-token modules: many small memory-bound kernels each when eager (the H200 profile of issue 14: mHC's 4 x 4
    # products as CUTLASS GEMMs, fp32 element-wise kernels, norms), a few fused ones compiled.
    from genolc.model.layers.kda import KimiDeltaAttention
    from genolc.model.layers.norm import GatedRMSNorm

    return {HyperConnection: ("forward", "merge"), RMSNorm: ("forward",), GatedRMSNorm: ("forward",),
            KimiDeltaAttention: ("short_conv", "convolved_heads"), Fp32MergeHyperConnection: ("forward",),
            StreamRMSNorm: ("forward",)}


_COMPILE_FLAG = "_genolc_compiled"


@functools.cache
def _compiled_function(function: Callable[..., Any]) -> Callable[..., Any]:
    """One compiled function per class method, shared by every instance (the module is its first argument).
    Static shapes: one graph per chunk shape (and grad mode, short-conv tail or not), so a layer's replay under
    recompute runs the graph its forward ran (with automatic dynamic shapes a later shape puts a dynamic graph in
    front of the static one; non-reentrant checkpoint refuses a replay whose saved tensors differ; not seen to fail
    on CPU, tests/train/test_train_compile.py passes either way). The H200 runs of 2026-12-01 measured the first
    form (bound methods, automatic dynamic shapes); this one has run on CPU only."""
    return torch.compile(function, dynamic=False)


def _configure_compiler() -> None:
    import warnings

    import torch._dynamo
    import torch._functorch.config

    # Every call: a config patch or a test's warnings context may have undone an earlier call's settings. Graphs are
    # static, so a deep model with several norm widths, chunk lengths and grad modes needs more than dynamo's 8.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    # KDA's short convolution is an autograd.Function; graphs holding one are otherwise left out of AOTAutograd's
    # cache, so every later process traces their joint graph again (CPU, tiny: a warm process's first step
    # 5.72-6.38 s -> 5.07-5.6 s, benchmarks/results/compile_cache_tiny_cpu_2026-12-02.json; on the H200 `base`'s
    # second run at 128k still took 27.5 s for its first step, first_step_cold_2026-12-02/README.md). The cache key
    # covers the function's traced forward and backward (torch's test_custom_autograd_function_miss), so a changed
    # function is a miss, not a stale graph.
    functorch_config = torch._functorch.config
    if hasattr(functorch_config, "autograd_cache_allow_custom_autograd_functions"):
        functorch_config.autograd_cache_allow_custom_autograd_functions = True
    # Inductor's note that it split a softmax reduction, raised once per graph: nothing a user can act on. Its text
    # begins with a newline, and the filter's pattern must match from the start.
    warnings.filterwarnings("ignore", message=r"\s*Online softmax is disabled", category=UserWarning)


def _check_cache_dir() -> Path:
    path = compile_cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        writable = os.access(path, os.W_OK)
    except OSError:
        writable = False
    if not writable:
        raise InputError("torch.compile's cache directory cannot be written", where=str(path),
                         fix="set TORCHINDUCTOR_CACHE_DIR to a writable directory, or train with --compile off")
    return path


def _cast_output(dtype: torch.dtype, module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output.to(dtype)


class Fp32MergeHyperConnection(HyperConnection):
    """A hyper-connection over bf16 streams whose merge adds its terms in fp32 and rounds to the streams' dtype once
    (set by :func:`apply_stream_dtype`; no state of its own). On CUDA that sum is the fused kernels'
    (genolc/model/ops/mhc/merge_triton.py), as measured in session 33, so :func:`apply_compile` leaves the merge
    uncompiled; where the kernels refuse the inputs (N streams not a power of two) or off CUDA, the reference formula
    then runs eagerly, N + 1 element-wise passes."""

    def merge(self, block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
              streams: torch.Tensor) -> torch.Tensor:
        return merge_streams(block_out, post, comb, streams, compute_dtype=torch.float32)


class StreamRMSNorm(RMSNorm):
    """A norm that reads the residual streams and hands its block their dtype (bf16) rather than its fp32 weight's,
    which autocast's matmuls would round to bf16 anyway (set by :func:`apply_stream_dtype`; no state of its own)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RMSNorm.forward(self, x).to(x.dtype)


def apply_stream_dtype(model: nn.Module, dtype: torch.dtype) -> torch.dtype:
    """Carry mHC's residual streams in ``dtype`` (bf16 under autocast; the trainer refuses it without).

    The streams start as copies of the embedding (genolc.model.layers.mhc.expand_streams) and keep its dtype: fp32
    under fp32 master weights, so each layer's mixing, block input and merge move fp32 ``[T, hc_mult, d]``
    tensors. Here the embedding's output is cast to ``dtype`` (a forward hook on the ``embed_tokens`` instance);
    every HyperConnection becomes a :class:`Fp32MergeHyperConnection`, and the norms that read the streams (each
    decoder layer's two and the final one) :class:`StreamRMSNorm`, so a token mixer or the experts get a bf16
    input instead of casting an fp32 one at every projection. Other norms (DSA's latent norms) are left as they
    are. Instances change class, not parameters: apply it before :func:`apply_compile`, which compiles each class's
    methods."""
    if any(getattr(module, _COMPILE_FLAG, False) for module in model.modules()):
        raise ValueError("apply_stream_dtype must come before apply_compile: the compiled methods are the classes'")
    model.get_submodule("embed_tokens").register_forward_hook(functools.partial(_cast_output, dtype))
    for module in model.modules():
        if type(module) is HyperConnection:
            module.__class__ = Fp32MergeHyperConnection
    stream_norms = [model.get_submodule("norm")]
    for layer in decoder_layers(model):
        stream_norms += [layer.input_layernorm, layer.post_attention_layernorm]
    for norm in stream_norms:
        if type(norm) is RMSNorm:
            norm.__class__ = StreamRMSNorm
    return dtype


def apply_compile(model: nn.Module) -> int:
    """torch.compile the per-token glue: every instance of the classes in :func:`_compiled_methods` gets those
    methods replaced by ``functools.partial(compiled class function, instance)`` (results equal to rounding; the
    first call of each input variant compiles, later runs load from :func:`compile_cache_dir`). Hooks and
    ``__call__`` stay eager around them; a deep copy of the model calls the copy's parameters (the partial's
    instance is copied, the compiled function shared). Applying twice is a no-op. Returns the instances compiled."""
    # Inductor reads the variable whenever it looks for its cache; set here so that the default is the user's cache
    # directory rather than /tmp (an explicit setting, the user's, is kept; an empty one would mean the cwd).
    cache = _check_cache_dir()
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    _configure_compiler()
    methods = _compiled_methods()
    compiled = 0
    for module in model.modules():
        names = methods.get(type(module))
        if not names or getattr(module, _COMPILE_FLAG, False):
            continue
        for name in names:
            setattr(module, name, functools.partial(_compiled_function(getattr(type(module), name)), module))
        setattr(module, _COMPILE_FLAG, True)
        compiled += 1
    return compiled


def compile_failures() -> tuple[type[BaseException], ...]:
    """The exceptions torch.compile raises when it cannot trace or build a graph (inductor's InductorError is one
    of them; dynamo re-raises AssertionError and IndexError unwrapped, which stay tracebacks)."""
    if "torch._dynamo" not in sys.modules:
        return ()
    import torch._dynamo.exc

    return (torch._dynamo.exc.TorchDynamoException,)


def compile_failure_text(error: BaseException) -> str:
    """What went wrong, in one line: the wrapped exception's type and first line (a BackendCompilerFailed's own
    first line is only "backend='inductor' raised:")."""
    inner = getattr(error, "inner_exception", None) or error
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")


def compile_ran_out_of_memory(error: BaseException) -> bool:
    """Whether a compile failure is the device running out of memory while compiling (dynamo may rewrap it)."""
    inner = getattr(error, "inner_exception", None)
    return isinstance(inner, torch.OutOfMemoryError) or str(error).startswith("OutOfMemoryError")


def compile_wanted(config: TrainConfig, device_type: str) -> bool:
    """``--compile auto`` compiles on CUDA only: on CPU the generated C++ costs more time to build than it saves."""
    return config.compile == "on" or (config.compile == "auto" and device_type == "cuda")


def apply_transforms(model: nn.Module, config: TrainConfig, device_type: str, *,
                     stream_dtype: str) -> list[str]:
    """Apply the configured transforms in the documented order; returns what was applied, for the run log.
    ``stream_dtype``: the run's resolved ``--stream-dtype`` (genolc.train.config.stream_dtype_for)."""
    applied = []
    if config.recompute:
        applied.append(f"recompute({apply_recompute(model)} layers)")
    if stream_dtype != "float32":
        applied.append(f"streams({apply_stream_dtype(model, getattr(torch, stream_dtype))})")
    if compile_wanted(config, device_type):
        applied.append(f"compile({apply_compile(model)} modules, cache {compile_cache_dir()})")
    return applied
