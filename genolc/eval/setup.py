"""What every ``genolc eval`` mode does before its own work: claim the output, read the dataset, resolve and check
its records, load the scorers.

:func:`run_scoring` checks ``--out`` first (absent, empty or an earlier evaluation's: a refusal costs no scoring),
runs the mode under the CPU thread choice, and turns a Ctrl-C before the mode's own stop handling into one message
that keeps nothing. :func:`open_records` opens the dataset and returns the records the window fits, refusing records
the checkpoints were trained on; :func:`load_scorers` loads the checkpoint (and a baseline) with the dataset's
tokenizer checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from genolc.eval.inputs import check_not_trained, check_window_fits, resolve_records
from genolc.fsutil import check_output_dir
from genolc.signals import Interrupted
from genolc.threads import ThreadChoice, run_threads


@dataclass
class Records:
    """The dataset and the records an evaluation reads."""

    dataset: Any
    keys: list[str]                  # records that hold at least one window
    skipped: list[str]               # held-out records too short for the window (pooled selections only)
    overlap: dict[str, Any]          # what check_not_trained found about training overlap


def run_scoring(config: Any, record: Any | None, body: Callable[[Any, Any | None, ThreadChoice], dict[str, Any]]
                ) -> dict[str, Any]:
    """``body(config, record, threads)`` after ``config.out`` is checked, under ``config.threads``."""
    from genolc.eval.report import OUTPUT_KIND

    check_output_dir(config.out, OUTPUT_KIND)
    try:
        with run_threads(config.threads, record) as threads:
            return body(config, record, threads)
    except KeyboardInterrupt:
        raise Interrupted.at_once("eval", where=str(config.out)) from None


def open_records(config: Any, window: int, baseline: Path | None = None) -> Records:
    """``config.data``'s records named by ``config.records`` that fit a window of ``window`` tokens, refused when
    the checkpoint (or ``baseline``) trained on them unless ``config.force``."""
    from genolc.data.dataset import PreparedDataset

    dataset = PreparedDataset(config.data)
    keys, pooled = resolve_records(dataset, config.records)
    checkpoints = [("checkpoint", config.checkpoint)] + ([("baseline", baseline)] if baseline is not None else [])
    overlap = check_not_trained(dataset, keys, checkpoints, config.force)
    keys, skipped = check_window_fits(dataset, keys, window, pooled)
    return Records(dataset=dataset, keys=keys, skipped=skipped, overlap=overlap)


def load_scorers(config: Any, tokenizer: Any, baseline: Path | None = None) -> dict[str, Any]:
    """``{"model": ...}`` (and ``"baseline"``) scorers on ``config.device`` / ``config.dtype``."""
    from genolc.eval.scorer import load_model_scorer

    how = dict(device=config.device, dtype=config.dtype, batch_tokens=config.batch_tokens)
    scorers = {"model": load_model_scorer(config.checkpoint, tokenizer, **how)}
    if baseline is not None:
        scorers["baseline"] = load_model_scorer(baseline, tokenizer, what="baseline checkpoint", **how)
    return scorers
