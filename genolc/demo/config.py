"""What ``genolc demo`` is asked for: a frozen dataclass, validated on construction, the source of its defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from genolc.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class DemoConfig:
    """What the user asks of the demo; the sizes come from its plan (:func:`genolc.demo.pipeline.demo_plan`)."""

    out: Path = Path("genolc-demo")
    steps: int | None = None          # override the plan's optimizer steps
    seq: int | None = None            # override the training and evaluation window (tokens)
    smoke: bool = False               # smallest end-to-end form (CI)
    device: str = "auto"              # auto | cpu | cuda
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"--steps must be positive, got {self.steps}")
        if self.seq is not None and self.seq < 2:
            raise ConfigError(f"--seq must be at least 2 tokens, got {self.seq}")
        if self.device not in DEVICES:
            raise ConfigError(f"unknown device {self.device!r}", fix="choose auto, cpu or cuda")
