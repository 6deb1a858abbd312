"""Report figures: one function per figure, analysis outputs in, PNG bytes out.

matplotlib is imported inside the functions and used through ``matplotlib.figure.Figure``
with the Agg canvas (no pyplot state, no display needed). Every function takes the
DataFrames the :mod:`race.analysis` functions return and returns ``bytes`` (a PNG);
:func:`to_png` turns any Figure into PNG bytes.

Kept whole (about 400 lines): one function per figure, each read on its own.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from .fmt import fmt_flops, is_num, short_labels

from .plotkit import (  # noqa: F401 - to_png and _log_axis are part of this module's surface (tests use them)
    AXIS_COLORS,
    PHASE_COLORS,
    colors as _colors,
    new_figure as _figure,
    panel_grid as _grid,
    legend as _legend,
    log_axis as _log_axis,
    to_png,
)


def frontier_figure(winners: pd.DataFrame, envelope: pd.DataFrame | None = None,
                    controls: pd.DataFrame | None = None) -> bytes:
    """Best score vs budget (log FLOPs), one panel per target, one line per condition.

    ``winners``: :func:`race.analysis.regimes` rows (``target, condition, budget, score,
    lo, hi``), several targets concatenated. ``envelope`` (optional):
    :func:`race.analysis.frontier_envelope` rows with a ``target`` column (``condition``
    in place of the reward system), drawn thin. ``controls`` (optional): ``target,
    budget, score`` of random-reward controls.
    """
    return to_png(_frontier(winners, envelope, controls))


def _frontier(winners: pd.DataFrame, envelope: pd.DataFrame | None = None,
              controls: pd.DataFrame | None = None) -> Any:
    targets = list(dict.fromkeys(winners["target"]))
    rows, cols = _grid(len(targets))
    fig = _figure(4.2 * cols, 3.4 * rows)
    conds = list(dict.fromkeys(winners["condition"].fillna("all")))
    color = dict(zip(conds, _colors(len(conds))))
    for i, target in enumerate(targets):
        ax = fig.add_subplot(rows, cols, i + 1)
        w = winners[winners["target"] == target]
        for cond, g in w.groupby(w["condition"].fillna("all"), sort=False):
            g = g.sort_values("budget")
            lo = (g["score"] - g["lo"]).clip(lower=0).to_numpy(float)
            hi = (g["hi"] - g["score"]).clip(lower=0).to_numpy(float)
            ax.errorbar(g["budget"], g["score"], yerr=np.vstack([lo, hi]), marker="o", capsize=3,
                        color=color[cond], lw=2, label=f"{cond} (best allocation)")
        if envelope is not None and len(envelope):
            e = envelope[envelope["target"] == target]
            for cond, g in e.groupby(e["condition"].fillna("all"), sort=False):
                g = g.sort_values("flops")
                ax.step(g["flops"], g["score"], where="post", lw=0.9, ls="--", alpha=0.8,
                        color=color.get(cond, "grey"), label=f"{cond} envelope over compute")
        if controls is not None and len(controls):
            c = controls[controls["target"] == target]
            if len(c):
                ax.scatter(c["budget"], c["score"], marker="x", color="black", zorder=5, label="random-reward control")
        _log_axis(ax, "x", "FLOP")
        ax.set_xlabel("FLOP budget")
        ax.set_ylabel(f"{target} score")
        ax.set_title(f"Frontier: {target}", fontsize=10)
        ax.grid(alpha=0.3)
        if i == 0:
            _legend(ax, loc="best")
    fig.tight_layout()
    return fig


def compute_split_figure(split: pd.DataFrame, labels: Mapping[str, str] | None = None) -> bytes:
    """Stacked horizontal bars: share of FLOPs in rollout (wasted part hatched), learning
    and feedback, one bar per allocation. ``split``: :func:`race.analysis.waste_table`
    by allocation (``allocation, rollout_share, learning_share, feedback_share,
    wasted_share``)."""
    split = split.sort_values("allocation", ascending=False).reset_index(drop=True)
    labels = dict(labels) if labels else short_labels(split["allocation"])
    fig = _figure(7.0, 1.2 + 0.38 * len(split))
    ax = fig.add_subplot(1, 1, 1)
    y = np.arange(len(split))
    roll = split["rollout_share"].fillna(0).to_numpy(float)
    wasted = np.minimum(split["wasted_share"].fillna(0).to_numpy(float), roll)
    learn = split["learning_share"].fillna(0).to_numpy(float)
    feed = split["feedback_share"].fillna(0).to_numpy(float)
    other = np.clip(1 - roll - learn - feed, 0, None)
    left = np.zeros(len(split))
    for vals, name, kw in ((roll - wasted, "rollout (search)", {"color": PHASE_COLORS["rollout"]}),
                           (wasted, "rollout in zero-variance groups (wasted)",
                            {"color": PHASE_COLORS["wasted"], "hatch": "//", "edgecolor": "white"}),
                           (learn, "learning (update + log-probs)", {"color": PHASE_COLORS["learning"]}),
                           (feed, "feedback (reward)", {"color": PHASE_COLORS["feedback"]}),
                           (other, "other", {"color": PHASE_COLORS["other"]})):
        if vals.sum() <= 1e-9 and name == "other":
            continue
        ax.barh(y, vals, left=left, height=0.7, label=name, **kw)
        left += vals
    ax.set_yticks(y, [labels.get(a, a) for a in split["allocation"]], fontsize=8)
    ax.set_xlim(0, max(1.0, float(left.max()) if len(left) else 1.0))
    ax.xaxis.set_major_formatter(_pct_formatter())
    ax.set_xlabel("share of the run's FLOPs (mean over runs)")
    ax.set_title("Where the compute goes, per allocation", fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return to_png(fig)


def _pct_formatter() -> Any:
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0, decimals=0)


def isoflop_figure(table: pd.DataFrame) -> bytes:
    """Score vs model parameters (log) per budget, fitted parabola in ln N and its vertex
    with the bootstrap interval, one panel per condition with >= 3 sizes; the axis spans
    the sizes tried (x3 each side). ``table``: :func:`race.analysis.isoflop_table`.

    A budget whose parabola has no interior optimum (it opens upward), or whose vertex
    lies off the plotted range, has no star: its legend entry says which, and a panel with
    no star at all says so in its title instead of promising stars."""
    return to_png(_isoflop(table))


def _isoflop(table: pd.DataFrame) -> Any:
    table = table[table.groupby(table["condition"].fillna("all"))["n_sizes"].transform("max") >= 3]
    if table.empty:
        raise ValueError("no budget has >= 3 model sizes: nothing to fit")
    conds = list(dict.fromkeys(table["condition"].fillna("all")))
    rows, cols = _grid(len(conds), 2)
    fig = _figure(5.2 * cols, 3.8 * rows)
    budgets = sorted(table["budget"].unique())
    color = dict(zip(budgets, _colors(len(budgets))))
    for i, cond in enumerate(conds):
        ax = fig.add_subplot(rows, cols, i + 1)
        here = table[table["condition"].fillna("all") == cond]
        tried = np.concatenate([np.asarray(v, float) for v in here["sizes"]])
        xlim = (tried.min() / 3, tried.max() * 3)
        stars = 0
        for _, r in here.sort_values("budget").iterrows():
            c = color[r["budget"]]
            sizes, scores = np.asarray(r["sizes"], float), np.asarray(r["scores"], float)
            coef = r["coef"]
            if isinstance(coef, (list, tuple, np.ndarray)) and len(coef) == 3:
                xs = np.linspace(np.log(sizes.min()) - 0.3, np.log(sizes.max()) + 0.3, 100)
                ax.plot(np.exp(xs), np.polyval(coef, xs), "-", color=c, lw=1.2, alpha=0.8)
            has_opt = is_num(r["opt_params"]) and is_num(r["opt_score"])
            shown = has_opt and xlim[0] <= r["opt_params"] <= xlim[1]
            bracket = r.get("located", None) is False and is_num(r["ci_low"]) and is_num(r["ci_high"])
            note = ("" if shown else " (optimum bracketed, not located)" if bracket
                    else " (optimum off this range)" if has_opt else " (no interior optimum)")
            ax.plot(sizes, scores, "o", color=c, label=f"budget {fmt_flops(r['budget'])}{note}")
            if bracket:  # three sizes: where between them the optimum lies is not measured
                ax.hlines(scores.max(), r["ci_low"], r["ci_high"], colors=c, linestyles=":", lw=2)
            if shown:
                stars += 1
                lo = r["ci_low"] if is_num(r["ci_low"]) else r["opt_params"]
                hi = r["ci_high"] if is_num(r["ci_high"]) else r["opt_params"]
                ax.errorbar([r["opt_params"]], [r["opt_score"]],
                            xerr=[[max(r["opt_params"] - lo, 0)], [max(hi - r["opt_params"], 0)]],
                            fmt="*", ms=12, color=c, mec="black", capsize=4)
        _log_axis(ax, "x", limits=xlim)  # an optimum far off the grid is named in the notes
        ax.set_xlabel("policy parameters (non-embedding)")
        ax.set_ylabel("best score at that size")
        if stars:
            ax.set_title(f"IsoFLOP profiles: {cond} (star: optimum, bar: 95% interval)", fontsize=10)
        else:  # said above the panel, where it covers no data
            ax.set_title(f"IsoFLOP profiles: {cond}\nno budget has an interior optimum in the sizes plotted: "
                         "no star or interval", fontsize=9)
        ax.grid(alpha=0.3)
        _legend(ax, loc="best")
    fig.tight_layout()
    return fig


#: Line styles that tell apart series sharing a colour.
LINESTYLES = ("-", "--", ":", "-.")


def series_styles(keys: Any) -> dict[str, dict[str, Any]]:
    """A colour and line style per series, every pair distinguishable. Up to 10 series:
    one tab10 colour each (distinct hues, never light/dark pairs of one hue). More, with
    ``|``-separated allocation keys: the setting with the fewest values (<= 4) picks the
    line style and the other varying settings the colour (3 sizes x 2 group sizes x 2
    rewards: 6 colours x solid/dashed). Otherwise tab10 colours cycle through the styles."""
    import matplotlib

    keys = list(dict.fromkeys(keys))
    tab10 = [matplotlib.colormaps["tab10"](i) for i in range(10)]
    if len(keys) <= 10:
        return {k: {"color": tab10[i], "ls": "-"} for i, k in enumerate(keys)}
    parts = [str(k).split("|") for k in keys]
    if len({len(p) for p in parts}) == 1:
        varying = [j for j in range(len(parts[0])) if len({p[j] for p in parts}) > 1]
        for j in sorted(varying, key=lambda j: len({p[j] for p in parts})):
            styles = sorted({p[j] for p in parts})
            rest = list(dict.fromkeys(tuple(p[i] for i in varying if i != j) for p in parts))
            if 2 <= len(styles) <= len(LINESTYLES) and len(rest) <= 10:
                return {k: {"color": tab10[rest.index(tuple(p[i] for i in varying if i != j))],
                            "ls": LINESTYLES[styles.index(p[j])]} for k, p in zip(keys, parts)}
    return {k: {"color": tab10[i % 10], "ls": LINESTYLES[(i // 10) % len(LINESTYLES)]} for i, k in enumerate(keys)}


def learning_curves_figure(curves: pd.DataFrame, labels: Mapping[str, str] | None = None,
                           max_panels: int = 6) -> bytes:
    """Score vs cumulative training FLOPs (log), one panel per budget: each seed a thin
    line, the seed mean (interpolated on a common log-FLOP grid) bold, one colour and line
    style per allocation (:func:`series_styles`), the legend outside the panels. Points at
    0 FLOPs (a step-0 evaluation) sit at the panel's left edge.
    ``curves``: :func:`race.analysis.learning_curves` for one target (with ``runs``)."""
    return to_png(_learning_curves(curves, labels, max_panels))


def _learning_curves(curves: pd.DataFrame, labels: Mapping[str, str] | None = None, max_panels: int = 6) -> Any:
    budgets = sorted(curves["budget"].unique())[-max_panels:]
    allocs = sorted(curves["allocation"].unique())
    labels = dict(labels) if labels else short_labels(allocs)
    style = series_styles(allocs)
    rows, cols = _grid(len(budgets))
    fig = _figure(4.3 * cols, 3.3 * rows)
    for i, b in enumerate(budgets):
        ax = fig.add_subplot(rows, cols, i + 1)
        cb = curves[curves["budget"] == b]
        positive = cb.loc[cb["flops"] > 0, "flops"]
        left = float(positive.min()) / 2 if len(positive) else 1.0  # where 0 FLOPs is drawn
        for alloc, ga in cb.groupby("allocation", sort=True):
            x_all = ga["flops"].clip(lower=left)
            grid = np.geomspace(max(left, float(x_all.min())), max(float(x_all.max()), left * 1.0001), 60)
            interp = []
            for _, gr in ga.groupby("run_id", sort=True):
                gr = gr.sort_values("flops")
                x = gr["flops"].clip(lower=left).to_numpy(float)
                ax.plot(x, gr["score"], lw=0.7, alpha=0.4, **style[alloc])
                ok = (grid <= x.max() * (1 + 1e-9)) & (grid >= x.min() * (1 - 1e-9))
                interp.append(np.where(ok, np.interp(np.log(grid), np.log(x), gr["score"]), np.nan))
            with np.errstate(all="ignore"):
                mean = np.nanmean(np.vstack(interp), axis=0) if interp else grid * np.nan
            ax.plot(grid, mean, lw=2.2, label=labels.get(alloc, alloc) if i == 0 else None, **style[alloc])
        _log_axis(ax, "x", "FLOP")
        ax.set_title(f"budget {fmt_flops(b)}", fontsize=10)
        ax.set_xlabel("training FLOPs (log)")
        ax.set_ylabel("score")
        ax.grid(alpha=0.3)
    handles, labs = fig.axes[0].get_legend_handles_labels() if fig.axes else ([], [])
    fig.tight_layout()
    if handles:  # outside the panels, right of them: never over an axis label
        fig.legend(handles, labs, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False,
                   ncol=1 if len(labs) <= 16 else 2, title="allocation (mean of seeds)", title_fontsize=8)
    return fig


def _axis_category(axes: str, tie: bool, compared: Any) -> str:
    if compared is None or (isinstance(compared, float) and np.isnan(compared)):
        return "none"
    if tie:
        return "tie"
    parts = [a for a in str(axes).split("+") if a]
    return parts[0] if len(parts) == 1 else "mixed" if parts else "none"


def regime_heatmap(reg: pd.DataFrame) -> bytes:
    """Budgets (rows) x conditions (columns: target / reward system); a cell's color is
    the axis along which the winner beats the runner-up (grey: a tie within the noise),
    annotated with the axis and the winner's win probability. ``reg``:
    :func:`race.analysis.regimes` rows of one or more targets (``target`` column)."""
    from matplotlib.patches import Patch

    reg = reg.assign(column=reg["target"].astype(str) + "\n" + reg["condition"].fillna("all").astype(str))
    columns = list(dict.fromkeys(reg["column"]))
    budgets = sorted(reg["budget"].unique(), reverse=True)
    fig = _figure(1.2 + 1.7 * len(columns), 0.9 + 0.62 * len(budgets) + 0.6)
    ax = fig.add_subplot(1, 1, 1)
    used = set()
    for yi, b in enumerate(budgets):
        for xi, col in enumerate(columns):
            cell = reg[(reg["budget"] == b) & (reg["column"] == col)]
            if cell.empty:
                cat, text = "none", "-"
            else:
                r = cell.iloc[0]
                cat = _axis_category(r["axes"], bool(r["tie"]), r["compared_to"])
                what = {"none": "only one", "tie": "tie"}.get(cat, str(r["axes"]).replace("+", "+\n"))
                text = f"{what}\np={r['win_prob']:.2f}"
            used.add(cat)
            ax.add_patch(_rect(xi, yi, AXIS_COLORS[cat]))
            ax.text(xi + 0.5, yi + 0.5, text, ha="center", va="center", fontsize=8)
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(budgets), 0)
    ax.set_xticks(np.arange(len(columns)) + 0.5, columns, fontsize=8)
    ax.set_yticks(np.arange(len(budgets)) + 0.5, [fmt_flops(b) for b in budgets], fontsize=8)
    ax.set_ylabel("FLOP budget")
    ax.set_title("Winning axis per budget (p = win probability)", fontsize=10)
    ax.tick_params(length=0)
    names = {"none": "only one allocation", "tie": "tie (within noise)", "mixed": "several axes"}
    handles = [Patch(facecolor=AXIS_COLORS[k], edgecolor="grey", label=names.get(k, k)) for k in AXIS_COLORS if k in used]
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return to_png(fig)


def _rect(x: float, y: float, color: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, facecolor=color, edgecolor="white", lw=2)


def flops_seconds_figure(runs: pd.DataFrame, phase_costs: pd.DataFrame | None = None) -> bytes:
    """Left: each run's counted FLOPs against its wall seconds (log-log), one color per
    model; equal FLOPs need not cost equal time. Right (when ``phase_costs`` is given:
    ``phase, flops, seconds``): each phase's share of FLOPs beside its share of seconds."""
    r = runs[(runs["total_flops"] > 0) & (runs["wall_s"] > 0)]
    panels = 2 if phase_costs is not None and len(phase_costs) else 1
    fig = _figure(4.8 * panels, 3.6)
    ax = fig.add_subplot(1, panels, 1)
    models = sorted(r["model"].astype(str).unique())
    color = dict(zip(models, _colors(len(models))))
    for m, g in r.groupby(r["model"].astype(str), sort=True):
        ax.scatter(g["wall_s"], g["total_flops"], color=color[m], label=m, s=22, alpha=0.8)
    _log_axis(ax, "x", "s")
    _log_axis(ax, "y", "FLOP")
    ax.set_xlabel("wall seconds")
    ax.set_ylabel("counted FLOPs")
    ax.set_title("FLOPs vs wall seconds, per run", fontsize=10)
    ax.grid(alpha=0.3)
    _legend(ax, loc="best")
    if panels == 2:
        ax2 = fig.add_subplot(1, 2, 2)
        pc = phase_costs.reset_index(drop=True)
        x = np.arange(len(pc))
        f_share = pc["flops"] / max(pc["flops"].sum(), 1e-300)
        s_share = pc["seconds"] / max(pc["seconds"].sum(), 1e-300)
        ax2.bar(x - 0.2, f_share, width=0.4, label="share of FLOPs", color="#4e79a7")
        ax2.bar(x + 0.2, s_share, width=0.4, label="share of seconds", color="#e15759")
        ax2.set_xticks(x, pc["phase"], fontsize=8, rotation=20)
        ax2.yaxis.set_major_formatter(_pct_formatter())
        ax2.set_title("Per phase: FLOPs vs seconds", fontsize=10)
        ax2.grid(alpha=0.3, axis="y")
        _legend(ax2, loc="best")
    fig.tight_layout()
    return to_png(fig)


def predictions_figure(predictions: pd.DataFrame, chosen: str, labels: Mapping[str, str] | None = None,
                       realised: pd.DataFrame | None = None, top: int = 8, observed: bool = False) -> bytes:
    """Predicted score at the target budget with its interval for the leading candidates
    (``predictions`` of :class:`race.analysis.Recommendation`: ``allocation, score, lo,
    hi``); the chosen one in bold. ``realised`` (``allocation, score, lo, hi``): validation
    scores, drawn as diamonds beside the predictions."""
    pred = predictions.head(top).iloc[::-1].reset_index(drop=True)
    keys = list(pred["allocation"]) + ([] if realised is None else list(realised["allocation"]))
    labels = dict(labels) if labels else short_labels(keys)
    fig = _figure(8.0, 0.9 + 0.42 * len(pred))
    ax = fig.add_subplot(1, 1, 1)
    y = np.arange(len(pred))
    for i, r in pred.iterrows():
        c = "#e15759" if r["allocation"] == chosen else "#4e79a7"
        ax.errorbar([r["score"]], [i], xerr=[[max(r["score"] - r["lo"], 0)], [max(r["hi"] - r["score"], 0)]],
                    fmt="o", color=c, capsize=3, label=("observed" if observed else "predicted") + " (95% interval)" if i == len(pred) - 1 else None)
    if realised is not None and len(realised):
        pos = {a: i for i, a in enumerate(pred["allocation"])}
        first = True
        for _, r in realised.iterrows():
            if r["allocation"] not in pos:
                continue
            i = pos[r["allocation"]] + 0.25
            ax.errorbar([r["score"]], [i], xerr=[[max(r["score"] - r["lo"], 0)], [max(r["hi"] - r["score"], 0)]],
                        fmt="D", color="black", ms=5, capsize=2, label="realised at the target budget" if first else None)
            first = False
    ax.set_yticks(y, [("» " if a == chosen else "") + labels.get(a, a) for a in pred["allocation"]], fontsize=8)
    if observed:  # no allocation learned: standings at the largest pilot budget, no forecast
        ax.set_xlabel("score at the largest pilot budget (equal FLOPs)")
        ax.set_title("No learning detected: observed scores, not a forecast (red: leader)", fontsize=10)
    else:
        ax.set_xlabel("score at the target budget")
        ax.set_title("Predicted score at the target budget (red: recommended)", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    ax.set_ylim(-0.6, len(pred) - 0.4)
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return to_png(fig)


__all__ = ["to_png", "frontier_figure", "compute_split_figure", "isoflop_figure", "learning_curves_figure",
           "regime_heatmap", "flops_seconds_figure", "predictions_figure", "series_styles", "AXIS_COLORS"]
