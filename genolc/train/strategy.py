"""How one micro-batch's forward and backward run: the whole window at once, or chunk by chunk.

Strategies, from the memory plan (genolc/train/plan.py), before the first step and on every device:

- ``whole``: one forward and backward over the window (with per-layer recompute when ``--recompute``): fastest
  while the window's activations fit;
- ``chunked``: the chunk-recurrent exact step (genolc/train/chunked.py): one chunk's activations plus the window's
  caches, two forwards (one for the last chunk) and one backward (within each chunk per-layer recompute again when
  ``--recompute``).

``--chunk auto`` (the default) takes ``whole`` when its estimate fits the device and otherwise the longest chunk that
fits; on a GPU, when that chunk is short (under ``FAST_UNRECOMPUTED_CHUNK`` where the first pass's pools are kept, else
under ``FAST_CHUNK``: the settings measured on the H200, plan.py), or none fits, and per-layer recompute lets chunks of
``FAST_CHUNK`` fit, it takes those with recompute, and when no chunk fits without recompute and ``FAST_CHUNK`` does not
fit with it, the longest that fits with it; ``--chunk off`` insists on ``whole``; ``--chunk 64k`` chooses the chunk. A
setting estimated not to fit is refused up front with the estimate and an option that fits, never discovered by the
kernel's OOM killer; a chunk the user chose runs, with a warning in its reason, when it fits once the plan's margin
(``PLAN_MARGIN``) is taken off.

A chunked step on the GPU that keeps its first pass's DSA pools keeps that pass's sparse-attention forwards too, in host
memory, so that its second pass runs only their backward (genolc/train/kept_attention.py), where they take at most half
the host memory this process may use and the device has room for one chunk's more (two under per-layer recompute).
Then, where the device has room for them and its chunks are at most ``KDA_KEEP_LONGEST_CHUNK`` (64k, the longest
measured), a chunked step on the GPU has fla keep its KDA intermediates from the second pass's forward for the backward
instead of computing them again (genolc/model/ops/kda/fla.py): one KDA call per chunk, unsegmented, and one pass of
fla's state kernel fewer (plan.py's ``kda_intermediates_device_bytes``).

Under ``--cp N`` (:func:`choose_context_parallel_strategy`) the same choice is made per rank from
estimate_context_parallel_memory: the rank's share of the window (or of each chunk) plus what the whole span adds.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from genolc.model import ModelConfig
from genolc.train.chunked import MicroBatchResult, chunked_forward_backward
from genolc.train.kept_attention import KeptAttention
from genolc.train.loss import LossTerms, micro_batch_loss
from genolc.train.measured import measured_utilisation
from genolc.errors import ConfigError
from genolc.train.plan import (FAST_CHUNK, FAST_UNRECOMPUTED_CHUNK, KDA_KEEP_LONGEST_CHUNK, PLAN_MARGIN,
                               SMALLEST_AUTO_CHUNK, OutOfMemoryPlanError, context_parallel_oom_error,
                               estimate_chunked_memory, estimate_context_parallel_memory, estimate_memory,
                               estimate_step_seconds, fits_within_margin, format_gib, kda_intermediates_device_bytes,
                               kept_attention_bytes, kept_attention_device_bytes, largest_fitting_chunk,
                               largest_fitting_context_parallel_chunk, oom_error)
from genolc.units import format_length


@dataclass(frozen=True)
class StepStrategy:
    """``chunk`` None: the whole window at once; else chunks of ``chunk`` tokens. ``estimate_bytes``: the plan's
    peak; ``reason``: why it was chosen (said once when training starts). ``keep_selections``: the chunked step
    keeps the DSA pools its first pass chose for its second (off where they do not fit, or where keeping them would
    cost chunks under ``FAST_UNRECOMPUTED_CHUNK`` or a step estimated to take longer: :func:`choose_strategy`).
    ``kept_attention_bytes``: host memory for the DSA forwards the chunked step keeps from its first pass (0: none
    kept). ``keep_kda_intermediates``: fla keeps KDA's intermediates for the chunks' backward (planned in
    ``estimate_bytes``)."""

    seq_len: int
    chunk: int | None
    recompute: bool
    estimate_bytes: int
    reason: str
    keep_selections: bool = True
    kept_attention_bytes: int = 0
    keep_kda_intermediates: bool = False

    @property
    def keep_attention(self) -> bool:
        """The chunked step keeps its first pass's DSA forwards, ``kept_attention_bytes`` of them in host memory
        (genolc/train/kept_attention.py; chosen by :func:`choose_strategy`)."""
        return self.kept_attention_bytes > 0

    @property
    def name(self) -> str:
        return "whole" if self.chunk is None else "chunked"

    def describe(self) -> str:
        how = "whole-window step" if self.chunk is None else f"chunked step, --chunk {format_length(self.chunk)}"
        extra = " with per-layer recompute" if self.recompute else ""
        return (f"--seq {format_length(self.seq_len)}: {how}{extra}, estimated peak "
                f"{format_gib(self.estimate_bytes)} GiB ({self.reason})")


def device_budget_bytes(device: torch.device) -> int:
    """Memory a run may plan for: the GPU's, or on CPU the memory available now (other processes keep theirs)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return host_available_bytes()


# Where a cgroup (a container's memory limit) says how much this process may use: v2, then v1 ((limit, usage) files).
CGROUP_MEMORY_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                       ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def host_free_bytes_per_process() -> int:
    """Host memory this process may page-lock: what is available now, no more than a cgroup memory limit leaves
    (page-locked memory counts against it, and MemAvailable does not see it), shared by the training processes of
    this host (``LOCAL_WORLD_SIZE``, which torchrun sets)."""
    free = host_available_bytes()
    for limit_file, usage_file in CGROUP_MEMORY_FILES:
        try:
            limit, usage = (int(Path(name).read_text().strip()) for name in (limit_file, usage_file))
        except (OSError, ValueError):            # absent, or "max": no limit at this level
            continue
        free = min(free, max(0, limit - usage))
        break
    try:
        processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        processes = 1
    return free // processes


def host_available_bytes() -> int:
    """The host memory available now (Linux's MemAvailable; elsewhere all of it)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choose_strategy(model_config: ModelConfig, *, seq_len: int, windows: int, grad_accum: int, chunk: int | None,
                    recompute: bool, bf16: bool, fast_kernels: bool, budget_bytes: int, multiple: int,
                    where: str, auto_recompute: bool = False, fp32_streams: bool = False,
                    host_free_bytes: int | None = None) -> StepStrategy:
    """The strategy for micro-batches of ``windows`` windows of ``seq_len`` tokens (see :func:`choose_chunking`); a
    chunked step on the fast kernels that keeps its first pass's pools also keeps its DSA forwards in host memory,
    where they take at most ``HOST_SHARE`` of ``host_free_bytes`` (None: not known, as for `genolc plan`; the trainer
    passes :func:`host_free_bytes_per_process`) and the device has room for what they add
    (genolc/train/plan.py's ``kept_attention_device_bytes``); then it keeps fla's KDA intermediates for the backward
    where the device has room for them too."""
    strategy = choose_chunking(model_config, seq_len=seq_len, windows=windows, grad_accum=grad_accum, chunk=chunk,
                               recompute=recompute, bf16=bf16, fast_kernels=fast_kernels, budget_bytes=budget_bytes,
                               multiple=multiple, where=where, auto_recompute=auto_recompute,
                               fp32_streams=fp32_streams)
    if not (fast_kernels and strategy.chunk is not None):
        return strategy
    if strategy.keep_selections and model_config.dsa_layers:
        strategy = _with_kept_attention(model_config, strategy, windows=windows, bf16=bf16,
                                        budget_bytes=budget_bytes, host_free_bytes=host_free_bytes)
    return _with_kda_intermediates(model_config, strategy, windows=windows, bf16=bf16, budget_bytes=budget_bytes)


# At most this share of the host memory free when training starts goes to the kept DSA forwards: the data, the
# checkpoint writer and the rest of the machine keep the other half.
HOST_SHARE = 0.5


def _with_kept_attention(config: ModelConfig, strategy: StepStrategy, *, windows: int, bf16: bool,
                         budget_bytes: int, host_free_bytes: int | None) -> StepStrategy:
    host = kept_attention_bytes(config, strategy.seq_len * windows, bf16)
    if host_free_bytes is not None and host > HOST_SHARE * host_free_bytes:
        return replace(strategy, reason=(
            f"{strategy.reason}; the DSA forwards are computed again in the second pass: keeping them would take "
            f"{format_gib(host)} GiB of host memory, more than {HOST_SHARE:.0%} of the {format_gib(host_free_bytes)} "
            "GiB free"))
    extra = int(kept_attention_device_bytes(config, chunk=strategy.chunk, windows=windows, bf16=bf16,
                                            recompute=strategy.recompute) * PLAN_MARGIN)
    return _where_the_device_has_room(
        strategy, extra, budget_bytes, refused="the DSA forwards are computed again in the second pass",
        kept=f"the first pass's DSA forwards wait in host memory for the second ({format_gib(host)} GiB)",
        kept_attention_bytes=host)


def _with_kda_intermediates(config: ModelConfig, strategy: StepStrategy, *, windows: int, bf16: bool,
                            budget_bytes: int) -> StepStrategy:
    if len(config.dsa_layers) == config.num_hidden_layers:
        return strategy
    if strategy.chunk > KDA_KEEP_LONGEST_CHUNK:
        return replace(strategy, reason=(
            f"{strategy.reason}; KDA's backward computes its intermediates again (they are kept only in chunks of "
            f"up to {format_length(KDA_KEEP_LONGEST_CHUNK)}, the longest measured)"))
    extra = int(kda_intermediates_device_bytes(config, chunk=strategy.chunk, windows=windows, bf16=bf16,
                                               recompute=strategy.recompute) * PLAN_MARGIN)
    return _where_the_device_has_room(
        strategy, extra, budget_bytes, refused="KDA's backward computes its intermediates again",
        kept=f"KDA keeps its intermediates for the backward ({format_gib(extra)} GiB)", keep_kda_intermediates=True)


def _where_the_device_has_room(strategy: StepStrategy, extra: int, budget_bytes: int, *, refused: str, kept: str,
                               **changes) -> StepStrategy:
    """``strategy`` with ``changes`` and ``extra`` bytes more in its estimate where that fits ``budget_bytes`` (its
    reason then adds ``kept``), else only its reason changed: ``refused``, and what keeping would need."""
    estimate = strategy.estimate_bytes + extra
    if estimate > budget_bytes:
        return replace(strategy, reason=(f"{strategy.reason}; {refused}: keeping them would need {format_gib(extra)} "
                                         "GiB more of the device"))
    return replace(strategy, estimate_bytes=estimate, reason=f"{strategy.reason}; {kept}", **changes)


def choose_chunking(model_config: ModelConfig, *, seq_len: int, windows: int, grad_accum: int, chunk: int | None,
                    recompute: bool, bf16: bool, fast_kernels: bool, budget_bytes: int, multiple: int,
                    where: str, auto_recompute: bool = False, fp32_streams: bool = False) -> StepStrategy:
    """The strategy for micro-batches of ``windows`` windows of ``seq_len`` tokens (module docstring);
    ``chunk``: None (auto), 0 (whole window only) or a chunk length. ``auto_recompute``: --chunk auto may add
    per-layer recompute to run chunks of ``FAST_CHUNK`` where none of ``FAST_UNRECOMPUTED_CHUNK`` fits without it,
    or, when no chunk fits without it and ``FAST_CHUNK`` does not fit with it, the longest chunk that fits with it
    (the caller applies it when the strategy says so). A chunked step keeps the pools its first pass chose (planned
    in) unless that does not fit outright, or it costs a chunk shorter than ``FAST_UNRECOMPUTED_CHUNK`` where not
    keeping them allows a longer one, or per-layer recompute estimated to cost more than choosing the pools again
    saves (:func:`_why_keeping_is_slower`); the step then chooses them again in its second pass. Raises
    OutOfMemoryPlanError when the asked (or, for auto, every) setting is estimated not to fit ``budget_bytes`` even
    so."""
    options = dict(seq_len=seq_len, windows=windows, grad_accum=grad_accum, chunk=chunk, recompute=recompute,
                   bf16=bf16, fast_kernels=fast_kernels, budget_bytes=budget_bytes, multiple=multiple, where=where,
                   auto_recompute=auto_recompute, fp32_streams=fp32_streams)
    try:
        kept_strategy = _choose_strategy(model_config, keep_selections=True, **options)
    except OutOfMemoryPlanError:
        kept_strategy = None
    if kept_strategy is not None and kept_strategy.chunk is None:
        return kept_strategy
    try:
        strategy = _choose_strategy(model_config, keep_selections=False, **options)
    except OutOfMemoryPlanError:
        if kept_strategy is None:
            raise
        return kept_strategy
    fits = kept_strategy is not None and kept_strategy.estimate_bytes <= budget_bytes
    slower = _why_keeping_is_slower(model_config, kept_strategy, strategy, windows) if fits else None
    if fits and slower is None:
        return kept_strategy
    if strategy.chunk is None:
        return strategy
    why = slower or "keeping the first pass's does not fit"
    return replace(strategy, keep_selections=False,
                   reason=f"{strategy.reason}; the DSA pools are chosen again in the second pass: {why}")


def _why_keeping_is_slower(config: ModelConfig, kept: StepStrategy, chosen_again: StepStrategy,
                           windows: int) -> str | None:
    """Why the chunked step that keeps the pools (``kept``) should give way to ``chosen_again``, or None when it should
    not: it runs short chunks where the other's are longer (under ``FAST_UNRECOMPUTED_CHUNK`` without recompute, under
    ``FAST_CHUNK`` with it; 8k chunks ran several times slower, plan.py), or its step is estimated longer
    (genolc/train/plan.py's estimate at `genolc plan`'s measured utilisation: a recomputed forward against the indexer's
    second, or second and third, pass)."""
    if chosen_again.chunk is None:
        return "keeping the first pass's does not leave room for the whole window"
    short = FAST_CHUNK if kept.recompute else FAST_UNRECOMPUTED_CHUNK
    if kept.chunk < chosen_again.chunk and kept.chunk < short:
        return (f"keeping the first pass's would cut the chunks to {format_length(kept.chunk)}, and chunks under "
                f"{format_length(short)} run slower")

    def seconds(strategy: StepStrategy, passes: int) -> float:
        forwards = 2 + int(strategy.recompute)
        return estimate_step_seconds(config, seq_len=strategy.seq_len, tokens_per_step=strategy.seq_len * windows,
                                     mfu=measured_utilisation(config), forwards=forwards, indexer_passes=passes)

    if seconds(chosen_again, 2 + int(chosen_again.recompute)) >= seconds(kept, 1):
        return None
    shapes = [format_length(s.chunk) + (" with recompute" if s.recompute else "") for s in (kept, chosen_again)]
    return f"keeping the first pass's is estimated to take longer ({shapes[0]} chunks against {shapes[1]})"


def _choose_strategy(model_config: ModelConfig, *, seq_len: int, windows: int, grad_accum: int, chunk: int | None,
                     recompute: bool, bf16: bool, fast_kernels: bool, budget_bytes: int, multiple: int,
                     where: str, auto_recompute: bool, keep_selections: bool, fp32_streams: bool) -> StepStrategy:
    plan_args = dict(windows=windows, bf16=bf16, recompute=recompute, fast_kernels=fast_kernels,
                     fp32_streams=fp32_streams)
    chunked_args = dict(keep_selections=keep_selections)
    budget = f"{format_gib(budget_bytes)} GiB"
    whole = estimate_memory(model_config, seq_len=seq_len, **plan_args).total
    if chunk == 0 or (chunk is None and whole <= budget_bytes):
        if whole > budget_bytes:
            raise _refusal(model_config, seq_len, windows, grad_accum, recompute, bf16, fast_kernels, budget_bytes,
                           multiple, where, whole_only=chunk == 0, fp32_streams=fp32_streams)
        reason = "--chunk off" if chunk == 0 else f"fits the {budget} device"
        return StepStrategy(seq_len, None, recompute, whole, reason)
    if chunk is None:
        smallest = max(multiple, SMALLEST_AUTO_CHUNK)
        chosen = largest_fitting_chunk(model_config, seq_len=seq_len, budget_bytes=budget_bytes, multiple=multiple,
                                       smallest=smallest, **plan_args, **chunked_args)
        needs = f"the whole window needs an estimated {format_gib(whole)} GiB of the {budget} device"
        reason = f"{needs}; choose with --chunk"
        if auto_recompute and not recompute:
            recomputed = {**plan_args, "recompute": True}
            # 16k chunks without recompute were measured only with the first pass's pools kept; a step that chooses
            # them again pays a second indexer pass no run has weighed against recompute, so FAST_CHUNK holds there.
            chosen, why = _recompute_rather_than(
                chosen, seq_len=seq_len, multiple=multiple, budget_bytes=budget_bytes,
                fast_unrecomputed=FAST_UNRECOMPUTED_CHUNK if keep_selections else FAST_CHUNK,
                qualifier="" if keep_selections else "with the DSA pools chosen again, ",
                recomputed_bytes=lambda c: estimate_chunked_memory(model_config, seq_len=seq_len, chunk=c,
                                                                   **recomputed, **chunked_args).total,
                longest_recomputed=lambda: largest_fitting_chunk(model_config, seq_len=seq_len,
                                                                 budget_bytes=budget_bytes, multiple=multiple,
                                                                 smallest=smallest, **recomputed, **chunked_args))
            if why:
                reason = f"{needs}; recompute added because {why}; choose with --chunk"
                recompute, plan_args = True, recomputed
        if chosen is None:
            raise _refusal(model_config, seq_len, windows, grad_accum, recompute, bf16, fast_kernels, budget_bytes,
                           multiple, where, fp32_streams=fp32_streams)
        estimate = estimate_chunked_memory(model_config, seq_len=seq_len, chunk=chosen, **plan_args,
                                           **chunked_args).total
        return StepStrategy(seq_len, chosen, recompute, estimate, reason)
    if chunk >= seq_len:
        if whole > budget_bytes:
            raise _refusal(model_config, seq_len, windows, grad_accum, recompute, bf16, fast_kernels, budget_bytes,
                           multiple, where, fp32_streams=fp32_streams)
        return StepStrategy(seq_len, None, recompute, whole, f"--chunk {format_length(chunk)} covers the window")
    estimate = estimate_chunked_memory(model_config, seq_len=seq_len, chunk=chunk, **plan_args, **chunked_args).total
    if estimate > budget_bytes and not fits_within_margin(estimate, budget_bytes):
        raise _refusal(model_config, seq_len, windows, grad_accum, recompute, bf16, fast_kernels, budget_bytes,
                       multiple, where, chunk=chunk, fp32_streams=fp32_streams)
    return StepStrategy(seq_len, chunk, recompute, estimate, _as_asked(estimate, budget_bytes))


def _recompute_rather_than(chosen: int | None, *, seq_len: int, multiple: int, budget_bytes: int,
                           fast_unrecomputed: int, qualifier: str, recomputed_bytes: Callable[[int], int],
                           longest_recomputed: Callable[[], int | None]) -> tuple[int | None, str | None]:
    """--chunk auto's recompute rule on a GPU (module docstring), given ``chosen``, the longest chunk that fits
    without recompute (None: none): the chunk to run and why recompute was added, or ``(chosen, None)`` to run
    without it. ``fast_unrecomputed``: the shortest chunk that runs faster without recompute than ``FAST_CHUNK``
    with it; ``qualifier`` goes before "chunks under" in the reason. ``recomputed_bytes(chunk)`` and
    ``longest_recomputed()`` are the plan with recompute."""
    if chosen is not None and chosen >= fast_unrecomputed:
        return chosen, None
    if seq_len > FAST_CHUNK and FAST_CHUNK % multiple == 0 and recomputed_bytes(FAST_CHUNK) <= budget_bytes:
        if chosen is None:
            return FAST_CHUNK, "no chunk fits without it"
        return FAST_CHUNK, (f"without it the longest chunk that fits is {format_length(chosen)}, and {qualifier}"
                            f"chunks under {format_length(fast_unrecomputed)} run slower than a recomputed forward "
                            "costs")
    if chosen is None:
        longest = longest_recomputed()
        if longest is not None:
            return longest, "no chunk fits without it"
    return chosen, None


def _as_asked(estimate: int, budget_bytes: int) -> str:
    if estimate <= budget_bytes:
        return "as asked"
    return (f"as asked, though over the {format_gib(budget_bytes)} GiB device once the plan's "
            f"{PLAN_MARGIN - 1:.0%} margin is added: it may run out of memory")


def _refusal(model_config, seq_len, windows, grad_accum, recompute, bf16, fast_kernels, budget_bytes, multiple, where,
             chunk=None, whole_only=False, fp32_streams=False):
    return oom_error(model_config, seq_len=seq_len, micro_batch=windows, grad_accum=grad_accum, recompute=recompute,
                     bf16=bf16, budget_bytes=budget_bytes, where=where, fast_kernels=fast_kernels,
                     fp32_streams=fp32_streams, chunk=chunk, chunk_multiple=multiple, whole_only=whole_only)


def run_micro_batch(strategy: StepStrategy, model: torch.nn.Module, ids: torch.Tensor, weights: torch.Tensor,
                    terms: LossTerms, autocast: Callable[[], AbstractContextManager],
                    on_loss: Callable[[torch.Tensor], torch.Tensor],
                    kept_attention: KeptAttention | None = None) -> MicroBatchResult:
    """Forward and backward of ``ids [B, T + 1]`` (target weights ``[B, T]``) by ``strategy``; parameters'
    ``.grad`` accumulate. ``on_loss`` sees (and may replace, or refuse by raising) each loss before backward.
    ``kept_attention``: where a strategy that keeps its DSA forwards keeps them (the caller's, reused step after
    step for its page-locked buffers; one is made for this micro-batch when not given)."""
    if strategy.chunk is not None:
        if strategy.keep_attention and kept_attention is None:
            kept_attention = KeptAttention()
        return chunked_forward_backward(model, ids, weights, terms, strategy.chunk, autocast, on_loss,
                                        keep_selections=strategy.keep_selections,
                                        kept_attention=kept_attention if strategy.keep_attention else None,
                                        keep_kda_intermediates=strategy.keep_kda_intermediates)
    return whole_forward_backward(model, ids[:, :-1], ids[:, 1:], weights, terms, autocast, on_loss)


def whole_forward_backward(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor,
                           terms: LossTerms, autocast: Callable[[], AbstractContextManager],
                           on_loss: Callable[[torch.Tensor], torch.Tensor]) -> MicroBatchResult:
    """One forward and backward of ``inputs [B, T]`` against ``targets`` / ``weights [B, T]``: the whole window, or
    under context parallelism this rank's pieces of it (genolc/parallel/step.py)."""
    with autocast():
        out = model(inputs, indexer_loss=terms.indexer_mode)
    parts = micro_batch_loss(out, targets, weights, terms)
    loss = on_loss(parts.loss)
    loss.backward()
    return MicroBatchResult(lm=parts.lm.double().cpu(), aux=parts.aux, tokens_per_expert=out.tokens_per_expert)


def choose_context_parallel_strategy(config: ModelConfig, *, seq_len: int, cp: int, pieces: int, windows: int,
                                     chunk: int | None, recompute: bool, bf16: bool, fast_kernels: bool,
                                     budget_bytes: int, multiple: int, where: str,
                                     auto_recompute: bool = False, fp32_streams: bool = False) -> StepStrategy:
    """The step strategy of one rank of ``--cp cp`` (``pieces``: the layout's pieces per span), as
    :func:`choose_strategy` chooses for one process but from estimate_context_parallel_memory (genolc/train/plan.py, the
    rank's share plus what the span adds): the whole window when it fits (or ``chunk`` is 0 or covers the window), else
    ``chunk`` or, for None (auto), the longest chunk that fits (``auto_recompute``: or chunks of ``FAST_CHUNK`` with
    per-layer recompute where the longest chunk without it is under ``FAST_CHUNK``, the chunk counted whole, not per
    rank: the window's caches are read once per chunk on every rank). Raises OutOfMemoryPlanError when the setting is
    estimated not to fit ``budget_bytes``, ConfigError for a last chunk shorter than ``pieces``."""
    plan_args = dict(cp=cp, windows=windows, recompute=recompute, bf16=bf16, fast_kernels=fast_kernels,
                     fp32_streams=fp32_streams)
    # A chunk is cut into the layout's pieces, each a multiple of the kernels' chunk.
    chunk_multiple = multiple * pieces if multiple > 1 else 1

    def refusal(asked: int | None) -> OutOfMemoryPlanError:
        return context_parallel_oom_error(config, seq_len=seq_len, chunk=asked, budget_bytes=budget_bytes,
                                          chunk_multiple=chunk_multiple, where=where, **plan_args)

    share = -(-seq_len // cp)
    whole = estimate_context_parallel_memory(config, seq_len=seq_len, **plan_args).total
    if chunk == 0 or (chunk is not None and chunk >= seq_len) or (chunk is None and whole <= budget_bytes):
        if whole > budget_bytes:
            raise refusal(None)
        return StepStrategy(share, None, recompute, whole,
                            f"--cp {cp}: this rank's {share} of the window's {seq_len} tokens, run whole",
                            keep_selections=False)
    if chunk is None:
        chunk = largest_fitting_context_parallel_chunk(config, seq_len=seq_len, budget_bytes=budget_bytes,
                                                       multiple=chunk_multiple,
                                                       smallest=max(chunk_multiple, SMALLEST_AUTO_CHUNK * cp),
                                                       **plan_args)
        needs = (f"the whole window needs an estimated {format_gib(whole)} GiB per rank of the "
                 f"{format_gib(budget_bytes)} GiB device")
        reason = f"{needs}; choose with --chunk"
        if auto_recompute and not recompute:
            recomputed = {**plan_args, "recompute": True}
            # FAST_UNRECOMPUTED_CHUNK was measured on one GPU; under --cp a rank runs a share of each chunk.
            chunk, why = _recompute_rather_than(
                chunk, seq_len=seq_len, multiple=chunk_multiple, budget_bytes=budget_bytes,
                fast_unrecomputed=FAST_CHUNK, qualifier="",
                recomputed_bytes=lambda c: estimate_context_parallel_memory(config, seq_len=seq_len, chunk=c,
                                                                            **recomputed).total,
                longest_recomputed=lambda: largest_fitting_context_parallel_chunk(
                    config, seq_len=seq_len, budget_bytes=budget_bytes, multiple=chunk_multiple,
                    smallest=max(chunk_multiple, SMALLEST_AUTO_CHUNK * cp), **recomputed))
            if why:
                reason = f"{needs}; recompute added because {why}; choose with --chunk"
                recompute, plan_args = True, recomputed
        if chunk is None:
            raise refusal(None)
        estimate = estimate_context_parallel_memory(config, seq_len=seq_len, chunk=chunk, **plan_args).total
        if estimate > budget_bytes:
            raise refusal(chunk)
    else:
        estimate = estimate_context_parallel_memory(config, seq_len=seq_len, chunk=chunk, **plan_args).total
        if estimate > budget_bytes and not fits_within_margin(estimate, budget_bytes):
            raise refusal(chunk)
        reason = _as_asked(estimate, budget_bytes)
    last = seq_len % chunk
    if last and last < pieces:
        raise ConfigError(f"the last chunk of a {seq_len}-token window in chunks of {chunk} has {last} tokens, fewer "
                          f"than the {pieces} pieces --cp {cp} cuts each chunk into", where="--chunk / --cp",
                          fix="choose a --chunk that divides --seq")
    # Each rank's pieces choose their pools in every pass (genolc/parallel/dsa_cp.py): nothing is kept.
    return StepStrategy(seq_len, chunk, recompute, estimate, keep_selections=False, reason=(
        f"--cp {cp}: chunks of {format_length(chunk)} split over the ranks, {format_length(-(-chunk // cp))} tokens "
        f"each; {reason}"))
