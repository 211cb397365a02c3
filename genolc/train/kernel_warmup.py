"""Compile a run's GPU kernels in a second process while the first training step runs.

On a machine whose caches are empty, the first ``finetune`` step compiles every Triton kernel fla's KDA uses,
TileLang's DSA kernels and fla's TileLang KDA backward (48 s of TileLang alone for ``small`` on an H200,
benchmarks/results/first_step_cold_small_128k_2026-12-01/), one after another, each when the step first reaches it:
the backward's kernels only after the whole first forward. A second process started with the run builds a two-layer
model of the run's shapes (one KDA layer, one DSA layer, the run's MLP kinds), compiles genolc's TileLang DSA kernels
and fla's TileLang KDA backward in threads of their own (nvcc runs outside the GIL) and runs one chunked step on one
micro-batch of random tokens, so the kernels land in Triton's and TileLang's disk caches while the trainer traces,
compiles its glue and runs its forward; the trainer then loads them instead of compiling. It shares nothing with the
trainer but those caches and a progress file: its random numbers, memory and failures are its own (a failed warm-up
leaves the trainer compiling as it would have, and its log says why). A kernel the trainer reaches first is compiled
by both (the caches' writes are atomic), except fla's TileLang KDA backward, the longest (31-33 s): the trainer's
first build of it waits while the warm-up's progress file says the warm-up is compiling it (up to
``FLA_KDA_COMPILE_SECONDS`` after that compile began; :meth:`KernelWarmup.hold_first_kda_backward`). After the first
step the trainer stops a warm-up that still runs: what it had not reached, that step compiled itself.

Where the warm-up's model and step do not fit the device beside the run's plan, the trainer compiles the same
TileLang kernels in threads of its own instead (:class:`KernelCompiles`, no step run).

Only on CUDA, in a single process (under ``torchrun`` each rank compiles its own), once per shape on a machine: a
finished warm-up (or the threads, once all compiled) leaves a marker under the user's cache directory
(``genolc/kernel-warmup/``) and later runs of that shape start neither. ``GENOLC_KERNEL_WARMUP=0`` turns both off.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from genolc.fsutil import atomic_write_json, genolc_cache_dir
from genolc.model import ModelConfig
from genolc.model.ops.kda.fla_import import import_fla_module

WARMUP_ENV = "GENOLC_KERNEL_WARMUP"
FLA_KDA_BACKWARD = "fla_tilelang_kda_backward"
FLA_KDA_STARTED = "fla_tilelang_kda_backward_started"      # the compile's start, seconds since the epoch
# How long after the warm-up began compiling fla's kernel (28-33 s on the H200) the trainer's first KDA backward stops
# waiting for it and compiles the kernel itself, as it did before it waited.
FLA_KDA_COMPILE_SECONDS = 45.0
WARMUP_LAYERS = ("linear_attention", "indexed_attention")
KERNEL_SETTINGS = ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR", "FLA_CONFIG_DIR", "FLA_CACHE_MODE", "FLA_TILELANG",
                   "GENOLC_DSA_KERNELS", "CUDA_HOME")


def warmup_dir() -> Path:
    return genolc_cache_dir() / "kernel-warmup"


def warmup_marker(key: str) -> Path:
    """The file that says the kernels of the shape with ``key`` (:meth:`WarmupShape.key`) were compiled on this
    machine, by the warm-up process or the compile threads: later runs of that shape start neither."""
    return warmup_dir() / f"{key}.json"


@dataclass(frozen=True)
class WarmupShape:
    """What decides which kernels a step compiles: the layers' shapes, the window and chunk, the micro-batch."""

    model: dict[str, Any]       # ModelConfig.to_hf(): JSON as checkpoints store it, read back by from_hf
    seq_len: int
    chunk: int | None
    micro_batch: int
    recompute: bool
    bf16: bool
    indexer_mode: str | None
    stream_dtype: str = "float32"   # the run's resolved --stream-dtype: the mHC kernels compile per streams' dtype
    keep_kda_intermediates: bool = False   # the strategy's: fla then runs other kernel variants (no recompute)

    def key(self, device: torch.device) -> str:
        import importlib.metadata as metadata

        from genolc.model.ops.kda.fla_tuning import installed_versions

        # fla and Triton under either of their distribution names (fla-core / flash-linear-attention, triton /
        # pytorch-triton), so an upgrade of either is a new key.
        versions = {"torch": torch.__version__, **installed_versions()}
        try:
            versions["tilelang"] = metadata.version("tilelang")
        except metadata.PackageNotFoundError:
            versions["tilelang"] = None
        # Where the kernels go and which ones a run takes: a marker from another cache folder (a node-local cache
        # under a shared home) or from edited kernels must not stop a warm-up that is needed.
        settings = {name: os.environ.get(name) for name in KERNEL_SETTINGS}
        sources = hashlib.sha256()
        for path in sorted((Path(__file__).parents[1] / "model" / "ops").rglob("*.py")):
            sources.update(path.read_bytes())
        text = json.dumps({"shape": dataclasses.asdict(self), "versions": versions, "settings": settings,
                           "genolc_ops": sources.hexdigest(), "gpu": torch.cuda.get_device_name(device)},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def warmup_model_config(config: ModelConfig) -> ModelConfig:
    """``config`` cut to one KDA and one DSA layer (its first and last MLP kinds): every kernel, two layers' work."""
    mlp = (config.mlp_layer_types[0], config.mlp_layer_types[-1])
    return config.replace(num_hidden_layers=2, layer_types=WARMUP_LAYERS, mlp_layer_types=mlp,
                          indexer_types=("full", "full"))


# What a process holds on the GPU beyond its tensors (CUDA context, cuBLAS workspace, the caching allocator's slack).
PROCESS_OVERHEAD_BYTES = 2 << 30


def warmup_bytes(shape: WarmupShape) -> int:
    """The warm-up process's planned GPU peak (genolc/train/plan.py for the two-layer model), plus its overhead."""
    from genolc.train.plan import (PLAN_MARGIN, estimate_chunked_memory, estimate_memory,
                                   kda_intermediates_device_bytes, plans_fp32_streams)

    config = warmup_model_config(ModelConfig.from_hf(shape.model))
    fp32_streams = plans_fp32_streams(shape.bf16, shape.stream_dtype)
    if shape.chunk is None:
        plan = estimate_memory(config, seq_len=shape.seq_len, windows=shape.micro_batch, bf16=shape.bf16,
                               recompute=shape.recompute, fast_kernels=True, fp32_streams=fp32_streams)
    else:
        plan = estimate_chunked_memory(config, seq_len=min(shape.seq_len, 2 * shape.chunk), chunk=shape.chunk,
                                       windows=shape.micro_batch, bf16=shape.bf16, recompute=shape.recompute,
                                       fast_kernels=True, fp32_streams=fp32_streams)
        if shape.keep_kda_intermediates:
            plan = dataclasses.replace(plan, total=plan.total + int(PLAN_MARGIN * kda_intermediates_device_bytes(
                config, chunk=shape.chunk, windows=shape.micro_batch, bf16=shape.bf16, recompute=shape.recompute)))
    return plan.total - plan.optimizer + PROCESS_OVERHEAD_BYTES      # it steps no optimizer


class KernelWarmup:
    """The running warm-up process. The trainer calls :meth:`end` after the first step: it stops a warm-up that
    still runs and says once how it ended (for the trainer's log); :meth:`finished` only reports."""

    def __init__(self, process: subprocess.Popen, log: Path, started: float, progress: Path | None = None) -> None:
        self.process, self.log, self.started, self.progress = process, log, started, progress
        self._reported = False
        self._restore_fla: Callable[[], None] | None = None
        self.waited_seconds: float | None = None      # the trainer's first KDA backward's wait, once it waited

    def progress_entries(self) -> dict[str, Any]:
        """What the warm-up process has written to its progress file so far (empty before it writes)."""
        try:
            return json.loads(self.progress.read_text()) if self.progress is not None else {}
        except (OSError, ValueError):
            return {}

    def wait_for_fla_kda_backward(self) -> float:
        """Block while the warm-up process compiles fla's TileLang KDA backward: until it reports the kernel (or a
        failure) or ends, at most until ``FLA_KDA_COMPILE_SECONDS`` after that compile began; no wait where it has
        not begun. The seconds waited."""
        t0 = time.monotonic()
        while self.process.poll() is None:
            entries = self.progress_entries()
            if FLA_KDA_BACKWARD in entries or FLA_KDA_STARTED not in entries:
                break
            if time.time() > entries[FLA_KDA_STARTED] + FLA_KDA_COMPILE_SECONDS:
                break
            time.sleep(0.05)
        return time.monotonic() - t0

    def hold_first_kda_backward(self) -> bool:
        """Make this process's first build of fla's TileLang KDA backward wait for the warm-up's compile of it
        (:meth:`wait_for_fla_kda_backward`), then load it from TileLang's cache, instead of compiling it a second
        time beside the warm-up: the trainer's main thread spent 26 s in that compile on the H200 when its first
        backward came as the warm-up's was ending (benchmarks/results/first_step_cold_2026-12-02/README.md, section
        8). Undone by :meth:`end` and :meth:`stop`; True when set up (fla routes the backward to TileLang here)."""
        module = _fla_kda_backward_module()
        if module is None or self.progress is None:
            return False
        original = module._build_kda_bwd_kernel

        def build(*args, **kwargs):
            if self.waited_seconds is None:
                self.waited_seconds = self.wait_for_fla_kda_backward()
            return original(*args, **kwargs)

        module._build_kda_bwd_kernel = build
        self._restore_fla = lambda: setattr(module, "_build_kda_bwd_kernel", original)
        return True

    def _release(self) -> None:
        if self._restore_fla is not None:
            self._restore_fla()
            self._restore_fla = None
        if self.progress is not None:
            self.progress.unlink(missing_ok=True)

    def _waited(self) -> str:
        if (self.waited_seconds or 0.0) < 0.5:
            return ""
        return f"; the first KDA backward waited {self.waited_seconds:.0f} s for its kernel"

    def finished(self) -> str | None:
        """None while it runs (or after it was reported); else one line saying how it ended."""
        if self._reported or self.process.poll() is None:
            return None
        self._reported = True
        if self.process.returncode == 0:
            return (f"kernel warm-up process done ({time.monotonic() - self.started:.0f} s after the "
                    f"start{self._waited()})")
        return (f"the kernel warm-up process failed (exit {self.process.returncode}; see {self.log}{self._waited()}); "
                "training compiled its kernels itself")

    def end(self) -> str | None:
        """After the first step, whose kernels are compiled by then either way: how it ended, stopping it if it still
        runs (so that it holds no GPU memory through the run)."""
        self._release()
        if self.process.poll() is None:
            self.stop()
            self._reported = True
            return f"kernel warm-up process stopped: the first step compiled what it had not reached{self._waited()}"
        return self.finished()

    def stop(self) -> None:
        """End it and what it started (nvcc, ptxas): it runs in a process group of its own."""
        self._release()
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                self.process.kill()
            self.process.wait()


PARENT_ENV = "GENOLC_KERNEL_WARMUP_PARENT"


def _die_with_parent() -> bool:
    """In the warm-up process, first thing: a trainer killed outright (OOM killer, a scheduler's KILL) takes it along
    instead of leaving it holding GPU memory (PR_SET_PDEATHSIG; Linux only, elsewhere stop() is the only way it ends
    early). Set here rather than in a preexec_fn, which may deadlock a child forked from the threaded trainer.
    False when the trainer is already gone (it died while this process started)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    parent = os.environ.get(PARENT_ENV)
    return parent is None or os.getppid() == int(parent)


def start_kernel_warmup(shape: WarmupShape, device: torch.device, *, run_bytes: int, budget_bytes: int
                        ) -> KernelWarmup | None:
    """Start the warm-up process for ``shape`` on ``device``, or None (not CUDA, turned off, done before, or its
    planned memory and the run's, ``run_bytes``, do not fit ``budget_bytes`` together: the run comes first)."""
    if device.type != "cuda" or os.environ.get(WARMUP_ENV, "1") == "0":
        return None
    try:
        if run_bytes + warmup_bytes(shape) > budget_bytes:
            return None
        folder = warmup_dir()
        folder.mkdir(parents=True, exist_ok=True)
        key = shape.key(device)
        if warmup_marker(key).exists():
            return None
        # The process id in the names: two runs of one shape (two GPUs) keep their own spec and log.
        spec = folder / f"{key}.{os.getpid()}.spec.json"
        atomic_write_json(spec, dataclasses.asdict(shape))
        log = folder / f"{key}.{os.getpid()}.log"
        progress = folder / f"{key}.{os.getpid()}.progress.json"
        progress.unlink(missing_ok=True)
        index = device.index if device.index is not None else torch.cuda.current_device()
        with open(log, "w") as out:
            # A session of its own: the terminal's Ctrl-C, which asks the trainer to finish its step, does not
            # reach it; stop() ends its whole group.
            process = subprocess.Popen([sys.executable, "-m", "genolc.train.kernel_warmup", str(spec), str(index),
                                        str(warmup_marker(key)), str(progress)], stdout=out,
                                       stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       env={**os.environ, PARENT_ENV: str(os.getpid())})
    except Exception as error:      # anything at all: the warm-up only saves time, so the trainer compiles as before
        # One line, so that a warm-up that never starts (a read-only cache folder, a bug) is seen, not silent.
        print(f"genolc finetune: the kernel warm-up process could not start ({type(error).__name__}: {error}); the "
              "first step compiles its kernels itself", file=sys.stderr)
        return None
    warmup = KernelWarmup(process, log, time.monotonic(), progress)
    if shape.bf16:      # where the warm-up compiles fla's TileLang KDA backward (run_warmup)
        try:
            warmup.hold_first_kda_backward()
        except Exception as error:  # only saves time: the first backward then compiles the kernel itself, as before
            print(f"genolc finetune: the first KDA backward will not wait for the kernel warm-up "
                  f"({type(error).__name__}: {error})", file=sys.stderr)
    return warmup


class KernelCompiles:
    """The first step's TileLang kernels (genolc's DSA forward and backwards, fla's KDA backward) compiled in threads
    of the trainer's own process, started where no warm-up process runs beside the run (its model and step do not
    fit the device with the run's plan: `base` at 512k). They hold no GPU memory beyond fla's few shape tensors.
    The step's first call of each kernel waits for its thread's compile (``compile_once``'s lock per key; the lock
    around fla's builder) instead of compiling it again, so the kernels compile at once, from the run's start, where
    the step compiled them one after another as it reached them. `base` at 512k on the H200, every cache empty
    (benchmarks/results/finetune_sync_slab_2026-12-04/): the four took 77 s of a 183.6 s first step one after
    another; in threads they were done 33 s after the start, and the first step took 98.0 s. Once all are compiled
    and the first step has run, the shape's warm-up marker is written, so later runs of it start none."""

    def __init__(self, threads: list[threading.Thread], seconds: dict[str, float | str],
                 restore_fla: Callable[[], None] | None, marker: Path) -> None:
        self.threads, self.seconds, self._restore_fla, self._marker = threads, seconds, restore_fla, marker
        self._reported: set[str] = set()

    def _done(self) -> bool:
        return not any(thread.is_alive() for thread in self.threads)

    def _restore_when_done(self) -> None:
        if self._restore_fla is not None and self._done():
            self._restore_fla()
            self._restore_fla = None

    def end(self) -> str | None:
        """After each step (the trainer calls it as it calls :meth:`KernelWarmup.end`): one line naming the kernels
        compiled since it last said, with their seconds, or None; fla's builder is itself again, and the marker
        written, once every thread is done (the marker only where all compiled)."""
        self._restore_when_done()
        if self._marker is not None and self._done():
            if all(isinstance(value, float) for value in self.seconds.values()):
                try:
                    atomic_write_json(self._marker, {"compiled_in_threads": dict(self.seconds)})
                except OSError:     # only spares a later run its threads: they then load the kernels again
                    pass
            self._marker = None
        fresh = {name: value for name, value in sorted(self.seconds.items()) if name not in self._reported}
        if not fresh:
            return None
        self._reported.update(fresh)
        done = ", ".join(f"{name} {value:.0f} s" if isinstance(value, float) else f"{name} {value}"
                         for name, value in fresh.items())
        return f"TileLang kernels compiled in threads from the run's start: {done}"

    def stop(self) -> None:
        """At the run's end, also an early one: fla's builder is itself again if its thread is done (daemon threads
        that compile on the CPU end with the process; nothing holds the GPU)."""
        self._restore_when_done()


def start_kernel_compiles(shape: WarmupShape, device: torch.device) -> KernelCompiles | None:
    """Compile the TileLang kernels a run of ``shape`` uses, in threads of this process (:class:`KernelCompiles`), or
    None (not CUDA, ``GENOLC_KERNEL_WARMUP=0``, done before on this machine, or no thread started: no TileLang kernel
    to compile here, or errors starting them). A part that cannot start (fla's kernel, the DSA kernels) is said in
    one line and left to the step, which compiles it itself, as before."""
    if device.type != "cuda" or os.environ.get(WARMUP_ENV, "1") == "0":
        return None
    seconds: dict[str, float | str] = {}
    threads: list[threading.Thread] = []
    restore = None

    def say(error: Exception) -> None:     # only saves time: the step compiles the rest itself, as before
        print(f"genolc finetune: the kernel compile threads could not all start ({type(error).__name__}: {error}); "
              "the first step compiles the others itself", file=sys.stderr)

    try:
        marker = warmup_marker(shape.key(device))
        if marker.exists():
            return None
        marker.parent.mkdir(parents=True, exist_ok=True)
        config = ModelConfig.from_hf(shape.model)
    except Exception as error:
        say(error)
        return None
    # fla's first, as the warm-up process starts them (run_warmup) and as measured.
    try:
        module = _fla_kda_backward_module() if shape.bf16 else None
        if module is not None:
            original = module._build_kda_bwd_kernel
            fla = _compile_fla_kda_backward(config, shape.micro_batch, device, seconds, lambda: None)
            if fla is not None:
                threads.append(fla)
                restore = functools.partial(setattr, module, "_build_kda_bwd_kernel", original)
    except Exception as error:
        say(error)
    try:
        threads += _compile_dsa_kernels(config, shape.bf16, shape.seq_len, seconds)
    except Exception as error:
        say(error)
    return KernelCompiles(threads, seconds, restore, marker) if threads else None


def dsa_kernel_args(config: ModelConfig) -> tuple[int, int, int, str, float]:
    """What DSAAttention's bf16 call hands genolc's TileLang kernels besides the launch config (heads, latent rank,
    index width, dtype, softmax scale); tests compare it with the layer."""
    return (config.num_attention_heads, config.kv_lora_rank, config.index_width, "bfloat16",
            float(config.qk_head_dim ** -0.5))


def _compile_dsa_kernels(config: ModelConfig, bf16: bool, seq_len: int,
                         seconds: dict[str, float | str]) -> list[threading.Thread]:
    """Threads compiling the TileLang DSA kernels a run of ``seq_len``-token windows uses: the forward, the backward
    and, for windows of at least ``SLABBED_FROM_ROWS`` tokens, the slab-ordered backward (backward.chosen_backward
    runs it there); none where the layer runs the Triton pair."""
    from genolc.model.ops.dispatch import dsa_kernel_family
    from genolc.model.ops.dsa.tilelang import backward, backward_slabs, forward

    heads, rank = config.num_attention_heads, config.kv_lora_rank
    # The layer's own choice, on shapes alone: the Triton pair when TileLang is missing or forced off, for fp32
    # training, or for heads and ranks TileLang's kernels do not take.
    operands = (torch.empty(1, 1, heads, rank, dtype=torch.bfloat16 if bf16 else torch.float32, device="meta"),
                torch.empty(1, 1, rank, dtype=torch.bfloat16 if bf16 else torch.float32, device="meta"))
    if dsa_kernel_family(*operands) != "tilelang":
        return []
    import tilelang  # noqa: F401  (once, here, rather than by several threads at once)

    args = dsa_kernel_args(config)

    def run(name, compile_kernel, launch):
        t0 = time.monotonic()
        try:
            compile_kernel(*args, launch)
            seconds[name] = round(time.monotonic() - t0, 1)
        except Exception as error:      # the step compiles it again and says why if it fails there too
            seconds[name] = f"failed: {error!r}"

    kernels = [("tilelang_dsa_forward", forward.compiled_kernel, forward.default_config(rank)),
               ("tilelang_dsa_backward", backward.compiled_backward_kernel, backward.default_backward_config(rank))]
    if seq_len >= backward.SLABBED_FROM_ROWS:
        kernels.append(("tilelang_dsa_backward_slabs", backward_slabs.compiled_slabbed_backward_kernel,
                        backward_slabs.default_slabbed_config(rank)))
    threads = [threading.Thread(target=run, daemon=True, args=kernel) for kernel in kernels]
    for thread in threads:
        thread.start()
    return threads


class _Compiled(Exception):
    """Raised past fla's kernel builder once it has compiled, so that nothing is launched on dummy inputs."""


def _fla_kda_backward_module():
    """fla's TileLang KDA backward module (``chunk_bwd_dqkg``), or None where fla routes no backward to TileLang here
    or cannot be imported."""
    try:
        backend = import_fla_module("fla.ops.kda.backends.tilelang").KDATileLangBackend
        module = import_fla_module("fla.ops.kda.backends.tilelang.chunk_bwd_dqkg")
    except Exception:       # fla, TileLang or nvcc missing, or fla reorganised: the step compiles it as before
        return None
    return module if backend.can_use() else None


def _compile_fla_kda_backward(config: ModelConfig, micro_batch: int, device: torch.device,
                              seconds: dict[str, float | str], report: Callable[[], None],
                              started: Callable[[], None] = lambda: None) -> threading.Thread | None:
    """fla's TileLang KDA backward (fla routes it to TileLang on Hopper; 31 s to compile on an H200, where the first
    step's backward waited for it) compiled from the start instead of when a backward first reaches it. fla's own
    entry point is called, so its tiling and key are fla's; only in this thread its builder stops the call once the
    kernel is compiled (the inputs here are shapes, not data). Not in fla's public API: any failure skips it.
    ``started()`` runs as the compile begins, ``report()`` once it is compiled or failed (the trainer's first KDA
    backward waits in between)."""
    chunk_bwd_dqkg = _fla_kda_backward_module()
    if chunk_bwd_dqkg is None:
        return None
    builder = chunk_bwd_dqkg._build_kda_bwd_kernel
    building = threading.Lock()     # the step's own backward waits for this thread's compile instead of repeating it

    def build_then_stop(*args, **kwargs):
        with building:
            kernel = builder(*args, **kwargs)
        if threading.current_thread() is thread:
            raise _Compiled
        return kernel

    def run():
        t0 = time.monotonic()
        batch, tokens, heads, dim = micro_batch, 64, config.linear_num_heads, config.linear_head_dim
        try:
            qk = torch.empty(batch, tokens, heads, dim, dtype=torch.bfloat16, device=device)
            state = torch.empty(batch, 1, heads, dim, dim, dtype=torch.bfloat16, device=device)
            chunk_bwd_dqkg.chunk_kda_bwd_wy_dqkg_fused_tilelang(
                q=qk, k=qk, v=qk, v_new=qk, g=qk.float(), beta=qk[..., 0].float(),
                A=torch.empty(batch, tokens, heads, 64, dtype=torch.float32, device=device), h=state, do=qk,
                dh=state, dv=qk)
        except _Compiled:
            seconds[FLA_KDA_BACKWARD] = round(time.monotonic() - t0, 1)
        except Exception as error:      # the step compiles it itself
            seconds[FLA_KDA_BACKWARD] = f"failed: {error!r}"
        else:                           # fla returned without building: nothing compiled here
            seconds[FLA_KDA_BACKWARD] = "failed: fla's entry point returned without building the kernel"
        finally:
            report()

    chunk_bwd_dqkg._build_kda_bwd_kernel = build_then_stop
    thread = threading.Thread(target=run, daemon=True)
    started()
    thread.start()
    return thread


def run_warmup(shape: WarmupShape, device: torch.device, progress: Path | None = None) -> dict[str, float | str]:
    """One chunked (or whole) step of the two-layer model at ``shape`` on ``device`` (CUDA; on CPU it runs the same
    code without kernels to compile, which the tests use); seconds per part. ``progress``: a JSON file rewritten
    with the parts done so far as fla's KDA backward is compiled (the trainer's first backward waits for it)."""
    from genolc.model import build_model
    from genolc.train.apply import apply_recompute, apply_stream_dtype
    from genolc.train.loss import LossTerms
    from genolc.train.strategy import StepStrategy, run_micro_batch

    t0 = time.monotonic()
    config = warmup_model_config(ModelConfig.from_hf(shape.model))
    seconds: dict[str, float | str] = {}

    def report() -> None:
        if progress is not None:
            atomic_write_json(progress, dict(seconds))

    def started() -> None:
        if progress is not None:
            atomic_write_json(progress, {FLA_KDA_STARTED: time.time()})

    # fla's thread first: importing fla took ~20 s while the DSA threads' TileLang lowering held the GIL, so on the
    # H200 (2026-12-02 logs) fla's compile began only as the DSA backward's ended.
    fla = (_compile_fla_kda_backward(config, shape.micro_batch, device, seconds, report, started)
           if device.type == "cuda" and shape.bf16 else None)
    if fla is None and progress is not None:
        atomic_write_json(progress, {FLA_KDA_BACKWARD: "not compiled here"})    # nothing for the trainer to wait for
    threads = [fla] if fla is not None else []
    threads += _compile_dsa_kernels(config, shape.bf16, shape.seq_len, seconds)
    torch.manual_seed(0)
    model = build_model(config, device=device)
    if shape.recompute:
        apply_recompute(model)
    if shape.stream_dtype != "float32":
        apply_stream_dtype(model, getattr(torch, shape.stream_dtype))
    seq_len = shape.seq_len if shape.chunk is None else min(shape.seq_len, 2 * shape.chunk)
    ids = torch.randint(0, config.vocab_size, (shape.micro_batch, seq_len + 1), device=device)
    weights = torch.ones(shape.micro_batch, seq_len, device=device)
    terms = LossTerms(total_weight=float(weights.sum()), grad_accum=1, moe_balance_coef=0.0, indexer_kl_coef=0.0,
                      indexer_mode=shape.indexer_mode)
    strategy = StepStrategy(seq_len=seq_len, chunk=shape.chunk, recompute=shape.recompute, estimate_bytes=0,
                            reason="kernel warm-up",
                            keep_kda_intermediates=shape.keep_kda_intermediates and shape.chunk is not None)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=shape.bf16)

    run_micro_batch(strategy, model, ids, weights, terms, autocast, lambda loss: loss)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    for thread in threads:
        thread.join()
    seconds["step"] = round(time.monotonic() - t0, 1)
    return seconds


def main(argv: list[str]) -> int:
    """``SPEC GPU_INDEX MARKER [PROGRESS]``: the warm-up of SPEC on that GPU (``cpu``: the tests), then MARKER
    written; PROGRESS: run_warmup's progress file."""
    spec_path, index, marker = Path(argv[0]), argv[1], Path(argv[2])
    progress = Path(argv[3]) if len(argv) > 3 else None
    shape = WarmupShape(**json.loads(spec_path.read_text()))
    device = torch.device("cpu") if index == "cpu" else torch.device("cuda", int(index))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    t0 = time.monotonic()
    seconds = run_warmup(shape, device, progress)
    print(f"kernel warm-up: {json.dumps(seconds)}", flush=True)
    if any(isinstance(value, str) for value in seconds.values()):
        return 1        # no marker: the next run of this shape tries again
    atomic_write_json(marker, {"shape": dataclasses.asdict(shape), "seconds": seconds,
                               "total_seconds": round(time.monotonic() - t0, 1)})
    spec_path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if _die_with_parent() else 0)
