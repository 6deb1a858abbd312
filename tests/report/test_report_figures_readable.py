"""Readable figures: log tick labels never collide, the isoFLOP figure promises no star it
does not draw, learning curves on log FLOPs with distinguishable series and the legend
clear of every axis."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from race.report import figures as F


def _tick_label_boxes(fig, ax, axis="x"):
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    shown = [t for t in labels if t.get_text() and lo <= (t.get_position()[0 if axis == "x" else 1]) <= hi]
    return sorted((t.get_window_extent(renderer) for t in shown), key=lambda b: b.x0 if axis == "x" else b.y0)


@pytest.mark.parametrize("width", [2.0, 2.6, 4.2, 8.0])
@pytest.mark.parametrize("limits", [(4e9, 7e10), (5.5e9, 6.5e10), (2e9, 2.5e9), (1e13, 1e17), (3e8, 7e10)])
def test_log_tick_labels_never_touch(width, limits):
    fig = F._figure(width, 2.5)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(limits, [0, 1])
    F._log_axis(ax, "x", "FLOP", limits=limits)
    fig.tight_layout()
    boxes = _tick_label_boxes(fig, ax)
    assert len(boxes) >= 1
    if np.log10(limits[1] / limits[0]) > 1 and width >= 4:
        assert len(boxes) >= 2, "a span of more than a decade in a normal panel gets at least two labels"
    for a, b in zip(boxes, boxes[1:]):
        assert b.x0 - a.x1 >= 4, f"tick labels touch at width {width} in: {a} {b}"


def _demo_frontier():
    rows, env = [], []
    for t in ("greedy", "pass@4", "hard"):
        for cond, base in (("rule", 0.2), ("prm", 0.25)):
            for b, d in ((6e9, 0.0), (1.9e10, 0.05), (6e10, 0.1)):
                rows.append(dict(target=t, condition=cond, budget=b, score=base + d, lo=base + d - .04, hi=base + d + .04))
            env += [dict(target=t, condition=cond, flops=f, score=0.1 + 0.04 * k)
                    for k, f in enumerate((3.5e9, 6e9, 1e10, 1.9e10, 3e10, 6e10))]
    return pd.DataFrame(rows), pd.DataFrame(env)


def test_frontier_of_a_one_decade_demo_grid_has_separate_tick_labels():
    """The demo grid spans 6e9-6e10: fixed 1-2-5 ticks printed '5 GFLOP10 GFLOP20 GFLOP'."""
    fig = F._frontier(*_demo_frontier())
    for ax in fig.axes:
        boxes = _tick_label_boxes(fig, ax)
        assert len(boxes) >= 2
        assert all(b.x0 - a.x1 >= 4 for a, b in zip(boxes, boxes[1:]))


def _iso_row(budget, scores, sizes=(5.7e4, 1e5, 3.3e5)):
    x = np.log(sizes)
    coef = np.polyfit(x, scores, 2)
    opt = None if coef[0] >= 0 else float(np.exp(-coef[1] / (2 * coef[0])))
    return dict(budget=budget, condition="rule", n_sizes=3, sizes=list(sizes), scores=list(scores), coef=list(coef),
                opt_params=opt, ci_low=None, ci_high=None,
                opt_score=None if opt is None else float(np.polyval(coef, np.log(opt))))


def _legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_isoflop_without_an_interior_optimum_says_so_instead_of_promising_stars():
    table = pd.DataFrame([_iso_row(6e9, [0.15, 0.13, 0.16]),   # opens upward
                          _iso_row(1.9e10, [0.2, 0.24, 0.3]),  # vertex far right of the sizes
                          _iso_row(6e10, [0.3, 0.34, 0.5])])   # opens upward
    assert table["opt_params"].isna().sum() == 2 and table["opt_params"].iloc[1] > 3.3e5 * 3
    ax = F._isoflop(table).axes[0]
    assert "star" not in ax.get_title().split("\n")[0]
    assert "no budget has an interior optimum" in ax.get_title()
    texts = _legend_texts(ax)
    assert texts[0].endswith("(no interior optimum)") and texts[2].endswith("(no interior optimum)")
    assert texts[1].endswith("(optimum off this range)")
    assert not any(line.get_marker() == "*" for line in ax.get_lines())


def test_isoflop_with_an_interior_optimum_draws_its_star():
    table = pd.DataFrame([_iso_row(6e9, [0.15, 0.13, 0.16]), _iso_row(6e10, [0.3, 0.45, 0.35])])
    ax = F._isoflop(table).axes[0]
    assert "(star: optimum, bar: 95% interval)" in ax.get_title()
    assert _legend_texts(ax) == ["budget 6 GFLOP (no interior optimum)", "budget 60 GFLOP"]
    assert sum(line.get_marker() == "*" for line in ax.get_lines()) == 1


def _twelve_curves():
    rows = []
    keys = [f"{m}|G={g}|P=16|it=1|lr=1e-05|{r}" for m in ("tiny-xs", "tiny-s", "tiny-m") for g in (4, 8)
            for r in ("rule", "prm:prm-xs")]
    for i, k in enumerate(keys):
        for b in (6e9, 6e10):
            for seed in (0, 1):
                f = np.array([0.0, b / 32, b / 8, b / 2, b])
                rows += [dict(allocation=k, budget=b, run_id=f"{i}-{b:g}-{seed}", flops=x, score=0.1 + 0.01 * i + s)
                         for x, s in zip(f, np.linspace(0, 0.2, 5))]
    return keys, pd.DataFrame(rows)


def test_twelve_series_have_distinct_styles_and_no_paired_hues():
    keys, _ = _twelve_curves()
    styles = F.series_styles(keys)
    pairs = {(tuple(np.round(s["color"], 3)), s["ls"]) for s in styles.values()}
    assert len(pairs) == 12
    # each colour is a different tab10 hue, every colour used by exactly the two rewards
    colours = [tuple(np.round(s["color"], 3)) for s in styles.values()]
    assert len(set(colours)) == 6 and all(colours.count(c) == 2 for c in colours)
    for (ka, a), (kb, b) in itertools.combinations(styles.items(), 2):
        if a["ls"] == b["ls"]:  # same line style: the colours must differ clearly
            assert np.abs(np.array(a["color"][:3]) - np.array(b["color"][:3])).sum() > 0.3, (ka, kb)
    assert {s["ls"] for s in F.series_styles(keys[:8]).values()} == {"-"}  # few series: colour alone


def test_learning_curves_on_log_flops_with_the_legend_clear_of_the_axes():
    keys, curves = _twelve_curves()
    fig = F._learning_curves(curves)
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    legend = fig.legends[0]
    assert len(legend.get_texts()) == 12
    lb = legend.get_window_extent(renderer)
    for ax in fig.axes:
        assert ax.get_xscale() == "log"
        assert ax.xaxis.get_offset_text().get_text() == ""  # no '1e10' offset exponent
        tight = ax.get_tightbbox(renderer)  # axes, tick labels and axis labels
        assert lb.x0 >= tight.x1 or lb.x1 <= tight.x0 or lb.y0 >= tight.y1 or lb.y1 <= tight.y0
        xs = np.concatenate([line.get_xdata() for line in ax.get_lines()])
        assert xs.min() > 0  # the step-0 points are drawn at the left edge, not lost
        boxes = _tick_label_boxes(fig, ax)
        assert all(b.x0 - a.x1 >= 4 for a, b in zip(boxes, boxes[1:]))
    assert F.learning_curves_figure(curves)[:8] == b"\x89PNG\r\n\x1a\n"
