"""Held-out loss by preceding-context position: scoring windows and turning block sums into bucket statistics.

This module is model-independent: it takes windows (:class:`WindowData`) and scorers (:mod:`genolc.eval.scorer`),
and returns tables. :mod:`genolc.eval.by_position` feeds it from a prepared dataset and checkpoints.

Series: ``model`` (full context), ``baseline`` (full context, when given) and ``context:K`` (the model with
truncated context K, one per ``--context``), all over the same targets. Subsets: ``all``, ``unmasked`` and
``softmasked`` targets (a token is soft-masked when most of its bases are lowercase in the source). Targets that
are ambiguous (N/IUPAC) are excluded, as is, under ``--rc-average``, each window's last target.
Comparisons, per bucket, with paired block-bootstrap CIs: ``model - baseline`` (negative: the model is better)
and ``context:K - model`` (truncated minus full; positive: context beyond K tokens helps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from genolc.eval.buckets import (
    BLOCK_BASES,
    BlockBootstrap,
    BlockTable,
    Interval,
    block_ids,
    bootstrap_paired,
    bootstrap_ratio,
    bucket_index,
    bucket_labels,
    bits_per_base,
    windows_per_bucket,
)
from genolc.eval.scorer import Scorer, score_window

SUBSETS = ("all", "unmasked", "softmasked")


@dataclass
class WindowData:
    """One evaluation window: tokens ``[start, stop)`` of record ``key`` with per-token facts.

    ids, ambiguous, softmask, token_bases, base_offsets: ``[L]``; base_offsets count bases from the window's first
    base, whose 1-based chromosome coordinate is ``chrom_start``.
    """

    key: str
    chrom: str
    start: int
    stop: int
    chrom_start: int
    ids: np.ndarray
    ambiguous: np.ndarray
    softmask: np.ndarray
    token_bases: np.ndarray
    base_offsets: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.ids)
        for name in ("ambiguous", "softmask", "token_bases", "base_offsets"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"window {self.key}:{self.start}: {name} has {len(getattr(self, name))} entries, "
                                 f"ids has {n}")


@dataclass
class PositionTables:
    """Accumulated per-block sums for each subset, plus per-window and per-block rows for the reports."""

    edges: np.ndarray
    series: tuple[str, ...]
    block_bases: int = BLOCK_BASES
    tables: dict[str, BlockTable] = field(init=False)
    window_rows: list[dict] = field(default_factory=list)
    block_rows: list[dict] = field(default_factory=list)
    targets: dict[str, list[np.ndarray]] | None = None

    def __post_init__(self) -> None:
        self.tables = {s: BlockTable(len(self.edges) - 1, self.series) for s in SUBSETS}

    @property
    def labels(self) -> list[str]:
        return bucket_labels(self.edges)


def series_names(has_baseline: bool, contexts: Sequence[int]) -> tuple[str, ...]:
    return ("model",) + (("baseline",) if has_baseline else ()) + tuple(f"context:{k}" for k in contexts)


def score_windows(windows: Iterable[WindowData], scorers: dict[str, Scorer], edges: np.ndarray, *,
                  contexts: Sequence[int] = (), context_block: int | None = None, rc_tokenizer: Any | None = None,
                  keep_targets: bool = False, progress: Any = None) -> PositionTables:
    """Score every window with ``scorers['model']`` (full and truncated) and ``scorers['baseline']`` if present."""
    names = series_names("baseline" in scorers, contexts)
    out = PositionTables(edges=np.asarray(edges), series=names)
    if keep_targets:
        out.targets = {n: [] for n in ("key", "chrom_pos", "position", "bases", "softmask") + names}
    for w in windows:
        bits = _window_bits(w, scorers, contexts, context_block, rc_tokenizer)
        positions = np.arange(1, len(w.ids))
        keep = ~w.ambiguous[1:]
        for value in bits.values():
            keep &= np.isfinite(value)
        idx = np.flatnonzero(keep)
        pos = positions[idx]
        buckets = bucket_index(pos, out.edges)
        blocks = block_ids(w.base_offsets[pos], out.block_bases)
        bases = w.token_bases[pos].astype(np.float64)
        soft = w.softmask[pos].astype(bool)
        kept_bits = {n: bits[n][idx] * bases for n in names}
        info = _block_info(w, blocks, out.block_bases)
        for subset, mask in (("all", slice(None)), ("unmasked", ~soft), ("softmasked", soft)):
            out.tables[subset].add_window(buckets[mask], blocks[mask], bases[mask],
                                          {n: v[mask] for n, v in kept_bits.items()}, info)
        out.window_rows.append(_window_row(w, len(idx), bases, kept_bits))
        out.block_rows.extend(_block_rows(w, info, blocks, bases, kept_bits))
        if out.targets is not None:
            out.targets["key"].append(np.full(len(idx), w.key, dtype=object))
            out.targets["chrom_pos"].append(w.chrom_start + w.base_offsets[pos])
            out.targets["position"].append(pos)
            out.targets["bases"].append(bases.astype(np.int32))
            out.targets["softmask"].append(soft)
            for n in names:
                out.targets[n].append(bits[n][idx])
        if progress is not None:
            progress.update(1)
    return out


def _window_bits(w: WindowData, scorers: dict[str, Scorer], contexts: Sequence[int], context_block: int | None,
                 rc_tokenizer: Any | None) -> dict[str, np.ndarray]:
    """Bits per base of each target (index i-1 for target i) for every series; NaN where a series has none."""
    target_bases = np.maximum(w.token_bases[1:], 1)
    model = score_window(scorers["model"], w.ids, contexts=contexts, context_block=context_block,
                         rc_tokenizer=rc_tokenizer)
    bits = {"model": bits_per_base(model["full"], target_bases)}
    if "baseline" in scorers:
        base = score_window(scorers["baseline"], w.ids, rc_tokenizer=rc_tokenizer)
        bits["baseline"] = bits_per_base(base["full"], target_bases)
    for k in contexts:
        bits[f"context:{k}"] = bits_per_base(model[f"ctx:{k}"], target_bases)
    return bits


def _block_info(w: WindowData, blocks: np.ndarray, block_bases: int) -> list[dict]:
    n_blocks = int(blocks.max()) + 1 if len(blocks) else 0
    window_bases = int(w.base_offsets[-1] + w.token_bases[-1]) if len(w.ids) else 0
    return [{"key": w.key, "chrom": w.chrom, "window_start": w.start, "block": j,
             "chrom_start": w.chrom_start + j * block_bases,
             "chrom_end": w.chrom_start + min((j + 1) * block_bases, window_bases) - 1}
            for j in range(n_blocks)]


def _window_row(w: WindowData, n_targets: int, bases: np.ndarray, kept_bits: dict[str, np.ndarray]) -> dict:
    total = float(bases.sum())
    row = {"key": w.key, "chrom": w.chrom, "start": w.start, "stop": w.stop, "chrom_start": w.chrom_start,
           "chrom_end": w.chrom_start + int(w.base_offsets[-1] + w.token_bases[-1]) - 1,
           "targets": n_targets, "bases": int(total)}
    for n, v in kept_bits.items():
        row[f"{n}_bits_per_base"] = float(v.sum() / total) if total > 0 else None
    return row


def _block_rows(w: WindowData, info: list[dict], blocks: np.ndarray, bases: np.ndarray,
                kept_bits: dict[str, np.ndarray]) -> list[dict]:
    if not info:
        return []
    n = len(info)
    base_sum = np.bincount(blocks, weights=bases, minlength=n)
    count = np.bincount(blocks, minlength=n)
    sums = {k: np.bincount(blocks, weights=v, minlength=n) for k, v in kept_bits.items()}
    rows = []
    for j in np.flatnonzero(count).tolist():
        row = dict(info[j], targets=int(count[j]), bases=int(base_sum[j]))
        for k, s in sums.items():
            row[f"{k}_bits_per_base"] = float(s[j] / base_sum[j])
        rows.append(row)
    return rows


def _interval_dict(iv: Interval) -> dict[str, float | None]:
    return {"bits_per_base": iv.value, "ci_low": iv.low, "ci_high": iv.high}


def summarise(tables: PositionTables, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
              ) -> tuple[list[dict], list[dict]]:
    """(bucket rows, comparison rows). The last bucket of every table is ``all`` (every position pooled).

    Empty buckets (no kept target) have ``empty: True`` and ``None`` statistics, never NaN.
    """
    labels = tables.labels + ["all"]
    los = tables.edges[:-1].tolist() + [int(tables.edges[0])]
    his = tables.edges[1:].tolist() + [int(tables.edges[-1])]
    bucket_rows: list[dict] = []
    compare_rows: list[dict] = []
    comparisons = [(n, "model") for n in tables.series if n.startswith("context:")]
    if "baseline" in tables.series:
        comparisons.insert(0, ("model", "baseline"))
    for subset in SUBSETS:
        bases, tokens, bits, stratum = tables.tables[subset].arrays()
        add_total = lambda m: np.concatenate([m, m.sum(1, keepdims=True)], axis=1)  # noqa: E731
        bases, tokens = add_total(bases), add_total(tokens)
        bits = {n: add_total(v) for n, v in bits.items()}
        n_windows = windows_per_bucket(tokens, stratum, len(labels))
        boot = BlockBootstrap(stratum, n_boot, seed)
        for name in tables.series:
            for b, iv in enumerate(bootstrap_ratio(bits[name], bases, boot, level)):
                bucket_rows.append({"series": name, "subset": subset, "bucket": labels[b], "lo": los[b],
                                    "hi": his[b], "tokens": int(tokens[:, b].sum()), "bases": int(bases[:, b].sum()),
                                    "windows": int(n_windows[b]), "blocks": iv.blocks,
                                    "empty": bool(tokens[:, b].sum() == 0), **_interval_dict(iv)})
        for a, ref in comparisons:
            for b, iv in enumerate(bootstrap_paired(bits[a], bits[ref], bases, boot, level)):
                compare_rows.append({"comparison": f"{a} - {ref}", "subset": subset, "bucket": labels[b],
                                     "lo": los[b], "hi": his[b], "tokens": int(tokens[:, b].sum()),
                                     "windows": int(n_windows[b]), "blocks": iv.blocks,
                                     "empty": bool(tokens[:, b].sum() == 0), "delta_bits_per_base": iv.value,
                                     "ci_low": iv.low, "ci_high": iv.high})
    return bucket_rows, compare_rows
