"""Training configuration: one frozen dataclass for `genolc finetune`, validated on construction.

Lengths count tokens (``seq_len`` as parsed by :func:`genolc.units.parse_length`). One optimizer step consumes
``micro_batch * grad_accum`` windows of ``seq_len`` input tokens (see :mod:`genolc.train.schedule` for how the
sequence-length warm-up keeps that token budget while the windows are shorter).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genolc.errors import ConfigError
from genolc.parallel.layout import LAYOUTS
from genolc.routing import DEFAULT_GROUP_TOKENS
from genolc.threads import check_threads

INDEXER_MODES = ("off", "dense", "sparse", "dense-then-sparse")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16")
STREAM_DTYPES = ("auto", "float32", "bfloat16")   # mHC's residual streams (genolc.train.apply.apply_stream_dtype)
DASHBOARDS = ("tensorboard", "wandb")
CP_LAYOUTS = LAYOUTS                        # genolc/parallel/layout.py: which positions each CP rank holds
CP_KDA_MODES = ("state", "heads")           # how KDA runs over CP ranks: genolc.parallel.apply.KDA_FORWARDS
COMPILE_MODES = ("auto", "on", "off")       # torch.compile of the per-token glue (genolc.train.apply.apply_compile)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides what a fine-tuning run computes (and so what ``--resume`` must match)."""

    data: Path                                  # prepared dataset directory (genolc prepare)
    out: Path                                   # run directory: checkpoints/, metrics.jsonl, summary.json, runs/
    seq_len: int                                # input tokens per window at full length
    model: str = "tiny"                         # preset name when starting from scratch
    init: Path | None = None                    # genolc or transformers-layout checkpoint to start from
    steps: int = 80                             # optimizer steps
    lr: float = 3e-4                            # peak learning rate
    warmup_steps: int = 10                      # linear LR warm-up from lr / warmup_steps to lr
    min_lr_ratio: float = 0.1                   # cosine decays to lr * min_lr_ratio at the last step
    weight_decay: float = 0.1                   # on matrices only; norms, biases, embeddings are not decayed
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0                      # max global grad norm; 0 turns clipping off
    grad_accum: int = 1                         # micro-batches per optimizer step
    micro_batch: int = 1                        # windows per micro-batch at full length
    seed: int = 0
    seq_warmup: tuple[int, ...] = ()            # shorter stage lengths, increasing, each dividing seq_len
    seq_warmup_steps: int = 0                   # optimizer steps spent in each warm-up stage
    softmask_weight: float = 1.0                # loss weight of soft-masked (repeat) targets; Evo 2 uses 0.1
    moe_balance_coef: float = 0.0               # weight of the model's 'moe_balance' aux loss (0: not added)
    moe_bias_rate: float = 1e-3                 # router correction-bias step per optimizer step (aux-loss-free
                                                # balancing, genolc.train.balance; DeepSeek-V3's 1e-3); 0: off
    indexer: str = "off"                        # DSA indexer KL: off | dense | sparse | dense-then-sparse
    indexer_dense_steps: int = 0                # with dense-then-sparse: steps of dense warm-up before sparse
    indexer_kl_coef: float = 1.0                # weight of the model's 'indexer_kl' aux loss
    max_n_fraction: float = 0.1                 # sampler: skip windows with more ambiguous tokens than this
    reverse_complement: bool = False            # sampler: reverse-complement half of the windows
    recompute: bool = False                     # per-layer activation checkpointing (genolc.train.apply)
    compile: str = "auto"                       # torch.compile the per-token glue (mHC, norms): auto (on CUDA)
                                                # | on | off (genolc.train.apply.apply_compile)
    chunk: int | None = None                    # step strategy (genolc.train.strategy): None auto, 0 the whole
                                                # window at once, N chunks of N tokens (chunk-recurrent, exact;
                                                # with --cp each chunk is split over the CP ranks)
    checkpoint_every: int = 0                   # save every N steps (0: only at the end)
    keep_checkpoints: int = 2                   # keep the newest N checkpoints
    resume: bool = False                        # continue from the newest checkpoint in out/checkpoints
    device: str = "auto"                        # auto | cpu | cuda
    dtype: str = "auto"                         # auto (bf16 autocast on CUDA, fp32 on CPU) | float32 | bfloat16
    stream_dtype: str = "auto"                  # mHC's residual streams: auto (bf16 under bf16 autocast, else
                                                # fp32) | float32 | bfloat16 (needs bf16 autocast)
    progress: bool = True                       # tqdm progress bar on stderr
    threads: int | None = None                  # CPU threads for torch; None: genolc.threads' rule (cores free now,
                                                # 1 with deterministic)
    deterministic: bool = False                 # torch's deterministic algorithms (genolc.determinism)
    log: tuple[str, ...] = ()                   # dashboards beside metrics.jsonl: tensorboard, wandb (offline)
    routing_group: int = DEFAULT_GROUP_TOKENS   # tokens per dispatch group for the routing drop shares
                                                # (genolc.routing); only what is reported, not what is trained
    cp: int = 1                                 # context-parallel ranks per window (genolc.parallel); the
                                                # data-parallel size is torchrun's world size / cp
    cp_layout: str = "zigzag"                   # which positions each CP rank holds: zigzag | contiguous
    cp_kda: str = "state"                       # KDA under CP: state (boundary-state passing) | heads
                                                # (all-to-all to H / cp heads of the whole window)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", Path(self.data))
        object.__setattr__(self, "out", Path(self.out))
        if self.init is not None:
            object.__setattr__(self, "init", Path(self.init))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        object.__setattr__(self, "seq_warmup", tuple(int(s) for s in self.seq_warmup))
        object.__setattr__(self, "log", tuple(dict.fromkeys(self.log)))
        self._validate()

    def _validate(self) -> None:
        for name in ("seq_len", "steps", "lr", "grad_accum", "micro_batch", "keep_checkpoints"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}", where=option_name(name))
        check_threads(self.threads)
        if self.chunk is not None and (not isinstance(self.chunk, int) or self.chunk < 0):
            raise ConfigError(f"chunk must be a token count, 0 (off) or None (auto), got {self.chunk!r}",
                              where="--chunk", fix="use e.g. --chunk 64k, --chunk off or --chunk auto")
        for name in ("warmup_steps", "seq_warmup_steps", "checkpoint_every", "indexer_dense_steps", "seed",
                     "weight_decay", "grad_clip", "moe_balance_coef", "moe_bias_rate", "indexer_kl_coef"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be zero or positive, got {getattr(self, name)}",
                                  where=option_name(name))
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"min_lr_ratio must be between 0 and 1, got {self.min_lr_ratio}",
                              where="--min-lr-ratio")
        if not 0.0 <= self.softmask_weight <= 1.0:
            raise ConfigError(f"softmask weight must be between 0 and 1, got {self.softmask_weight}",
                              fix="use 1.0 to train on repeats like other bases, or e.g. 0.1 (Evo 2)")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.indexer not in INDEXER_MODES:
            raise ConfigError(f"unknown indexer mode {self.indexer!r}", fix=f"choose one of {', '.join(INDEXER_MODES)}")
        if self.device not in DEVICES:
            raise ConfigError(f"unknown device {self.device!r}", fix=f"choose one of {', '.join(DEVICES)}")
        unknown = [name for name in self.log if name not in DASHBOARDS]
        if unknown:
            raise ConfigError(f"unknown --log {', '.join(unknown)}", where="--log",
                              fix=f"choose from {', '.join(DASHBOARDS)}")
        if not isinstance(self.cp, int) or self.cp < 1:
            raise ConfigError(f"--cp must be a positive number of ranks, got {self.cp!r}", where="--cp")
        if self.cp_layout not in CP_LAYOUTS:
            raise ConfigError(f"unknown --cp-layout {self.cp_layout!r}", where="--cp-layout",
                              fix=f"choose one of {', '.join(CP_LAYOUTS)}")
        if self.cp_kda not in CP_KDA_MODES:
            raise ConfigError(f"unknown --cp-kda {self.cp_kda!r}", where="--cp-kda",
                              fix=f"choose one of {', '.join(CP_KDA_MODES)}")
        if self.routing_group <= 0:
            raise ConfigError(f"routing_group must be positive, got {self.routing_group}", where="--routing-group")
        if self.compile not in COMPILE_MODES:
            raise ConfigError(f"unknown --compile {self.compile!r}", where="--compile",
                              fix=f"choose one of {', '.join(COMPILE_MODES)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}", fix=f"choose one of {', '.join(DTYPES)}")
        if self.stream_dtype not in STREAM_DTYPES:
            raise ConfigError(f"unknown --stream-dtype {self.stream_dtype!r}", where="--stream-dtype",
                              fix=f"choose one of {', '.join(STREAM_DTYPES)}")
        stages = list(self.seq_warmup)
        if stages:
            if self.seq_warmup_steps <= 0:
                raise ConfigError("a sequence-length warm-up needs --seq-warmup-steps > 0 (steps per stage)")
            if stages != sorted(set(stages)) or stages[-1] >= self.seq_len:
                raise ConfigError(f"warm-up lengths {stages} must increase and stay below --seq {self.seq_len}")
            bad = [s for s in stages if s <= 0 or self.seq_len % s]
            if bad:
                raise ConfigError(
                    f"warm-up length(s) {bad} do not divide --seq {self.seq_len}",
                    fix="use lengths like seq/2, seq/4 (the token budget per step is held by packing "
                        "seq/stage windows into each micro-batch)",
                )
            if len(stages) * self.seq_warmup_steps >= self.steps:
                raise ConfigError(f"the warm-up ({len(stages)} stages x {self.seq_warmup_steps} steps) does not leave "
                                  f"any of the {self.steps} steps at full length", fix="raise --steps or shorten it")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.micro_batch * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key, value in d.items():
            if isinstance(value, Path):
                d[key] = str(value)
            elif isinstance(value, tuple):
                d[key] = list(value)
        return d

    def reported(self) -> dict[str, Any]:
        """The settings as summary.json, the run record and the dashboards show them: under ``init`` the model is
        the checkpoint's, so the preset field (its default otherwise) is null. Checkpoints keep :meth:`to_dict`."""
        d = self.to_dict()
        if self.init is not None:
            d["model"] = None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


# TrainConfig fields whose `genolc finetune` option is not simply --field-name.
_OPTIONS = {"seq_len": "--seq", "warmup_steps": "--warmup", "keep_checkpoints": "--keep",
            "moe_balance_coef": "--moe-balance"}


def option_name(field: str) -> str:
    """The command-line option that sets TrainConfig ``field`` (for error messages)."""
    return _OPTIONS.get(field, "--" + field.replace("_", "-"))


# Fields that may differ between the run that wrote a checkpoint and the one resuming it: where and how long it
# runs, how often it saves and how it reports, and how a step is split into chunks, over how many threads and with
# which reduction order, over how many context-parallel ranks, compiled or not, and the residual streams' dtype
# (these four: the same result to rounding; a run from before --stream-dtype resumed on CUDA takes bf16 streams).
# Everything else changes what a step computes (so does the data-parallel size, torchrun's world size / --cp: it
# picks the windows).
RESUMABLE_CHANGES = frozenset({"out", "data", "steps", "checkpoint_every", "keep_checkpoints", "resume",
                               "progress", "device", "chunk", "threads", "deterministic", "log", "routing_group",
                               "cp", "cp_layout", "cp_kda", "compile", "stream_dtype"})


# Fields added after checkpoints were first written, with the value such older checkpoints were trained with.
_ABSENT_IN_OLDER_CHECKPOINTS = {"moe_bias_rate": 0.0}


def stream_dtype_for(config: TrainConfig, bf16: bool) -> str:
    """The residual streams' dtype a run uses: ``auto`` is bfloat16 under bf16 autocast (2026-12-02 on the H200,
    512k: steps 7-8 % shorter, peaks 13-14 GiB lower, the 20-step `small` curve the same as fp32 streams',
    benchmarks/results/stream_dtype_2026-12-02/), float32 otherwise. ``bf16``: whether the run autocasts, which
    ``--dtype auto`` leaves to the device; bfloat16 streams without it are refused here."""
    return resolve_stream_dtype(config.stream_dtype, bf16, why_fp32=f"--dtype {config.dtype} trains in float32 here",
                                fix="add --dtype bfloat16, or use --stream-dtype auto or float32")


def resolve_stream_dtype(stream_dtype: str, bf16: bool, *, why_fp32: str, fix: str) -> str:
    """``--stream-dtype`` resolved for a run (or plan) that autocasts to bf16 or not: ConfigError for bfloat16
    streams without autocast, saying ``why_fp32`` the run is fp32 and ``fix``."""
    if stream_dtype == "bfloat16" and not bf16:
        raise ConfigError(f"--stream-dtype bfloat16 needs bf16 autocast, but {why_fp32}", where="--stream-dtype",
                          fix=fix)
    if stream_dtype == "auto":
        return "bfloat16" if bf16 else "float32"
    return stream_dtype


def changed_for_resume(saved: dict[str, Any], current: TrainConfig) -> list[str]:
    """Names of settings that differ from a checkpoint's and would make a resumed run compute different steps."""
    now = current.to_dict()
    saved = {**_ABSENT_IN_OLDER_CHECKPOINTS, **saved}
    return [f"{k}: saved {saved.get(k)!r}, now {now[k]!r}" for k in now
            if k not in RESUMABLE_CHANGES and saved.get(k) != now[k]]


def preset_train_config(name: str, data: Path | str, out: Path | str, **overrides: Any) -> TrainConfig:
    """Named starting points: 'smoke' (CPU tests, tiny model), 'small-512k' (single H200 fine-tune)."""
    presets: dict[str, dict[str, Any]] = {
        "smoke": dict(model="tiny", seq_len=128, steps=20, lr=3e-3, warmup_steps=2, checkpoint_every=10,
                      progress=False),
        "small-512k": dict(model="small", seq_len=512 * 1024, steps=80, lr=3e-4, warmup_steps=8,
                           seq_warmup=(128 * 1024, 256 * 1024), seq_warmup_steps=8, recompute=True,
                           checkpoint_every=20),
    }
    if name not in presets:
        raise ConfigError(f"unknown training preset {name!r}", fix=f"choose one of {', '.join(presets)}")
    return TrainConfig(data=Path(data), out=Path(out), **{**presets[name], **overrides})
