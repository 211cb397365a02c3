"""`finetune(config) -> Path`: the training loop behind `genolc finetune`.

One optimizer step (see :mod:`genolc.train.schedule` for its shape), read top to bottom in ``_Trainer._step``:
  1. For each of ``grad_accum`` micro-batches the sampler's windows are read into ``[B, T + 1]`` token ids and
     per-target weights (:mod:`genolc.train.batch`: N masked, soft-masked repeats weighted).
  2. The loss (:mod:`genolc.train.loss`): ``sum(w * CE) / sum(w)`` over all targets of all the step's
     micro-batches, so accumulation gives the same gradient as one large batch, plus the model's auxiliary losses
     averaged over micro-batches: ``moe_balance_coef * moe_balance`` and, when the indexer is trained,
     ``indexer_kl_coef * indexer_kl`` (``indexer_loss='dense'|'sparse'`` per
     :func:`genolc.train.schedule.indexer_mode_at`).
  3. Forward and backward of each micro-batch by the step strategy (:mod:`genolc.train.strategy`), chosen from the
     memory plan before the first step: the whole window at once, or chunk by chunk with exact gradients
     (:mod:`genolc.train.chunked`, ``--chunk``); a setting that does not fit is refused before any step. Under
     torchrun (:mod:`genolc.parallel`) each context-parallel rank runs its share of every window (or chunk), and the
     step's gradients, loss and MoE load are then summed over all ranks.
  4. Then the loss and gradient norm are checked (NaN/Inf stops the run with
     :class:`~genolc.train.state.NonFiniteLossError`, keeping the last good checkpoint), gradients are clipped to
     ``grad_clip`` and AdamW steps with the scheduled learning rate.
  5. Each MoE router's correction bias moves by ``moe_bias_rate`` towards balanced load, from the tokens per expert
     summed over the step's micro-batches (auxiliary-loss-free balancing, :mod:`genolc.train.balance`).
Compute: bf16 autocast on CUDA (fp32 master weights and optimizer), fp32 on CPU; torch's CPU threads and
deterministic mode per ``config.threads`` / ``config.deterministic`` (:mod:`genolc.threads`,
:mod:`genolc.determinism`), both recorded in ``summary.json`` and the run record.

Stopping: the first SIGINT (Ctrl-C) or SIGTERM lets the current step finish, saves a checkpoint of it, writes
``summary.json`` with status "interrupted" and raises :class:`TrainingInterrupted` (exit code 128 + signal number,
one message naming the checkpoint to ``--resume`` from); a second one stops at once without saving.

Outputs under ``config.out``: ``checkpoints/step-NNNNNN/`` (:mod:`genolc.train.state`), ``metrics.jsonl`` (one
line per step: step, loss, tokens, lr, tokens_per_s, model_flops_per_token, mfu and hfu on a GPU of
genolc/train/flops.py's table, grad_norm, seq_len, aux losses, per-MoE-layer load
``moe_load_max_over_mean`` / ``moe_load_min_over_mean``, ``memory_gib`` (peak device memory; host RSS on CPU),
``host_memory_gib`` (peak host RSS), under torchrun both per rank, ...), ``summary.json`` and
``runs/`` (the run record). The returned path is the final checkpoint, a model directory ``genolc eval`` reads.

Starting points: a preset (``config.model``) sized to the dataset tokenizer's vocabulary; or ``config.init``, a
genolc checkpoint (its tokenizer must equal the dataset's) or a transformers-layout GLM-5.3-Flash checkpoint with a
text vocabulary, whose embedding and LM-head rows are resized to the genome tokenizer by
:func:`genolc.model.resize_vocab` (every transformer-block weight is kept; see that function for the
embedding rows).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from genolc.determinism import ComputeSettings, compute_settings, note_kernels
from genolc.errors import ConfigError, InputError
from genolc.fsutil import atomic_write_json, ensure_writable_parent
from genolc.parallel.launch import writes_outputs
from genolc.parallel.collectives import all_reduce_counts
from genolc.parallel.step import all_reduce_gradients, context_parallel_forward_backward
from genolc.runs import RunRecord, run_record
from genolc.signals import Interrupted, StopSignals
from genolc.train import state as ckpt
from genolc.train.apply import (apply_transforms, compile_cache_dir, compile_failure_text, compile_failures,
                                compile_ran_out_of_memory)
from genolc.train.balance import add_expert_counts, load_balance_metrics, update_router_bias
from genolc.train.batch import read_micro_batch
from genolc.train.chunked import chunked_forward_backward
from genolc.train.config import TrainConfig, stream_dtype_for
from genolc.train.dashboards import StepMonitor
from genolc.train.flops import fill_fraction, token_flops
from genolc.train.kept_attention import KeptAttention
from genolc.train.loss import LossTerms
from genolc.train.optimizer import build_adamw
from genolc.train.plan import check_window_lengths
from genolc.train.run_checkpoints import RunCheckpoints, check_checkpoint_tokenizer, find_resume_point
from genolc.train.schedule import indexer_mode_at, lr_at, stage_lengths, step_shape
from genolc.train.step_metrics import Throughput, allocator_retries, device_peak_gib, host_peak_gib, peak_flops
from genolc.train.step_plans import StepPlans
from genolc.train.strategy import run_micro_batch
from genolc.units import format_length

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


@dataclass
class TrainHooks:
    """Callbacks for tests and experiments; the loop runs the same without them.

    ``on_loss(step, micro, loss) -> loss`` sees (and may replace) each micro-batch's loss before backward;
    ``on_step_end(step, metrics)`` runs after a step is logged and its checkpoint, if one is due, saved or being
    written in the background (``step`` = steps completed).
    """

    on_loss: Callable[[int, int, torch.Tensor], torch.Tensor] | None = None
    on_step_end: Callable[[int, dict[str, Any]], None] | None = None


def finetune(config: TrainConfig, hooks: TrainHooks | None = None) -> Path:
    """Train per ``config`` and return the final checkpoint directory (see the module docstring).

    Under torchrun every process calls this; only global rank 0 writes the run's files (genolc.parallel.launch)."""
    writes = writes_outputs()
    record_block = run_record("finetune", config.out, config.reported()) if writes else \
        contextlib.nullcontext(RunRecord("finetune", {}, config.out))
    with record_block as record, compute_settings(config.threads, config.deterministic, _say, record) as compute:
        trainer = _Trainer(config, hooks or TrainHooks(), compute)
        record.add_input(config.data / "manifest.json")
        try:
            final = trainer.run()
        finally:
            # This invocation's own figures: a later --resume rewrites summary.json, not this record.
            if trainer.figures:
                record.outputs["figures"] = trainer.figures
        record.outputs.update({"checkpoint": str(final), "summary": str(config.out / SUMMARY),
                               "metrics": str(config.out / METRICS), "routing": trainer.monitor.run_routing})
        # Only after success: a rank that failed leaves the others in a collective, and torchrun ends them all.
        trainer.close()
        return final


def _say(message: str) -> None:
    if not writes_outputs():
        return      # under torchrun rank 0 speaks for every rank
    tqdm.write(f"genolc finetune: {message}", file=sys.stderr)   # above the progress bar, not through it


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but no CUDA device is visible", fix="use --device cpu or auto")
    return torch.device(name)


class _Trainer:
    def __init__(self, config: TrainConfig, hooks: TrainHooks, compute: ComputeSettings) -> None:
        self.config = config
        self.hooks = hooks
        self.compute = compute
        self.figures: dict[str, Any] = {}   # the last summary's key figures, for the run record
        self.device = resolve_device(config.device)
        from genolc.parallel.mesh import init_mesh

        self.mesh = init_mesh(config.cp, self.device.type)
        self.bf16 = config.dtype == "bfloat16" or (config.dtype == "auto" and self.device.type == "cuda")
        self.stream_dtype = stream_dtype_for(config, self.bf16)
        from genolc.data.dataset import PreparedDataset

        self.dataset = PreparedDataset(config.data)   # its own clear errors: missing, not a dataset, too new
        self.tokenizer = self.dataset.tokenizer
        self._check_lengths()
        if config.out.exists() and not config.out.is_dir():
            raise InputError("--out is a file, not a run directory", where=str(config.out),
                             fix="choose a new or existing directory with --out")
        self.root = ckpt.checkpoint_root(config.out)
        if self.mesh.writes:
            ensure_writable_parent(config.out / METRICS, what="run directory")
            for stale in ckpt.sweep_temporaries(self.root):
                _say(f"removed a half-written checkpoint left by an interrupted save: {stale.name}")
        self._barrier()   # the other ranks look for checkpoints only after rank 0 has swept
        self.resume_from = find_resume_point(self.root, config, self.tokenizer, _say)
        self.model = self._build_model()
        note_kernels(compute.determinism, self.device.type, self.model.config.layer_types, _say)
        if self.device.type == "cpu":
            threads = compute.threads.threads
            _say(f"{threads} CPU thread{'s' if threads > 1 else ''} ({compute.threads.rule})")
        self.applied = apply_transforms(self.model, config, self.device.type, stream_dtype=self.stream_dtype)
        self.compiled = any(name.startswith("compile(") for name in self.applied)
        if self.compiled:
            _say(f"torch.compile builds the per-token glue in the first step of each new chunk shape (20-30 s on a "
                 f"GPU; kept in {compile_cache_dir()} for later runs; --compile off runs it eagerly)")
        if self.device.type == "cuda" and self.mesh.writes:
            from genolc.model.ops.kda.fla_tuning import autotune_note, fla_gpu_name

            note = autotune_note(fla_gpu_name(), self.model.config,
                                 self.mesh.cp_size if config.cp_kda == "heads" else 1, self.bf16)
            if note:
                _say(note)
        self.context = None
        if self.mesh.cp_size > 1:
            # Last, as genolc/train/apply.py orders the transforms: it changes the shapes the others see at run time.
            from genolc.parallel.apply import apply_context_parallel

            self.context = apply_context_parallel(self.model, self.mesh.cp_group, config.cp_layout, config.cp_kda)
            self.applied.append(f"context_parallel(cp={self.mesh.cp_size}, {config.cp_layout}, kda {config.cp_kda})")
        if self.mesh.distributed:
            _say(f"{self.mesh.world_size} processes: {self.mesh.dp_size} data-parallel x {self.mesh.cp_size} "
                 f"context-parallel ({config.cp_layout})")
        self.monitor = StepMonitor(config if self.mesh.writes else config.replace(log=()), self.model)
        self.optimizer = self._build_optimizer()
        self.samplers: dict[int, Any] = {}
        self.plans = StepPlans(self.model, config, device=self.device, bf16=self.bf16, stream_dtype=self.stream_dtype,
                               cp_size=self.mesh.cp_size, applied=self.applied, say=_say)
        # Where a chunked step keeps its first pass's DSA forwards: one for the run, whose page-locked host buffers
        # every step reuses.
        self.kept_attention = KeptAttention()
        self.start_step, self.tokens_seen, self.targets_seen = 0, 0, 0
        if self.resume_from is not None:
            saved = ckpt.load_checkpoint(self.resume_from, model=self.model, optimizer=self.optimizer)
            self.start_step = int(saved["step"])
            self.tokens_seen = int(saved["tokens_seen"])
            self.targets_seen = int(saved["targets_seen"])
            for length, sampler_state in saved["samplers"].items():
                self._sampler(int(length)).load_state_dict(sampler_state)
            _say(f"resuming from {self.resume_from} (step {self.start_step})")
        # Checkpoints before the last are written in the background (genolc/train/background_save.py).
        self.checkpoints = RunCheckpoints(config.out, tokenizer=self.tokenizer, keep=config.keep_checkpoints,
                                          writes=self.mesh.writes, barrier=self._barrier, say=_say,
                                          resumed_from=self.resume_from)
        self.throughput = Throughput(peak_flops(self.device, bf16=self.bf16, devices=self.mesh.world_size))
        self._peak_ranks: list[float] | None = None     # every rank's peak memory so far (distributed runs)
        self._host_peak_ranks: list[float] | None = None  # every rank's peak host RSS so far (distributed runs)

    def _check_lengths(self) -> None:
        cfg = self.config
        keys = self.dataset.keys("train")
        if not keys:
            raise InputError("the dataset has no train records", where=str(cfg.data),
                             fix="prepare it with --train naming at least one chromosome (or --train all)")
        lengths = {k: int(self.dataset.record(k)["length_tokens"]) for k in keys}
        longest = max(lengths, key=lengths.__getitem__)
        if cfg.seq_len + 1 > lengths[longest]:
            raise ConfigError(
                f"--seq {format_length(cfg.seq_len)} ({cfg.seq_len} tokens, + 1 for the last target) is longer than "
                f"every training chromosome; the longest, {longest}, has {lengths[longest]} tokens",
                where=str(cfg.data), fix=f"use --seq {lengths[longest] - 1} or less, or prepare longer chromosomes")
        check_window_lengths(stage_lengths(cfg), self.device.type, cfg.cp, cfg.cp_layout)

    def _build_model(self) -> torch.nn.Module:
        from genolc.model import ModelConfig, build_model, load_pretrained, preset, resize_vocab

        cfg = self.config
        torch.manual_seed(cfg.seed)
        vocab = self.tokenizer.vocab_size
        if self.resume_from is not None:
            # Built fresh and filled by copy (load_checkpoint), not assigned from the safetensors buffers: their
            # alignment differs from freshly allocated tensors, and vectorised CPU kernels then round differently in
            # the last bit, which would break bitwise-exact resume.
            model = build_model(ModelConfig.from_hf(self.resume_from), device=self.device)
        elif cfg.init is not None:
            if not cfg.init.exists():
                raise InputError("--init checkpoint not found", where=str(cfg.init),
                                 fix="pass a genolc checkpoint directory or a transformers GLM-5.3-Flash checkpoint")
            genome_tokenizer = check_checkpoint_tokenizer(cfg.init, self.tokenizer, cfg.data)
            model = load_pretrained(cfg.init)
            if model.config.vocab_size != vocab:
                if genome_tokenizer:
                    raise InputError(f"the checkpoint's vocabulary ({model.config.vocab_size}) does not match its "
                                     f"tokenizer ({vocab})", where=str(cfg.init))
                _say(f"--init: resizing the vocabulary from {model.config.vocab_size} text tokens to {vocab} genome "
                     f"tokens: every transformer-block weight is kept, and the first "
                     f"{min(vocab, model.config.vocab_size)}"
                     " rows of the embedding and LM head (text tokens, so they carry little); any new rows start "
                     "fresh")
                model = resize_vocab(model, vocab)
        else:
            # Initialised where it trains: on a GPU in well under a second (CUDA's generator, seeded by --seed like
            # the CPU's: a GPU run starts from other weights than a CPU run of the same seed), where the CPU took
            # ~25 s for `base` on the H200 machine (benchmarks/results/first_step_cold_2026-12-01_warmup/).
            model = build_model(preset(cfg.model, vocab_size=vocab), device=self.device)
            if self.mesh.distributed:
                from genolc.parallel.collectives import broadcast_module

                broadcast_module(model)
        return model.to(self.device)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        return build_adamw(self.model, lr=lr_at(0, cfg), betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)

    def _sampler(self, length: int):
        from genolc.data.sampler import TrainSampler

        if length not in self.samplers:
            mesh = self.mesh
            self.samplers[length] = TrainSampler(self.dataset, length, seed=self.config.seed,
                                                 max_n_fraction=self.config.max_n_fraction,
                                                 reverse_complement=self.config.reverse_complement,
                                                 dp_rank=mesh.dp_rank, dp_size=mesh.dp_size)
        return self.samplers[length]

    def _step(self, step: int) -> dict[str, Any]:
        cfg = self.config
        shape = step_shape(step, cfg)
        strategy = self.plans.for_shape(shape)
        lr = lr_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        mode = indexer_mode_at(step, cfg)
        batches = [read_micro_batch(self.dataset, self._sampler(shape.seq_len), step, shape, m,
                                    self.config.softmask_weight) for m in range(shape.grad_accum)]
        total_weight = float(sum(float(w.sum()) for _, w in batches))
        if self.mesh.dp_size > 1:
            total_weight = self._sum_over(total_weight, self.mesh.dp_group)
        if total_weight <= 0:
            raise InputError(f"every target of step {step + 1} is ambiguous (N)", where=str(cfg.data),
                             fix="lower --max-n-fraction so windows full of N are skipped")
        # The auxiliary losses are averaged over the step's micro-batches on every data-parallel rank.
        terms = LossTerms(total_weight=total_weight, grad_accum=shape.grad_accum * self.mesh.dp_size,
                          moe_balance_coef=cfg.moe_balance_coef, indexer_kl_coef=cfg.indexer_kl_coef,
                          indexer_mode=mode)
        lm_loss = torch.zeros((), dtype=torch.float64)
        aux_sums: dict[str, float] = {}
        expert_counts: dict[int, torch.Tensor] = {}
        results = []
        for micro, (ids, weights) in enumerate(batches):
            ids, weights = ids.to(self.device), weights.to(self.device)
            nonfinite = torch.zeros((), dtype=torch.float32, device=self.device)
            on_loss = functools.partial(self._checked_loss, step, micro, nonfinite)
            if self.context is not None and strategy.chunk is not None:
                result = chunked_forward_backward(self.model, ids, weights, terms, strategy.chunk, self._autocast,
                                                  on_loss, shard=self.context)
            elif self.context is not None:
                result = context_parallel_forward_backward(self.model, self.context, ids, weights, terms,
                                                           self._autocast, on_loss)
            else:
                result = run_micro_batch(strategy, self.model, ids, weights, terms, self._autocast, on_loss,
                                         kept_attention=self.kept_attention)
            if not self.mesh.distributed and not math.isfinite(bad := float(nonfinite)):
                raise self._diverged(step, f"loss is {bad}")
            results.append(result)
            add_expert_counts(expert_counts, result.tokens_per_expert)
            for name, value in result.aux.items():
                aux_sums[name] = aux_sums.get(name, 0.0) + float(value)
            lm_loss += result.lm
        targets = int(sum(int((w > 0).sum()) for _, w in batches))
        if self.mesh.distributed:
            # Every rank holds a share of the step's gradient, loss and expert load: sum them over the mesh, so
            # every replica clips, steps and moves its router biases alike (MoE counts before the bias update).
            all_reduce_gradients(self.model)
            expert_counts = all_reduce_counts(expert_counts)
            lm_loss = torch.tensor(self._sum_over(float(lm_loss)), dtype=torch.float64)
            aux_sums = {name: self._sum_over(value) for name, value in sorted(aux_sums.items())}
            targets = int(self._sum_over(float(targets), self.mesh.dp_group)) if self.mesh.dp_size > 1 else targets
        clip = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        if not math.isfinite(grad_norm):
            raise self._diverged(step, f"gradient norm is {grad_norm}")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        update_router_bias(self.model, expert_counts, cfg.moe_bias_rate)
        self.tokens_seen += shape.tokens * self.mesh.dp_size
        self.targets_seen += targets
        metrics: dict[str, Any] = {"step": step + 1, "loss": float(lm_loss), "tokens": self.tokens_seen,
                                   "lr": lr, "grad_norm": grad_norm, "seq_len": shape.seq_len,
                                   "windows_per_micro": shape.windows, "step_strategy": strategy.name}
        if strategy.chunk is not None:
            metrics["chunk"] = strategy.chunk
        # Read after the gradient norm's synchronisation, so that no micro-batch waits for its own passes.
        for result in results:
            for name, seconds in result.pass_seconds().items():
                metrics[name] = metrics.get(name, 0.0) + seconds
        metrics.update({f"aux_{k}": v for k, v in aux_sums.items()})
        if expert_counts:
            metrics.update(load_balance_metrics(expert_counts))
        if mode is not None:
            metrics["indexer_mode"] = mode
        return metrics

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def _checked_loss(self, step: int, micro: int, nonfinite: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """The loss a micro-batch (or a chunk of one) is about to run backward from; a non-finite one is noted in
        ``nonfinite`` (its value, on the device), which the step reads once after the micro-batch and stops on,
        before the optimizer. Reading each chunk's loss back here made the host wait for the GPU before every
        chunk's backward (16 times a `base` step at 512k), leaving the GPU idle while the backward's first kernels
        were launched. On the H200 no gain was measured: `base` steps took 14.69-14.71 s with the per-chunk read and
        14.67-15.11 s without (benchmarks/results/finetune_sync_slab_2026-12-04/); a host slower to launch pays
        more for each wait."""
        if self.hooks.on_loss is not None:
            loss = self.hooks.on_loss(step, micro, loss)
        # Across ranks a non-finite share reaches every rank's gradient norm after the all-reduce, and all stop
        # there together; stopping one rank here would leave the others waiting in a collective.
        if not self.mesh.distributed:
            value = loss.detach().to(nonfinite.dtype)
            nonfinite.copy_(torch.where(torch.isfinite(value), nonfinite, value))
        return loss

    def _diverged(self, step: int, what: str) -> ckpt.NonFiniteLossError:
        self.checkpoints.settle()          # the checkpoint being written is the last good one
        last_good = self.checkpoints.last_good
        kept = f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was saved yet"
        return ckpt.NonFiniteLossError(
            f"training diverged at step {step + 1}: {what}; {kept}", where=str(self.config.out),
            fix="resume from it with --resume and a lower --lr (or a stronger --grad-clip)")

    def _sum_over(self, value: float, group=None) -> float:
        from genolc.parallel.collectives import all_reduce_sum

        device = self.device if self.device.type == "cuda" else torch.device("cpu")
        return float(all_reduce_sum(torch.tensor([value], dtype=torch.float64, device=device), group))

    def _barrier(self) -> None:
        if self.mesh.distributed:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        """Leave the process group this run joined (every rank, after its last collective)."""
        if self.mesh.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()

    def _save(self, step: int, background: bool = False) -> Path:
        return self.checkpoints.save(step, model=self.model, optimizer=self.optimizer,
                                     trainer_state=self._trainer_state, background=background)

    def _trainer_state(self) -> dict[str, Any]:
        """The loop's own values a checkpoint keeps beside the weights and the optimizer's state."""
        return {"tokens_seen": self.tokens_seen, "targets_seen": self.targets_seen, "config": self.config.to_dict(),
                "samplers": {str(n): s.state_dict() for n, s in self.samplers.items()}}

    def run(self) -> Path:
        cfg = self.config
        # Every window length the remaining steps use is planned before the first step: a setting that does not fit
        # the device is refused now, with the estimate and an option that fits, not found by an out-of-memory kill.
        # Longest first: recompute that one adds wraps the layers for all, so the shorter ones are planned with it.
        stage_starts = [i * cfg.seq_warmup_steps for i in range(len(cfg.seq_warmup) + 1)]
        for step in sorted({max(start, self.start_step) for start in stage_starts if start < cfg.steps}, reverse=True):
            self.plans.for_shape(step_shape(step, cfg))
        if self.mesh.writes:
            cfg.out.mkdir(parents=True, exist_ok=True)
        metrics_path = cfg.out / METRICS if self.mesh.writes else Path(os.devnull)
        # The losses of the steps already done, so a resumed run's summary covers the whole run.
        losses = [m["loss"] for m in self._truncate_metrics(metrics_path)]
        self.model.train()
        self._started = time.monotonic()
        final: Path | None = self.checkpoints.last_good if self.start_step >= cfg.steps else None
        if final is not None:
            _say(f"the run is already at step {self.start_step} (--steps {cfg.steps}): nothing to train; raise --steps "
                 "to continue it")
        warmup = None
        bar = tqdm(total=cfg.steps, initial=self.start_step, disable=not (cfg.progress and self.mesh.writes),
                   unit="step", desc="finetune", file=sys.stderr, dynamic_ncols=True)
        step = self.start_step
        try:
            # The dashboards open first: one that fails leaves no metrics file behind.
            with self.monitor, open(metrics_path, "a") as log, bar, \
                    StopSignals("stopping after the current step and saving a checkpoint") as stop:
                warmup = self._start_kernel_warmup() if final is None else None
                kept_bytes = max((plan.kept_attention_bytes for plan in self.plans.strategies.values()), default=0)
                if final is None and kept_bytes and self.device.type == "cuda":
                    self.kept_attention.reserve(kept_bytes)
                for step in range(self.start_step, cfg.steps):
                    with self.monitor.capture():
                        metrics = self._timed_step(step)
                    self.monitor.log(metrics)
                    if warmup is not None and (ended := warmup.end()):
                        _say(ended)
                    log.write(json.dumps(metrics) + "\n")
                    log.flush()
                    losses.append(metrics["loss"])
                    done = step + 1
                    if (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == cfg.steps:
                        background = done < cfg.steps and self.checkpoints.room_for_snapshot(self.model,
                                                                                            self.optimizer)
                        final = self._save(done, background=background)
                    self.checkpoints.poll()
                    bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}",
                                    mem=f"{metrics['memory_gib']:.2f}G", refresh=False)
                    bar.update(1)
                    if self.hooks.on_step_end is not None:
                        self.hooks.on_step_end(done, metrics)
                    if self._stop_requested(stop) and done < cfg.steps:
                        if final is None or final.name != ckpt.checkpoint_name(done):
                            final = self._save(done)
                        self.checkpoints.wait()
                        self._write_summary("interrupted", final, losses)
                        raise TrainingInterrupted.after_step(stop.received, done, cfg.steps, final)
        except KeyboardInterrupt:
            # A second Ctrl-C (or one outside the main thread): stop at once, keeping what was saved before (a
            # checkpoint being written is finished first: another Ctrl-C skips the summary, and the process still
            # ends only once the write does).
            self.checkpoints.settle()
            self._write_summary("interrupted", self.checkpoints.last_good, losses)
            raise TrainingInterrupted.during_step(step + 1, self.checkpoints.last_good, where=str(cfg.out)) from None
        except ckpt.NonFiniteLossError:
            self.checkpoints.settle()
            self._write_summary("diverged", self.checkpoints.last_good, losses)
            raise
        finally:
            self.checkpoints.settle()
            self.kept_attention.close()
            if warmup is not None:
                warmup.stop()
        assert final is not None
        self._write_summary("ok", final, losses)
        return final

    def _start_kernel_warmup(self):
        """The first step's kernels compiled in a second process while it runs, or, where that process does not fit
        beside the run, its TileLang kernels in threads of this one (genolc/train/kernel_warmup.py)."""
        if self.device.type != "cuda" or self.mesh.distributed:
            return None
        from genolc.model.ops.kda.fla_tuning import autotune_note, fla_gpu_name
        from genolc.train.kernel_warmup import WarmupShape, start_kernel_compiles, start_kernel_warmup

        # Not where fla autotunes: timings taken with two processes on one GPU would be kept for later runs.
        if autotune_note(fla_gpu_name(), self.model.config, 1, self.bf16):
            return None
        shape = step_shape(self.start_step, self.config)
        strategy = self.plans.for_shape(shape)
        kernels = WarmupShape(
            model=self.model.config.to_hf(), seq_len=shape.seq_len, chunk=strategy.chunk,
            micro_batch=shape.windows, recompute=strategy.recompute, bf16=self.bf16,
            indexer_mode=indexer_mode_at(self.start_step, self.config), stream_dtype=self.stream_dtype,
            keep_kda_intermediates=strategy.keep_kda_intermediates)
        warmup = start_kernel_warmup(kernels, self.device,
                                     run_bytes=max(s.estimate_bytes for s in self.plans.strategies.values()),
                                     budget_bytes=self.plans.device_bytes())
        if warmup is not None:
            _say(f"compiling this shape's GPU kernels in a second process while the first step runs (log: "
                 f"{warmup.log}; GENOLC_KERNEL_WARMUP=0 turns it off)")
            return warmup
        compiles = start_kernel_compiles(kernels, self.device)
        if compiles is not None:
            _say("compiling this shape's TileLang kernels in threads while the first step runs (no warm-up process "
                 "beside it; GENOLC_KERNEL_WARMUP=0 turns it off)")
        return compiles

    def _stop_requested(self, stop: StopSignals) -> bool:
        """Whether any rank got a stop signal: every rank must stop after the same step."""
        if not self.mesh.distributed:
            return stop.received is not None
        return self._sum_over(float(stop.received is not None)) > 0

    def _timed_step(self, step: int) -> dict[str, Any]:
        retries = allocator_retries(self.device)
        t0 = time.monotonic()
        try:
            metrics = self._step(step)
        except torch.cuda.OutOfMemoryError:
            raise self.plans.oom_error(step) from None
        except (compile_failures() if self.compiled else ()) as error:
            if compile_ran_out_of_memory(error):
                raise self.plans.oom_error(step) from None
            raise ConfigError(f"torch.compile could not build the per-token glue: {compile_failure_text(error)}",
                              where=f"step {step + 1}, {self.device}",
                              fix="train with --compile off (the same results, eagerly)") from error
        seconds = time.monotonic() - t0
        shape = step_shape(step, self.config)
        step_tokens = shape.tokens * self.mesh.dp_size
        strategy = self.plans.for_shape(shape)
        fill = fill_fraction(shape.seq_len, strategy.chunk, sharded=self.context is not None)
        flops = token_flops(self.model.config, shape.seq_len, recompute=strategy.recompute, chunk_fill=fill,
                            selections_kept=strategy.keep_selections, attention_kept=strategy.keep_attention)
        metrics.update(self.throughput.step(step_tokens, seconds, flops))
        metrics["memory_gib"] = device_peak_gib(self.device)
        metrics["host_memory_gib"] = host_peak_gib()
        if retries is not None:
            metrics["allocator_retries"] = allocator_retries(self.device) - retries
        if self.mesh.distributed:
            device_peaks, host_peaks = self._gather_floats([metrics["memory_gib"], metrics["host_memory_gib"]])
            metrics["memory_gib_ranks"] = self._peak_ranks = device_peaks
            metrics["host_memory_gib_ranks"] = self._host_peak_ranks = host_peaks
        return metrics

    def _gather_floats(self, values: list[float]) -> list[list[float]]:
        """For each of ``values``, every rank's, in global rank order (one collective for all of them)."""
        import torch.distributed as dist

        device = self.device if self.device.type == "cuda" else torch.device("cpu")
        mine = torch.tensor(values, dtype=torch.float64, device=device)
        parts = [torch.empty_like(mine) for _ in range(self.mesh.world_size)]
        dist.all_gather(parts, mine)
        return [[float(part[k]) for part in parts] for k in range(len(values))]

    def _write_summary(self, status: str, final: Path | None, losses: list[float]) -> None:
        if not self.mesh.writes:
            return
        cfg = self.config
        speed = self.throughput.summary()
        summary = {
            "status": status, "final_checkpoint": str(final) if final else None, "steps": cfg.steps,
            "steps_done": len(losses), "resumed_from_step": self.start_step,
            "tokens_seen": self.tokens_seen, "targets_seen": self.targets_seen,
            "final_loss": losses[-1] if losses else None,
            "mean_loss_last_10": float(np.mean(losses[-10:])) if losses else None,
            "seconds": time.monotonic() - self._started,       # this invocation (a resumed run counts from resume)
            "tokens_per_s": speed["tokens_per_s"], "mfu": speed["mfu"],
            "first_step_seconds": speed["first_step_seconds"],
            # Training waited this long for its checkpoints: foreground writes, copies of the background ones, and a
            # background write still running when the next save came.
            "checkpoint_seconds": self.checkpoints.seconds,
            "checkpoints_in_background": self.checkpoints.in_background,
            "tokens_per_s_after_first_step": speed["tokens_per_s_after_first_step"],
            "peak_memory_gib": device_peak_gib(self.device), "peak_memory_gib_ranks": self._peak_ranks,
            "peak_host_memory_gib": host_peak_gib(), "peak_host_memory_gib_ranks": self._host_peak_ranks,
            "device": str(self.device), "bf16": self.bf16, "stream_dtype": self.stream_dtype,
            **self.compute.to_dict(),
            "transforms": self.applied,
            "malloc_mmap_threshold": self.plans.malloc_mmap_threshold,
            "step_strategies": [strategy.describe() for strategy in self.plans.strategies.values()],
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "mesh": {"world_size": self.mesh.world_size, "data_parallel": self.mesh.dp_size,
                     "context_parallel": self.mesh.cp_size, "cp_layout": cfg.cp_layout, "cp_kda": cfg.cp_kda},
            "config": cfg.reported(),
        }
        atomic_write_json(cfg.out / SUMMARY, summary)
        self.figures = {key: summary[key] for key in ("status", "steps", "steps_done", "resumed_from_step",
                                                      "tokens_seen", "final_loss")}

    def _truncate_metrics(self, path: Path) -> list[dict[str, Any]]:
        """Keep only lines for steps already in the checkpoint we resume from (a fresh run starts an empty log);
        returns them."""
        kept: list[dict[str, Any]] = []
        if self.start_step and path.is_file():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    if entry["step"] <= self.start_step:
                        kept.append(entry)
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue
        if kept or path.exists():       # a new run's file is made when its steps start (after the dashboards open)
            path.write_text("".join(json.dumps(entry) + "\n" for entry in kept))
        return kept


class TrainingInterrupted(Interrupted):
    """The run was stopped by SIGINT (Ctrl-C) or SIGTERM; it resumes from the checkpoint the message names."""

    @classmethod
    def after_step(cls, signum: int, done: int, steps: int, checkpoint: Path) -> "TrainingInterrupted":
        return cls(f"stopped by {signal.Signals(signum).name} after step {done} of {steps}; saved {checkpoint}",
                   signum, fix="continue with the same command plus --resume")

    @classmethod
    def during_step(cls, step: int, last_good: Path | None, where: str) -> "TrainingInterrupted":
        kept = f"the last checkpoint is {last_good}" if last_good else "no checkpoint was saved yet"
        return cls(f"stopped at once during step {step} without saving; {kept}", signal.SIGINT, where=where,
                   fix="continue with the same command plus --resume" if last_good else
                       "run it again (a single Ctrl-C stops after the current step and saves a checkpoint)")

