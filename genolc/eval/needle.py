"""``genolc eval --needle``: can the model copy a segment it saw D tokens earlier?

A trial takes one held-out window of real sequence (``seq + 1`` tokens) and a random segment of uniformly drawn
A/C/G/T bases (``--needle-bases``, tokenized with the dataset's tokenizer to ``S`` tokens). For each distance D the
segment overwrites the window twice: the second copy ends the window (tokens ``L-S .. L-1``), the first starts D
tokens earlier. Random bases cost 2 bits/base to a model that cannot copy; a model that uses the first copy
predicts most of the second nearly free. Per trial and D we report bits/base over every token of each copy (the
first token of the second copy included: nothing announces the repeat), and per D the mean over trials with 95%
percentile intervals from a bootstrap over trials (seeded). The same window and segment serve every D within a
trial, so differences between distances are paired. Distances default to 1k, 2k, 4k … and the largest that fits
(``L - S - 1``: the first copy must start at a target position). Cost: ``trials × len(distances)`` forward passes
of one window. Ctrl-C finishes the current trial and writes the trials done, marked interrupted (as ``--by-position``
does with windows).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from genolc.errors import ConfigError
from genolc.eval.buckets import FIRST_EDGE, bits_per_base
from genolc.eval.config import NeedleConfig
from genolc.eval.positions import WindowData
from genolc.eval.scorer import Scorer, score_full
from genolc.eval.setup import load_scorers, open_records, run_scoring
from genolc.signals import Interrupted, StopSignals
from genolc.threads import ThreadChoice

BASES = np.frombuffer(b"ACGT", dtype=np.uint8)


def default_distances(window_tokens: int, segment_tokens: int) -> list[int]:
    """1k, 2k, 4k, … below the largest distance that fits, then that largest distance."""
    largest = window_tokens - segment_tokens - 1
    if largest < segment_tokens:
        raise ConfigError(f"a window of {window_tokens} tokens cannot hold two copies of a {segment_tokens}-token "
                          "segment", fix="use a longer --seq or a shorter --needle-bases")
    out = []
    d = FIRST_EDGE
    while d < largest:
        out.append(d)
        d *= 2
    out.append(largest)
    return [x for x in out if x >= segment_tokens]


def random_segment(tokenizer: Any, n_bases: int, rng: np.random.Generator) -> np.ndarray:
    """Token ids of ``n_bases`` uniformly random upper-case bases (whole k-mers for a k-mer tokenizer).

    A k-mer tokenizer writes a length that is not a multiple of k with single-base remainder tokens, which a
    model only ever sees at record ends; planted mid-window they would be out of distribution, so the segment is
    cut to whole k-mers (at least one). ``segment_bases`` in the results counts the bases actually planted.
    """
    k = getattr(tokenizer, "fixed_bases_per_token", None)
    if k and k > 1:
        n_bases = max(k, n_bases - n_bases % k)
    return np.asarray(tokenizer.encode(BASES[rng.integers(0, 4, size=n_bases)]), dtype=np.int64)


def plant(ids: np.ndarray, segment: np.ndarray, distance: int) -> tuple[np.ndarray, int, int]:
    """(ids with the segment at ``L-S-distance`` and at ``L-S``, first start, second start)."""
    length, size = len(ids), len(segment)
    second = length - size
    first = second - distance
    if distance < size or first < 1:
        raise ValueError(f"distance {distance} does not fit two {size}-token copies in {length} tokens")
    out = np.array(ids, dtype=np.int64, copy=True)
    out[first:first + size] = segment
    out[second:second + size] = segment
    return out, first, second


def needle_trials(scorer: Scorer, hosts: Sequence[WindowData], tokenizer: Any, *, segment_bases: int,
                  trials: int, distances: Sequence[int] | None = None, seed: int = 0,
                  progress: Callable[[int], Any] | None = None,
                  stop: Callable[[], bool] | None = None) -> pd.DataFrame:
    """One row per (trial, distance): bits/base on each copy. Hosts are used in turn (trial t -> hosts[t % n]).

    ``progress(total)``, when given, returns a bar (``update``, ``close``) for the ``total`` forward passes; every
    trial's segment and distances are drawn and checked before the first one, so the total is exact and a distance
    that does not fit is refused before any scoring. ``stop()`` is asked before each trial is scored; once it says
    True no further trial starts.
    """
    if not hosts:
        raise ConfigError("no held-out window to plant the needle in")
    rng = np.random.default_rng(seed)
    planned = []
    for t in range(trials):
        host = hosts[t % len(hosts)]
        segment = random_segment(tokenizer, segment_bases, rng)
        chosen = list(distances) if distances else default_distances(len(host.ids), len(segment))
        for d in chosen:
            if d < len(segment) or len(host.ids) - len(segment) - d < 1:
                raise ConfigError(f"needle distance {d} does not fit a {len(segment)}-token segment twice in a "
                                  f"{len(host.ids)}-token window",
                                  fix=f"use distances between {len(segment)} and {len(host.ids) - len(segment) - 1}")
        planned.append((t, host, segment, chosen))
    bar = progress(sum(len(chosen) for *_, chosen in planned)) if progress is not None else None
    rows = []
    try:
        for t, host, segment, chosen in planned:
            if stop is not None and stop():
                break
            seg_bases = np.maximum(np.asarray(tokenizer.token_lengths(segment)), 1)
            for d in chosen:
                ids, first, second = plant(host.ids, segment, d)
                logp = score_full(scorer, ids)
                rows.append({
                    "trial": t, "distance": int(d), "key": host.key, "window_start": host.start,
                    "chrom_start": host.chrom_start, "segment_tokens": len(segment),
                    "segment_bases": int(seg_bases.sum()), "first_start": first, "second_start": second,
                    "first_bits_per_base": _copy_bits(logp, first, seg_bases),
                    "second_bits_per_base": _copy_bits(logp, second, seg_bases),
                })
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    frame = pd.DataFrame(rows)
    if not rows:
        return frame
    frame["delta_bits_per_base"] = frame["second_bits_per_base"] - frame["first_bits_per_base"]
    return frame


def _copy_bits(logp: np.ndarray, start: int, seg_bases: np.ndarray) -> float:
    # target at window index i is logp[i - 1]
    part = logp[start - 1:start - 1 + len(seg_bases)]
    return float((bits_per_base(part, seg_bases) * seg_bases).sum() / seg_bases.sum())


def summarise_needle(trials: pd.DataFrame, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per distance: mean bits/base on each copy and their difference, with bootstrap-over-trials intervals."""
    rng = np.random.default_rng(seed)
    tail = (1.0 - level) / 2.0 * 100.0
    rows = []
    for d, part in trials.groupby("distance", sort=True):
        row: dict[str, Any] = {"distance": int(d), "trials": len(part)}
        draws = rng.integers(0, len(part), size=(n_boot, len(part)))
        for name in ("first", "second", "delta"):
            values = part[f"{name}_bits_per_base"].to_numpy(dtype=np.float64)
            reps = values[draws].mean(axis=1)
            lo, hi = np.percentile(reps, [tail, 100.0 - tail])
            row[f"{name}_bits_per_base"] = float(values.mean())
            row[f"{name}_ci_low"], row[f"{name}_ci_high"] = float(lo), float(hi)
        rows.append(row)
    return pd.DataFrame(rows)


def run_needle(config: NeedleConfig, record: Any | None = None) -> dict[str, Any]:
    """Run the needle test on held-out windows of ``config.data`` and write its outputs into ``config.out``.

    Raises :class:`genolc.signals.Interrupted` when stopped by a signal, after writing the trials done.
    """
    return run_scoring(config, record, _run_needle)


def _run_needle(config: NeedleConfig, record: Any | None, threads: ThreadChoice) -> dict[str, Any]:
    from genolc.data.sampler import tile_for_eval
    from genolc.eval.by_position import _progress, select_windows, window_data
    from genolc.eval.report import write_needle

    t0 = time.monotonic()
    opened = open_records(config, config.seq_len)
    dataset, keys, skipped, overlap = opened.dataset, opened.keys, opened.skipped, opened.overlap
    scorer = load_scorers(config, dataset.tokenizer)["model"]
    tiled = [w for w in tile_for_eval(dataset, keys, config.seq_len, max_n_fraction=config.max_n_fraction)
             if not w.partial]
    if not tiled:
        raise ConfigError(f"no full window of {config.seq_len + 1} tokens in {', '.join(keys)} passes the N filter",
                          fix="use a shorter --seq")
    hosts = [window_data(dataset, w) for w in select_windows(tiled, config.trials, None)]
    with StopSignals("finishing the current trial, then writing the trials done so far") as stop:
        trials = needle_trials(scorer, hosts, dataset.tokenizer, segment_bases=config.segment_bases,
                               trials=config.trials, distances=config.distances or None, seed=config.seed,
                               progress=lambda total: _progress(total, config.progress, "needle forwards", "forward"),
                               stop=lambda: stop.received is not None)
    done = int(trials["trial"].nunique()) if len(trials) else 0
    if done == 0:
        raise Interrupted(f"eval stopped by {stop.name} before the first needle trial was done; nothing was written",
                          stop.received, where=str(config.out), fix="run it again")
    per_distance = summarise_needle(trials, config.n_boot, config.seed)
    summary = {
        "command": "eval --needle",
        "status": "ok" if done == config.trials else "interrupted",
        "config": config.to_dict(),
        "dataset": {"path": str(config.data), "tokenizer": dataset.tokenizer.to_dict()},
        "records": keys,
        "records_skipped_too_short": skipped,
        "training_overlap": overlap,
        "needle": {"segment_bases": int(trials["segment_bases"].iloc[0]),
                   "segment_tokens": int(trials["segment_tokens"].iloc[0]),
                   "trials": config.trials, "trials_done": done, "host_windows": len(hosts),
                   "distances": sorted(trials["distance"].unique().tolist()),
                   "placement": "second copy ends the window; first copy starts D tokens before it"},
        "per_distance": per_distance.to_dict(orient="records"),
        **threads.to_dict(),
        "seconds": round(time.monotonic() - t0, 3),
    }
    write_needle(config.out, summary, trials, per_distance, record)
    if done < config.trials:
        raise Interrupted(f"eval stopped by {stop.name} after {done} of {config.trials} needle trials; their results "
                          "are written, marked interrupted (summary.json: status, needle.trials_done)", stop.received,
                          where=str(config.out), fix="run it again to do every trial", kept=summary)
    return summary
