"""`genolc export`'s configuration: one frozen dataclass, the single source of its defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from genolc.errors import ConfigError

FORMATS = ("skyrl", "megatron")
# The checkpoint the trainer starts from by default: the published transformers-layout GLM-5.3-Flash.
DEFAULT_MODEL_PATH = "zai-org/GLM-5.3-Flash"


@dataclass(frozen=True)
class ExportConfig:
    data: Path
    out: Path
    seq_len: int
    format: str = "skyrl"
    windows: int = 1024
    seed: int = 0
    max_n_fraction: float = 0.1
    reverse_complement: bool = False
    text_tokenizer: Path | None = None
    model: str = "glm-5.3-flash"
    model_path: str = DEFAULT_MODEL_PATH
    gpus: int = 64
    gpus_per_node: int = 8
    gpu_memory_gib: float = 139.0
    max_context_parallel: int = 1
    progress: bool = True

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(f"unknown export format {self.format!r}", where="--format",
                              fix=f"use one of {', '.join(FORMATS)}")
        if self.windows < 1:
            raise ConfigError(f"--windows must be at least 1, got {self.windows}")
        if self.seed < 0:
            raise ConfigError(f"--seed must be a non-negative integer, got {self.seed}")
        if self.gpus < 1 or self.gpus_per_node < 1:
            raise ConfigError(f"--gpus and --gpus-per-node must be at least 1, got {self.gpus} and "
                              f"{self.gpus_per_node}")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ConfigError(f"--gpus {self.gpus} is not a whole number of {self.gpus_per_node}-GPU nodes",
                              where="--gpus", fix="use a multiple of --gpus-per-node (SkyRL places whole nodes)")
        if self.max_context_parallel < 1:
            raise ConfigError(f"--max-context-parallel must be at least 1, got {self.max_context_parallel}")
        if not 0.0 <= self.max_n_fraction <= 1.0:
            raise ConfigError(f"--max-n-fraction must be between 0 and 1, got {self.max_n_fraction}",
                              where="--max-n-fraction", fix="pass e.g. --max-n-fraction 0.1")
        if not self.gpu_memory_gib > 0:
            raise ConfigError(f"--gpu-memory must be positive, got {self.gpu_memory_gib}")

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)

    @property
    def gpus_on_each_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
