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
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from genolc.eval.buckets import FEW_BLOCKS_FOR_CI  # noqa: E402


UNIFORM_ACGT_BITS = 2.0
UNIFORM_LABEL = "uniform A/C/G/T (2 bits)"
FEW_BLOCKS_LABEL = f"dashed bars: < {FEW_BLOCKS_FOR_CI} bootstrap blocks, not a 95% CI"
# Controls are often indistinguishable from the model (a small model gains nothing from long context), so each series
# has its own line style and marker, controls are drawn first with wider, lighter lines and large open markers, and
# the model is drawn last, thin and solid with small filled markers, so both stay visible where they coincide.
_DODGE = 0.08  # bucket widths between neighbouring series
_CONTROL_STYLES = [("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1, 1, 1)), "v"), ((0, (1, 3)), "P")]


def series_styles(names: Sequence[str]) -> dict[str, dict]:
    """Matplotlib line keywords per series: ``model`` solid and on top; every other series a distinct style."""
    colors = dict(zip(names, sns.color_palette("colorblind", len(names))))
    styles: dict[str, dict] = {}
    controls = [n for n in names if n != "model"]
    for i, name in enumerate(controls):
        linestyle, marker = _CONTROL_STYLES[i % len(_CONTROL_STYLES)]
        styles[name] = dict(color=colors[name], linestyle=linestyle, marker=marker, linewidth=3.0, alpha=0.8,
                            markersize=9, markerfacecolor="none", markeredgewidth=1.6, zorder=2 + i)
    if "model" in names:
        styles["model"] = dict(color=colors["model"], linestyle="-", marker="o", linewidth=1.6, markersize=5,
                               zorder=3 + len(controls))
    return styles


def _draw_series(ax, frame: pd.DataFrame, x: str, y: str, low: str, high: str, hue: str,
                 order: Sequence[str], dodge: float = 0.0) -> None:
    """One line per ``order`` entry (controls first, model last), with its 95% CI bars; series ``i`` is shifted by
    ``(i - centre) * dodge`` along x so equal values keep their markers and bars side by side. Bars of rows whose
    ``blocks`` is below FEW_BLOCKS_FOR_CI are dashed and lighter, with a legend entry saying why."""
    styles = series_styles(order)
    centre = (len(order) - 1) / 2
    few_drawn = False
    for name in sorted(order, key=lambda n: styles[n]["zorder"]):
        part = frame[frame[hue] == name].sort_values(x)
        if part.empty:
            continue
        style = styles[name]
        xs = part[x] + (list(order).index(name) - centre) * dodge
        ax.plot(xs, part[y], label=name, **style)
        has_ci = part[low].notna().to_numpy()
        # Frames without block counts (the needle's) have no thin intervals to mark.
        thin = (part["blocks"] < FEW_BLOCKS_FOR_CI).to_numpy() if "blocks" in part else np.zeros(len(part), bool)
        for bars, dashed in ((has_ci & ~thin, False), (has_ci & thin, True)):
            if not bars.any():
                continue
            ys, lows, highs = part[y][bars], part[low][bars], part[high][bars]
            drawn = ax.errorbar(xs[bars], ys, yerr=[ys - lows, highs - ys], fmt="none", ecolor=style["color"],
                                capsize=3, lw=1, zorder=style["zorder"], alpha=0.5 if dashed else 1.0)
            if dashed:
                for collection in drawn.lines[2]:
                    collection.set_linestyle("--")
                few_drawn = True
    if few_drawn:
        ax.plot([], [], color="0.4", linestyle="--", lw=1, alpha=0.5, label=FEW_BLOCKS_LABEL)
    ax.legend()


def by_position_figure(buckets: pd.DataFrame, comparisons: pd.DataFrame, title: str):
    """The by-position figure (see :func:`plot_by_position`), not yet saved."""
    sns.set_theme(style="whitegrid", context="notebook")
    data = buckets[(buckets["subset"] == "all") & (buckets["bucket"] != "all") & ~buckets["empty"]].copy()
    labels = list(dict.fromkeys(buckets.loc[buckets["bucket"] != "all", "bucket"]))
    data["x"] = data["bucket"].map({b: i for i, b in enumerate(labels)})
    series = list(dict.fromkeys(data["series"]))
    has_cmp = not comparisons.empty
    fig, axes = plt.subplots(2 if has_cmp else 1, 1, figsize=(max(6.0, 0.7 * len(labels) + 3), 7 if has_cmp else 4),
                             squeeze=False, sharex=True)
    ax = axes[0, 0]
    ax.axhline(UNIFORM_ACGT_BITS, color="0.45", linestyle=(0, (1, 1)), lw=1.2, label=UNIFORM_LABEL, zorder=1)
    if not data.empty:
        _draw_series(ax, data, "x", "bits_per_base", "ci_low", "ci_high", "series", series, dodge=_DODGE)
    else:
        ax.legend()
    ax.set_ylabel("bits per base")
    ax.set_title(title)
    if has_cmp:
        cmp = comparisons[(comparisons["subset"] == "all") & (comparisons["bucket"] != "all") & ~comparisons["empty"]]
        cmp = cmp.copy()
        cmp["x"] = cmp["bucket"].map({b: i for i, b in enumerate(labels)})
        names = list(dict.fromkeys(cmp["comparison"]))
        ax2 = axes[1, 0]
        ax2.axhline(0.0, color="0.3", lw=0.8)
        if not cmp.empty:
            _draw_series(ax2, cmp, "x", "delta_bits_per_base", "ci_low", "ci_high", "comparison", names,
                         dodge=_DODGE)
        ax2.set_ylabel("Δ bits per base")
    bottom = axes[-1, 0]
    bottom.set_xticks(range(len(labels)))
    bottom.set_xticklabels(labels, rotation=45, ha="right")
    bottom.set_xlabel("tokens of preceding context (position in window)")
    fig.tight_layout()
    return fig


def plot_by_position(buckets: pd.DataFrame, comparisons: pd.DataFrame, path: Path, title: str) -> None:
    """Top: bits/base per position bucket for each series (95% CI bars; dashed and lighter where they rest on fewer
    than FEW_BLOCKS_FOR_CI blocks), with the uniform-ACGT 2-bit line; bottom: paired differences. The model is a
    solid line drawn over the controls, each in its own dashed style."""
    fig = by_position_figure(buckets, comparisons, title)
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
    _draw_series(ax, long, "distance", "bits", "low", "high", "copy", ["first copy", "second copy"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distance between copies D (tokens)")
    ax.set_ylabel("bits per base")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
