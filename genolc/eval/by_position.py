"""``genolc eval --by-position``: held-out loss by preceding-context position, from a dataset and checkpoints.

Flow: open the prepared dataset → resolve records → refuse trained-on records / short records / tokenizer
mismatches → tile with :func:`genolc.data.sampler.tile_for_eval` (non-overlapping windows of ``seq + 1`` tokens,
N-heavy spans skipped) → bound the work (``--max-windows``, ``--max-tokens``: evenly spaced windows, whole windows
only) → score (:mod:`genolc.eval.positions`) → write CSV/JSON/PNG atomically into ``--out`` (:mod:`genolc.eval.report`).

``--out`` is checked first (:func:`genolc.fsutil.check_output_dir`: absent, empty or an earlier evaluation's), so a
refusal costs no scoring. Ctrl-C (or SIGTERM) while scoring finishes the current window and writes the windows
scored so far, marked ``"status": "interrupted"`` in summary.json and the run record, then exits with code 130; a
second Ctrl-C, or one before scoring starts, stops at once and writes nothing (:mod:`genolc.signals`).
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Sequence

import numpy as np

from genolc.errors import ConfigError
from genolc.eval.buckets import BLOCK_BASES, FEW_BLOCKS_FOR_CI, MIN_BLOCKS_FOR_CI, bucket_edges
from genolc.eval.config import ByPositionConfig
from genolc.eval.positions import WindowData, score_windows, summarise
from genolc.eval.scorer import forward_tokens
from genolc.eval.setup import load_scorers, open_records, run_scoring
from genolc.signals import Interrupted, StopSignals
from genolc.threads import ThreadChoice


def select_windows(windows: Sequence[Any], max_windows: int | None, max_tokens: int | None) -> list[Any]:
    """At most ``max_windows`` windows and ``max_tokens`` tokens, spread evenly over the tiling (whole windows)."""
    windows = list(windows)
    limit = len(windows)
    if max_windows is not None:
        limit = min(limit, max_windows)
    if max_tokens is not None and windows:
        width = max(len(w) for w in windows)
        if max_tokens < width:
            raise ConfigError(f"--max-tokens {max_tokens} is smaller than one window ({width} tokens)",
                              fix=f"use --max-tokens {width} or more, or a shorter --seq")
        limit = min(limit, max_tokens // width)
    if limit >= len(windows):
        return windows
    picks = np.unique(np.floor(np.arange(limit) * len(windows) / limit).astype(np.int64))
    return [windows[i] for i in picks.tolist()]


def window_data(dataset: Any, w: Any) -> WindowData:
    """Load one EvalWindow's tokens and per-token facts from a PreparedDataset."""
    ids = np.asarray(dataset.tokens(w.key)[w.start:w.stop], dtype=np.int64)
    offsets = np.asarray(dataset.token_base_offsets(w.key, w.start, w.stop), dtype=np.int64)[: len(ids)]
    return WindowData(
        key=w.key, chrom=w.chrom, start=w.start, stop=w.stop, chrom_start=int(w.chrom_start), ids=ids,
        ambiguous=np.asarray(dataset.token_ambiguous(w.key, w.start, w.stop), dtype=bool),
        softmask=np.asarray(dataset.token_softmask(w.key, w.start, w.stop), dtype=bool),
        token_bases=np.asarray(dataset.tokenizer.token_lengths(ids), dtype=np.int64),
        base_offsets=offsets - offsets[0],
    )


def _iter_windows(dataset: Any, windows: Sequence[Any], stop: StopSignals) -> Iterator[WindowData]:
    for w in windows:
        if stop.received is not None:
            return
        yield window_data(dataset, w)


def run_by_position(config: ByPositionConfig, record: Any | None = None) -> dict[str, Any]:
    """Run the evaluation and write its outputs into ``config.out``; returns the JSON summary.

    Raises :class:`genolc.signals.Interrupted` when stopped by a signal, after writing the windows scored so far.
    """
    return run_scoring(config, record, _run_by_position)


def _run_by_position(config: ByPositionConfig, record: Any | None, threads: ThreadChoice) -> dict[str, Any]:
    from genolc.data.sampler import tile_for_eval
    from genolc.eval.report import write_by_position

    t0 = time.monotonic()
    opened = open_records(config, config.seq_len, config.baseline)
    dataset, keys, skipped, overlap = opened.dataset, opened.keys, opened.skipped, opened.overlap
    scorers = load_scorers(config, dataset.tokenizer, config.baseline)
    tiled = tile_for_eval(dataset, keys, config.seq_len, max_n_fraction=config.max_n_fraction)
    if not tiled:
        raise ConfigError(f"no window of {config.seq_len + 1} tokens in {', '.join(keys)} passes the N filter "
                          f"(at most {config.max_n_fraction:.0%} ambiguous tokens)",
                          fix="use a shorter --seq or a larger --max-n-fraction")
    chosen = select_windows(tiled, config.max_windows, config.max_tokens)
    rc_tokenizer = dataset.tokenizer if config.rc_average else None
    if rc_tokenizer is not None:
        from genolc.eval.scorer import rc_check

        first = window_data(dataset, chosen[0])
        rc_check(rc_tokenizer, first.ids)
    edges = bucket_edges(max(len(w) for w in chosen) - 1, config.first_bucket)
    progress = _progress(len(chosen), config.progress)
    with StopSignals("finishing the current window, then writing the windows scored so far") as stop:
        tables = score_windows(_iter_windows(dataset, chosen, stop), scorers, edges, contexts=config.contexts,
                               context_block=config.context_block, rc_tokenizer=rc_tokenizer,
                               keep_targets=config.per_target, progress=progress)
    if progress is not None:
        progress.close()
    selected, chosen = len(chosen), chosen[:len(tables.window_rows)]
    interrupted = len(chosen) < selected
    if interrupted and not chosen:
        raise Interrupted(f"eval stopped by {stop.name} before the first window was scored; nothing was written",
                          stop.received, where=str(config.out), fix="run it again")
    bucket_rows, compare_rows = summarise(tables, n_boot=config.n_boot, seed=config.seed)
    model_tokens = sum(forward_tokens(len(w), config.contexts, config.context_block, config.rc_average)
                       for w in chosen)
    summary = {
        "command": "eval --by-position",
        "status": "interrupted" if interrupted else "ok",
        "config": config.to_dict(),
        "dataset": {"path": str(config.data), "tokenizer": dataset.tokenizer.to_dict()},
        "records": keys,
        "records_skipped_too_short": skipped,
        "training_overlap": overlap,
        # Interrupted: "scored" are the first of the "selected" windows, in record order.
        "windows": {"tiled": len(tiled), "selected": selected, "scored": len(chosen),
                    "tokens": int(sum(len(w) for w in chosen)),
                    "partial": int(sum(bool(getattr(w, "partial", False)) for w in chosen))},
        "buckets": {"edges": edges.tolist(), "labels": tables.labels, "position": "tokens before the target in its "
                    "window"},
        "estimator": {"unit": "bits per base = sum(-log2 p) / sum(token bases)", "ci": "95% percentile interval",
                      "bootstrap": "stratified block bootstrap: 16 kb target blocks redrawn with replacement within "
                                   "each window (single-block windows pooled)",
                      "block_bases": BLOCK_BASES, "replicates": config.n_boot, "seed": config.seed,
                      "min_blocks_for_ci": MIN_BLOCKS_FOR_CI, "few_blocks_for_ci": FEW_BLOCKS_FOR_CI},
        "context_control": {
            "contexts": list(config.contexts),
            "block": {str(k): (config.context_block or max(1, k // 4)) for k in config.contexts},
            "visible_tokens": "between K and K + block - 1 (targets with at most K tokens before them keep their "
                              "full-context score)"},
        "rc_average": config.rc_average,
        **threads.to_dict(),
        "cost": {"model_forward_tokens": int(model_tokens),
                 "baseline_forward_tokens": int(sum(len(w) for w in chosen) * (2 if config.rc_average else 1))
                 if config.baseline else 0,
                 "seconds": None},
        "overall": _overall(bucket_rows),
        "bucket_stats": bucket_rows,
        "comparisons": compare_rows,
    }
    summary["cost"]["seconds"] = round(time.monotonic() - t0, 3)
    write_by_position(config.out, summary, tables, record)
    if interrupted:
        raise Interrupted(f"eval stopped by {stop.name} after {len(chosen)} of {selected} windows; their results are "
                          "written, marked interrupted (summary.json: status, windows.scored)", stop.received,
                          where=str(config.out), fix="run it again to score every window (the windows scored are "
                                                     "the first in record order, not a spread over the records)",
                          kept=summary)
    return summary


def _overall(bucket_rows: list[dict]) -> dict[str, Any]:
    return {f"{r['series']}/{r['subset']}": r["bits_per_base"] for r in bucket_rows if r["bucket"] == "all"}


def _progress(total: int, enabled: bool, desc: str = "eval windows", unit: str = "window") -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False)
