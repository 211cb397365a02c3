"""The by-position plot keeps coinciding series apart and shows the uniform-ACGT reference."""

from __future__ import annotations

import matplotlib.figure
import pandas as pd
import pytest
from matplotlib.collections import LineCollection

from genolc.eval.plots import FEW_BLOCKS_LABEL, UNIFORM_ACGT_BITS, plot_by_position

BUCKETS = ["[0,256)", "[256,512)", "[512,1k)", "[1k,2k]"]


def _frames():
    """The demo's case: the model and its context:128 control score exactly the same in every bucket."""
    values = [1.97, 1.96, 1.965, 1.96]
    rows = []
    for series, shift in (("model", 0.0), ("baseline", 0.05), ("context:128", 0.0)):
        for bucket, value in zip(BUCKETS + ["all"], values + [1.963]):
            rows.append({"series": series, "subset": "all", "bucket": bucket, "empty": False,
                         "bits_per_base": value + shift, "ci_low": value + shift - 0.01,
                         "ci_high": value + shift + 0.01})
    comparisons = [{"comparison": name, "subset": "all", "bucket": bucket, "empty": False,
                    "delta_bits_per_base": delta, "ci_low": delta - 0.01, "ci_high": delta + 0.01}
                   for name, delta in (("model - baseline", -0.05), ("context:128 - model", 0.0))
                   for bucket in BUCKETS + ["all"]]
    return pd.DataFrame(rows), pd.DataFrame(comparisons)


@pytest.fixture
def saved_figures(monkeypatch):
    """Every figure plot_by_position saves, in order."""
    saved = []
    original = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return saved


def test_coinciding_series_are_drawn_distinguishably_with_the_two_bit_line(tmp_path, saved_figures):
    saved = saved_figures
    buckets, comparisons = _frames()
    plot_by_position(buckets, comparisons, tmp_path / "by_position.png", "title")
    assert (tmp_path / "by_position.png").stat().st_size > 0
    top, bottom = saved[0].axes[:2]

    lines = {line.get_label(): line for line in top.get_lines()}
    model, control, baseline = lines["model"], lines["context:128"], lines["baseline"]
    assert list(model.get_ydata()) == list(control.get_ydata())  # the case that used to hide one line
    assert all(a < b for a, b in zip(model.get_xdata(), control.get_xdata()))  # side by side, not stacked
    looks = {name: (str(line.get_linestyle()), line.get_marker()) for name, line in lines.items()}
    assert looks["model"] != looks["context:128"] and looks["baseline"] not in (looks["model"], looks["context:128"])
    assert model.get_linestyle() == "-" and control.get_linestyle() != "-"
    assert model.get_zorder() > control.get_zorder() and model.get_zorder() > baseline.get_zorder()
    assert model.get_linewidth() < control.get_linewidth()  # the control shows around the model drawn over it

    uniform = [line for line in top.get_lines() if "uniform" in line.get_label()]
    assert len(uniform) == 1 and set(uniform[0].get_ydata()) == {UNIFORM_ACGT_BITS}
    legend = [text.get_text() for text in top.get_legend().get_texts()]
    assert {"model", "context:128", "baseline", uniform[0].get_label()} <= set(legend)

    deltas = {line.get_label(): line for line in bottom.get_lines() if not line.get_label().startswith("_")}
    assert (str(deltas["model - baseline"].get_linestyle()), deltas["model - baseline"].get_marker()) != (
        str(deltas["context:128 - model"].get_linestyle()), deltas["context:128 - model"].get_marker())


def test_intervals_from_few_blocks_are_dashed_and_lighter_and_the_legend_says_why(tmp_path, saved_figures):
    saved = saved_figures
    buckets, comparisons = _frames()
    # The first two buckets lie in 2 blocks (two windows), the rest in 12.
    blocks = lambda frame: frame["bucket"].map(lambda b: 2 if b in BUCKETS[:2] else 12)  # noqa: E731
    buckets["blocks"], comparisons["blocks"] = blocks(buckets), blocks(comparisons)
    plot_by_position(buckets, comparisons, tmp_path / "by_position.png", "title")
    for ax in saved[0].axes[:2]:
        bars = [c for c in ax.collections if isinstance(c, LineCollection)]
        dashed = [c for c in bars if c.get_linestyle()[0][1] is not None]
        solid = [c for c in bars if c.get_linestyle()[0][1] is None]
        assert dashed and solid
        assert all(len(c.get_segments()) == 2 and c.get_alpha() < 1 for c in dashed)     # one per thin bucket
        assert all(len(c.get_segments()) == 2 and c.get_alpha() in (None, 1.0) for c in solid)
        legend = [text.get_text() for text in ax.get_legend().get_texts()]
        assert FEW_BLOCKS_LABEL in legend and "< 10 bootstrap blocks" in FEW_BLOCKS_LABEL
