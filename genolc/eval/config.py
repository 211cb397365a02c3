"""Configurations of ``genolc eval``'s modes: frozen dataclasses validated on construction.

They are the single source of the evaluation defaults: ``genolc eval``'s options read theirs from here
(:func:`genolc.config_defaults.config_default`). :class:`EvalInputs` holds what every mode shares; ``--routing``
takes fewer of them (no bootstrap, seed or threads choice in its config) and keeps its own dataclass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from genolc.errors import ConfigError
from genolc.eval.buckets import FIRST_EDGE
from genolc.routing import DEFAULT_GROUP_TOKENS
from genolc.threads import check_threads
from genolc.units import format_length


@dataclass(frozen=True, kw_only=True)
class EvalInputs:
    """Options every ``genolc eval`` mode shares: what to score, with which model, how, and how to resample."""

    data: Path
    checkpoint: Path
    records: str = "heldout"                 # 'CHROM[,CHROM…]' or 'heldout'
    seq_len: int = 512 * 1024                # window = seq_len + 1 tokens
    out: Path = Path("genolc-eval")
    max_n_fraction: float = 0.5
    n_boot: int = 1000
    seed: int = 0
    force: bool = False
    device: str = "auto"
    dtype: str = "auto"
    batch_tokens: int = 1 << 16
    progress: bool = True
    threads: int | None = None               # CPU threads for torch; None: genolc.threads' rule

    def __post_init__(self) -> None:
        for name in ("data", "checkpoint", "out"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        check_threads(self.threads)
        if self.seq_len < 1:
            raise ConfigError(f"--seq must be positive, got {self.seq_len}")
        if self.n_boot < 1:
            raise ConfigError(f"--bootstrap must be positive, got {self.n_boot}")

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True, kw_only=True)
class ByPositionConfig(EvalInputs):
    """Everything that decides what ``genolc eval --by-position`` computes (shared options: EvalInputs)."""

    baseline: Path | None = None
    contexts: tuple[int, ...] = ()
    context_block: int | None = None         # targets per truncated-context forward; None: max(1, K // 4)
    first_bucket: int = FIRST_EDGE           # upper edge of the first position bucket (then doubling)
    rc_average: bool = False
    max_windows: int | None = None
    max_tokens: int | None = None
    per_target: bool = False                 # also write targets.csv.gz (one row per scored target)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.baseline is not None:
            object.__setattr__(self, "baseline", Path(self.baseline))
        object.__setattr__(self, "contexts", tuple(sorted(set(int(k) for k in self.contexts))))
        bad = [k for k in self.contexts if not 1 <= k < self.seq_len]
        if bad:
            raise ConfigError(f"--context {bad[0]} must be between 1 and --seq - 1 ({self.seq_len - 1})",
                              fix="truncate to fewer tokens than the window holds")
        for name in ("max_windows", "max_tokens", "context_block", "first_bucket"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")


@dataclass(frozen=True, kw_only=True)
class NeedleConfig(EvalInputs):
    """What ``genolc eval --needle`` plants and scores (shared options: EvalInputs)."""

    out: Path = Path("genolc-needle")
    segment_bases: int = 256
    trials: int = 8
    distances: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "distances", tuple(sorted(set(int(d) for d in self.distances))))
        for name, option in (("segment_bases", "--needle-bases"), ("trials", "--needle-trials")):
            if getattr(self, name) < 1:
                raise ConfigError(f"{option} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class RoutingConfig:
    """What ``genolc eval --routing`` routes; the options it shares with the other modes default as theirs do."""

    data: Path
    checkpoint: Path
    out: Path
    lengths: tuple[int, ...]                   # context lengths compared (tokens per window)
    records: str = EvalInputs.records          # CHROM[,CHROM…] or every held-out record
    group_tokens: int = DEFAULT_GROUP_TOKENS   # tokens per dispatch group (the capacity's budget)
    max_tokens: int | None = None              # tokens routed per length (default: one dispatch group)
    max_n_fraction: float = EvalInputs.max_n_fraction
    force: bool = EvalInputs.force
    device: str = EvalInputs.device
    dtype: str = EvalInputs.dtype
    batch_tokens: int = EvalInputs.batch_tokens
    progress: bool = EvalInputs.progress

    def __post_init__(self) -> None:
        lengths = tuple(sorted(set(int(n) for n in self.lengths)))
        if not lengths or lengths[0] < 2:
            raise ConfigError(f"--routing needs context lengths of at least 2 tokens, got {list(self.lengths)}",
                              where="--seq", fix="e.g. --seq 1k,4k,16k")
        bad = [n for n in lengths if lengths[-1] % n]
        if bad:
            raise ConfigError(f"context length(s) {[format_length(n) for n in bad]} do not divide the longest, "
                              f"{format_length(lengths[-1])}: the lengths must cut the same stretches of DNA",
                              where="--seq", fix="use lengths such as 1k,4k,16k")
        if self.group_tokens <= 0:
            raise ConfigError(f"the dispatch group must hold at least one token, got {self.group_tokens}",
                              where="--routing-group")
        object.__setattr__(self, "lengths", lengths)

    @property
    def budget(self) -> int:
        """Tokens routed per length: whole stretches of the longest length, at least one."""
        want = self.max_tokens or self.group_tokens
        return max(1, want // self.lengths[-1]) * self.lengths[-1]

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(self).items()}
