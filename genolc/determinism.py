"""``genolc finetune --deterministic``: bitwise-reproducible training where the kernels allow it, and a record of
whether a run was.

What varied between two identical CPU runs: with more than one thread, the backward of DSA's row gather
(``latent[batch, indices]`` in ``genolc.model.ops.dsa.reference``, an ``index_put_`` with ``accumulate=True``) adds
gradient rows that many queries selected with atomic float adds from several threads, in an order set by thread
timing; the forward pass was always identical. Deterministic mode:

- ``torch.use_deterministic_algorithms(True, warn_only=True)``: that accumulation (and every torch op with a
  deterministic alternative, on CPU and CUDA) takes the deterministic path; an op torch has none for is named in
  one message and recorded, instead of stopping the run;
- ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` when unset (cuBLAS needs it for reproducible GEMMs; it takes effect when
  cuBLAS is first used in the process) and ``torch.backends.cudnn.benchmark = False``;
- one CPU thread unless ``--threads`` says otherwise (genolc.threads): results depend on the thread count, so it
  must not follow the machine's load. Runs with the same ``--threads N`` agree bit for bit with each other.

Kernels outside torch that are not deterministic are named in one message when training starts (see
:func:`nondeterministic_kernels`); the run record and ``summary.json`` say ``deterministic: true`` only when the
mode was on and no such kernel or op ran.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from genolc.threads import ThreadChoice, run_threads

CUBLAS_WORKSPACE = ":4096:8"
_TORCH_ALERT = re.compile(r"^(?P<op>\S+) does not have a deterministic implementation")


@dataclass
class DeterminismReport:
    """What a run's deterministic mode covered: ``requested``, and the kernels/ops that were not deterministic."""

    requested: bool
    nondeterministic: list[str] = field(default_factory=list)

    @property
    def deterministic(self) -> bool:
        return self.requested and not self.nondeterministic

    def add(self, what: str) -> bool:
        """Record ``what``; True the first time it is seen."""
        if what in self.nondeterministic:
            return False
        self.nondeterministic.append(what)
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"deterministic": self.deterministic, "deterministic_requested": self.requested,
                "nondeterministic_ops": list(self.nondeterministic)}


def nondeterministic_kernels(device_type: str, layer_types: tuple[str, ...]) -> list[str]:
    """genolc's kernels (not torch's, which torch names itself) that give run-to-run different results on this
    device for a model with these layer types."""
    if device_type != "cuda":
        return []
    kernels = []
    if "indexed_attention" in layer_types:
        kernels.append("DSA sparse attention backward (genolc's TileLang/Triton kernels add gradient rows with fp32 "
                       "atomics; so does the sparse indexer KL's backward, for the pool keys)")
    if "linear_attention" in layer_types:
        kernels.append("KDA (fla's chunk_kda Triton/TileLang kernels promise no determinism, and Triton's autotuner "
                       "picks their block sizes from timings)")
    return kernels


@contextlib.contextmanager
def deterministic_mode(enabled: bool, say: Callable[[str], None]) -> Iterator[DeterminismReport]:
    """Inside the block torch runs its deterministic algorithms when ``enabled``; an op without one is said once
    through ``say`` and recorded in the report. Everything is restored afterwards."""
    report = DeterminismReport(requested=enabled)
    if not enabled:
        yield report
        return
    import torch

    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            alert = _TORCH_ALERT.match(str(message))
            if alert is None:
                shown(message, category, filename, lineno, file, line)
            elif report.add(f"{alert['op']} (torch has no deterministic implementation)"):
                say(f"--deterministic: torch has no deterministic implementation of {alert['op']}; this run is not "
                    "bitwise reproducible (recorded in summary.json: nondeterministic_ops)")

        warnings.showwarning = show
        # Every occurrence reaches show(), which says each op once: Python's once-per-location filter would hide
        # an op already reported by an earlier run in the same process.
        warnings.filterwarnings("always", message=r".* does not have a deterministic implementation")
        try:
            yield report
        finally:
            torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
            torch.backends.cudnn.benchmark = previous[2]
            if previous[3] is None:
                os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def note_kernels(report: DeterminismReport, device_type: str, layer_types: tuple[str, ...],
                 say: Callable[[str], None]) -> None:
    """Record and say, in one message, the kernels of this model that stay nondeterministic on this device."""
    if not report.requested:
        return
    kernels = nondeterministic_kernels(device_type, layer_types)
    for kernel in kernels:
        report.add(kernel)
    if kernels:
        say("--deterministic: these kernels are not deterministic, so runs on " + device_type + " may differ in the "
            "last bits: " + "; ".join(kernels) + ". Every other op runs torch's deterministic algorithms (recorded in "
            "summary.json: nondeterministic_ops)")


@dataclass
class ComputeSettings:
    """A run's CPU threads and deterministic mode, as the run record and summary.json report them."""

    threads: ThreadChoice
    determinism: DeterminismReport

    def to_dict(self) -> dict[str, Any]:
        return {**self.threads.to_dict(), **self.determinism.to_dict()}


@contextlib.contextmanager
def compute_settings(threads: int | None, deterministic: bool, say: Callable[[str], None],
                     record: Any = None) -> Iterator[ComputeSettings]:
    """Apply the thread count (genolc.threads) and deterministic mode for the block; restore both afterwards.
    ``record`` (a :class:`genolc.runs.RunRecord`) gets the settings as the block starts and again as it ends."""
    with run_threads(threads, record, deterministic=deterministic) as choice, \
            deterministic_mode(deterministic, say) as report:
        settings = ComputeSettings(choice, report)
        try:
            yield settings
        finally:
            if record is not None:
                record.compute.update(settings.to_dict())
