"""What finetune reports beside ``metrics.jsonl``: per-step MoE routing figures and the optional dashboards.

:class:`StepMonitor` is the trainer's one seam for this. Each step runs inside :meth:`StepMonitor.capture`, which
tallies every MoE layer's routing (:mod:`genolc.routing`: forwards that build a graph only, so a chunked step's fill
pass and recompute's replay are not counted twice); :meth:`StepMonitor.log` then adds ``routing_busiest_over_mean``,
``routing_entropy`` and ``routing_drop_c<factor>`` (each ``{layer: value}``) to the step's metrics, before the
trainer writes them to ``metrics.jsonl`` (the record; the dashboards are views of the same numbers), and sends the
scalars to TensorBoard (``out/tensorboard/``, ``--log tensorboard``) and/or Weights & Biases in offline mode
(``out/wandb/``, ``--log wandb``). A dict metric ``{layer: value}`` becomes one scalar per layer, ``name/layer_i``.
:attr:`StepMonitor.run_routing` holds the whole run's routing (every step's tokens) for the run record.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
from typing import Any, Iterator

from genolc.errors import ConfigError
from genolc.routing import RoutingTally, capture_routing, flat_metrics, routing_summary
from genolc.train.config import TrainConfig

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"


def check_dashboards(config: TrainConfig) -> None:
    """Refuse a ``--log`` whose package is missing, saying how to install it (before anything is written)."""
    packages = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}
    for name in config.log:
        try:
            importlib.import_module(packages[name])
        except ImportError:
            raise ConfigError(f"--log {name} needs the {name} package, which is not installed", where="--log",
                              fix=f"pip install {name} (or leave out --log {name}: metrics.jsonl has every number)"
                              ) from None


def open_dashboards(config: TrainConfig) -> list[Any]:
    """Writers for ``config.log`` (checked by :func:`check_dashboards`)."""
    writers = []
    # Folders this call makes, removed again if a dashboard fails to open (a resumed run's earlier ones stay).
    created = [config.out / name for name, on in ((TENSORBOARD_DIR, "tensorboard" in config.log),
                                                  (WANDB_DIR, "wandb" in config.log))
               if on and not (config.out / name).exists()]
    if "tensorboard" in config.log:
        from torch.utils.tensorboard import SummaryWriter

        writers.append(_TensorBoard(SummaryWriter(str(config.out / TENSORBOARD_DIR))))
    if "wandb" in config.log:
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")
        (config.out / WANDB_DIR).mkdir(parents=True, exist_ok=True)
        try:
            run = wandb.init(project="genolc", dir=str(config.out / WANDB_DIR), mode=os.environ["WANDB_MODE"],
                             config=config.reported(), name=config.out.name)
        except Exception as exc:   # wandb raises its own errors, and plain ones (e.g. a timeout), from many places
            for writer in writers:
                writer.close()
            for folder in created:
                shutil.rmtree(folder, ignore_errors=True)
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(
                f"--log wandb: wandb.init failed ({type(exc).__name__}: {first_line})",
                where=f"{config.out / WANDB_DIR} (WANDB_MODE={os.environ['WANDB_MODE']})",
                fix="use --log tensorboard (or leave out --log: metrics.jsonl has every number), or check the WANDB_* "
                    "settings (WANDB_MODE offline needs no account; online needs WANDB_API_KEY and the network)"
            ) from None
        writers.append(_Wandb(run))
    return writers


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of one metrics line, flattened: ``{layer: v}`` dicts become ``name/layer_<layer>``."""
    flat: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or name == "step":
            continue
        if isinstance(value, (int, float)):
            flat[name] = float(value)
        elif isinstance(value, dict):
            flat.update({f"{name}/layer_{layer}": float(v) for layer, v in value.items()
                         if isinstance(v, (int, float))})
    return flat


class _TensorBoard:
    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def write(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, run: Any) -> None:
        self.run = run

    def write(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class StepMonitor:
    """Routing tallies per step and for the run, and the dashboards (see the module docstring)."""

    def __init__(self, config: TrainConfig, model: Any) -> None:
        check_dashboards(config)
        self.config = config
        self.model = model
        self.writers: list[Any] = []
        self._step_tallies: dict[int, RoutingTally] = {}
        self._run_tallies: dict[int, RoutingTally] = {}

    def __enter__(self) -> "StepMonitor":
        self.writers = open_dashboards(self.config)
        return self

    def __exit__(self, *exc: Any) -> None:
        for writer in self.writers:
            writer.close()

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        with capture_routing(self.model, self.config.routing_group, training=True) as tallies:
            yield
        self._step_tallies = tallies
        for layer, tally in tallies.items():
            if layer in self._run_tallies:
                self._run_tallies[layer].merge(tally)
            else:
                self._run_tallies[layer] = tally

    def log(self, metrics: dict[str, Any]) -> None:
        """Add this step's routing figures to ``metrics`` (in place) and send its numbers to the dashboards."""
        metrics.update(flat_metrics(routing_summary(self._step_tallies)))
        values = scalars(metrics)
        for writer in self.writers:
            writer.write(int(metrics["step"]), values)

    @property
    def run_routing(self) -> dict[str, Any]:
        return routing_summary(self._run_tallies)
