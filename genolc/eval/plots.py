"""Seaborn figures for the evaluation reports (matplotlib's Agg backend: no display needed).

Each function draws into a new figure and saves a PNG to the given path; the caller writes into a temporary
directory that is renamed into place, so a figure is never seen half-written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402


def _errorbars(ax, frame: pd.DataFrame, x: str, y: str, low: str, high: str, hue: str, order: Sequence[str]) -> None:
    palette = dict(zip(order, sns.color_palette("colorblind", len(order))))
    for name in order:
        part = frame[(frame[hue] == name) & frame[low].notna()]
        if part.empty:
            continue
        ax.errorbar(part[x], part[y], yerr=[part[y] - part[low], part[high] - part[y]], fmt="none",
                    ecolor=palette[name], capsize=3, lw=1)


def plot_by_position(buckets: pd.DataFrame, comparisons: pd.DataFrame, path: Path, title: str) -> None:
    """Top: bits/base per position bucket for each series (95% CI bars); bottom: paired differences."""
    sns.set_theme(style="whitegrid", context="notebook")
    data = buckets[(buckets["subset"] == "all") & (buckets["bucket"] != "all") & ~buckets["empty"]].copy()
    labels = list(dict.fromkeys(buckets.loc[buckets["bucket"] != "all", "bucket"]))
    data["x"] = data["bucket"].map({b: i for i, b in enumerate(labels)})
    series = list(dict.fromkeys(data["series"]))
    has_cmp = not comparisons.empty
    fig, axes = plt.subplots(2 if has_cmp else 1, 1, figsize=(max(6.0, 0.7 * len(labels) + 3), 7 if has_cmp else 4),
                             squeeze=False, sharex=True)
    ax = axes[0, 0]
    if not data.empty:
        sns.lineplot(data=data, x="x", y="bits_per_base", hue="series", hue_order=series, marker="o", ax=ax,
                     palette="colorblind", errorbar=None)
        _errorbars(ax, data, "x", "bits_per_base", "ci_low", "ci_high", "series", series)
    ax.set_ylabel("bits per base")
    ax.set_title(title)
    if has_cmp:
        cmp = comparisons[(comparisons["subset"] == "all") & (comparisons["bucket"] != "all") & ~comparisons["empty"]]
        cmp = cmp.copy()
        cmp["x"] = cmp["bucket"].map({b: i for i, b in enumerate(labels)})
        names = list(dict.fromkeys(cmp["comparison"]))
        ax2 = axes[1, 0]
        if not cmp.empty:
            sns.lineplot(data=cmp, x="x", y="delta_bits_per_base", hue="comparison", hue_order=names, marker="o",
                         ax=ax2, palette="colorblind", errorbar=None)
            _errorbars(ax2, cmp, "x", "delta_bits_per_base", "ci_low", "ci_high", "comparison", names)
        ax2.axhline(0.0, color="0.3", lw=0.8)
        ax2.set_ylabel("Δ bits per base")
    bottom = axes[-1, 0]
    bottom.set_xticks(range(len(labels)))
    bottom.set_xticklabels(labels, rotation=45, ha="right")
    bottom.set_xlabel("tokens of preceding context (position in window)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_needle(summary: pd.DataFrame, path: Path, title: str) -> None:
    """Bits/base on the first and second copy of the inserted segment against their distance D."""
    sns.set_theme(style="whitegrid", context="notebook")
    long = pd.concat([
        summary.assign(copy="first copy", bits=summary["first_bits_per_base"],
                       low=summary["first_ci_low"], high=summary["first_ci_high"]),
        summary.assign(copy="second copy", bits=summary["second_bits_per_base"],
                       low=summary["second_ci_low"], high=summary["second_ci_high"]),
    ])
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.lineplot(data=long, x="distance", y="bits", hue="copy", marker="o", ax=ax, palette="colorblind",
                 errorbar=None)
    _errorbars(ax, long, "distance", "bits", "low", "high", "copy", ["first copy", "second copy"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distance between copies D (tokens)")
    ax.set_ylabel("bits per base")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
