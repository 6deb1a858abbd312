"""The report's update-share section: score against p = C_learning / C_total, the seed
study's control variable, per budget and reward system.

Renders :mod:`race.analysis.update_share` (the analysis, its labels and its fallback are
there): a figure of score against p at each budget, one line per reward system with 95%
intervals from the joint bootstrap; the best p per reward system (located with its
interval, the pilot best with p tried on both sides, or on the grid's edge) with the regime in the seed's terms
beside RACE's confidence label; the model-free call in p and in p_policy
(:mod:`race.analysis.share_optimum`: located inside the range, flat, on an edge, not resolved)
with the paired differences of the smallest and largest p from the best; and per allocation
its measured p, the p without the reward model's share, and its paired difference from the
best of its line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from race.analysis.bootstrap import difference
from race.analysis.share_optimum import FLAT_MARGIN, Call
from race.analysis.update_share import BestShare, best_shares, share_shift, share_table

from .doc import Context, Figure, KeyValues, Note, Section, Table, Text, figure
from .fmt import fmt_flops, fmt_interval, fmt_pct, fmt_score, jsonable
from .plotkit import colors, new_figure, panel_grid, to_png

TITLE = "Update share: score against p"


def update_share_section(ctx: Context) -> Section:
    sec = Section("update_share", f"{TITLE} ({ctx.primary})")
    table, boot = share_table(ctx.evals, ctx.runs, ctx.primary, n_boot=ctx.n_boot, rng=ctx.rng)
    varied = table.groupby(["budget", "line"])["p"].agg(lambda s: np.ptp(s.to_numpy()) > 0.005)
    if not varied.any():
        sec.missing = ("no reward system is tried at more than one update share p at a budget: sweep num_iterations "
                       "or steps_per_generation at a fixed model, group size and reward (configs/"
                       "grid-update-share.yaml) to read the score against p")
        sec.data = {"allocations": jsonable(table)}
        return sec
    bests = best_shares(table, boot)
    names = line_names(table)
    sec.add(Text("p = C_learning / C_total: the share of a run's counted FLOPs spent on learning (policy update "
                 "and the old-policy and reference log-prob passes) against search (rollout) and feedback "
                 "(reward), read from its ledger. Each point is an allocation at one budget, its score read at "
                 "equal counted FLOPs with a 95% interval (one bootstrap over seeds and problems shared by every "
                 "point, so differences are paired); one line per reward system. p_policy leaves the reward "
                 "model's share out (learning / (learning + search)): where the best p moves with the reward "
                 "system but the best p_policy does not, the shift is the RM's own share."),
            figure("update_share", "Score against the update share p", lambda: share_figure(table, bests)))
    rec = ctx.rec
    sec.add(KeyValues([("RACE's recommendation confidence", str(rec.confidence) if rec is not None else "n/a"),
                       ("the seed study's reference", "best p about 0.72 with rule rewards, 0.44-0.45 with PRM "
                                                      "rewards (arXiv 2607.13389, as summarised)")]))
    rows = [[fmt_flops(b.budget), names[b.line], b.text(), str(b.regime), b.method, b.best_allocation,
             f"{b.best_p:.2f} / {b.best_p_policy:.2f}", str(b.n_points)] for b in bests]
    sec.add(Table(["budget", "line (reward system)", "best p", "regime", "how", "pilot best", "its p / p_policy",
                   "points"], rows, "The best update share per line, by the local fit (located: its vertex [95% "
                        "interval], where the score also falls beyond the noise on both sides); else the pilot best, "
                        "with the p tried next to it (by position, not by the intervals) or on the grid's edge"))
    sec.add(Table(["budget", "line (reward system)", "in p", "in p_policy", "smallest p - best [95%]",
                   "largest p - best [95%]"], _call_rows(table, boot, bests),
                  "Where the best p lies, model-free: located inside the range where the score falls beyond the noise "
                  "on both sides of every plausibly best point (the interval: the local fit's vertex inside those "
                  "points, else the points themselves); flat where the 95% bound on the largest difference between "
                  f"points is at most the margin ({FLAT_MARGIN:.2f}); otherwise on an edge or not resolved"))
    for b in bests:
        for n in b.notes + [n for c in (b.in_p, b.in_p_policy) if c is not None for n in c.notes]:
            sec.add(Note(f"{fmt_flops(b.budget)}, {names[b.line]}: {n}"))
    sec.add(Table(["budget", "allocation", "line", "p [seeds]", "p_policy", "feedback share", "score",
                   "95% interval", "vs the line's best [95%]"], _allocation_rows(ctx, table, boot, bests),
                  "Each allocation's measured update share and score at equal FLOPs"))
    shift = share_shift(bests)
    if shift["line"].nunique() > 1:
        sec.add(Text("How far the best p moves between lines, and how much of it is the RM's share: "
                     + "; ".join(f"{fmt_flops(r.budget)}: {names[r.line]} {r.d_p:+.2f} in p, {r.d_p_policy:+.2f} in "
                                 f"p_policy against {names[r.reference]}"
                                 for r in shift.itertuples() if r.line != r.reference)))
    sec.data = {"allocations": jsonable(table), "best": [jsonable(b.to_dict()) for b in bests], "lines": names,
                "shift": jsonable(shift), "confidence": str(rec.confidence) if rec is not None else None}
    return sec


def line_names(table: pd.DataFrame) -> dict[str, str]:
    """Line -> its name: its reward system where the study has one line per reward, else
    the line's key (model, group, ... with ``it=*``)."""
    per = table.drop_duplicates("line").groupby("reward")["line"].nunique()
    return {str(ln): str(rw) if per[rw] == 1 else str(ln) for ln, rw in zip(table["line"], table["reward"])}


def _allocation_rows(ctx: Context, table: pd.DataFrame, boot: Any, bests: list[BestShare]) -> list[list[str]]:
    best_of = {(b.budget, b.line): b.best_allocation for b in bests}
    names = line_names(table)
    rows = []
    for r in table.sort_values(["budget", "line", "p"]).itertuples():
        top = best_of[(float(r.budget), str(r.line))]
        ia, ib = boot.index_of(budget=r.budget, allocation=r.allocation), boot.index_of(budget=r.budget,
                                                                                       allocation=top)
        if top == r.allocation:
            vs = "the best"
        else:
            d = difference(float(boot.cells["score"].iloc[ia]), float(boot.cells["score"].iloc[ib]),
                           boot.reps[:, ia], boot.reps[:, ib])
            vs = f"{d.diff:+.3f} {fmt_interval(d.lo, d.hi)}"
        rows.append([fmt_flops(r.budget), r.allocation, names[r.line], f"{r.p:.3f} [{r.p_min:.3f}-{r.p_max:.3f}]",
                     f"{r.p_policy:.3f}", fmt_pct(r.feedback_share), fmt_score(r.score), fmt_interval(r.lo, r.hi), vs])
    return rows


def _end_difference(table: pd.DataFrame, boot: Any, b: BestShare, which: int) -> str:
    """The paired difference (the line's smallest (which=0) or largest (-1) p) - (its best), with its interval."""
    g = table[(table["budget"] == b.budget) & (table["line"] == b.line)].sort_values(["p", "allocation"])
    end = str(g["allocation"].iloc[which])
    if end == b.best_allocation:
        return "the best"
    ia = boot.index_of(budget=b.budget, allocation=end)
    ib = boot.index_of(budget=b.budget, allocation=b.best_allocation)
    d = difference(float(boot.cells["score"].iloc[ia]), float(boot.cells["score"].iloc[ib]), boot.reps[:, ia],
                   boot.reps[:, ib])
    return f"p {float(g['p'].iloc[which]):.2f}: {d.diff:+.3f} {fmt_interval(d.lo, d.hi)}"


def _call_rows(table: pd.DataFrame, boot: Any, bests: list[BestShare]) -> list[list[str]]:
    names = line_names(table)
    return [[fmt_flops(b.budget), names[b.line], b.in_p.text() if b.in_p else "-",
             b.in_p_policy.text() if b.in_p_policy else "-", _end_difference(table, boot, b, 0),
             _end_difference(table, boot, b, -1)] for b in bests]


def share_figure(table: pd.DataFrame, bests: list[BestShare]) -> bytes:
    """Score against p, one panel per budget, one line per line of allocations (its reward system; points sorted by
    p, 95% interval bars); a star at a located best p (its interval as a horizontal bar), a
    ring around a pilot-best fallback, a dotted bar to the nearest points below it beyond the noise where
    there are such points on both sides (the model-free call located it)."""
    budgets = sorted(table["budget"].unique())
    names = line_names(table)
    lines = sorted(table["line"].unique())
    color = dict(zip(lines, colors(len(lines))))
    nr, nc = panel_grid(len(budgets), 3)
    fig = new_figure(4.6 * nc, 3.6 * nr)
    best_of = {(b.budget, b.line): b for b in bests}
    for i, budget in enumerate(budgets):
        ax = fig.add_subplot(nr, nc, i + 1)
        for line in lines:
            g = table[(table["budget"] == budget) & (table["line"] == line)].sort_values("p")
            if g.empty:
                continue
            c = color[line]
            ax.errorbar(g["p"], g["score"], yerr=[g["score"] - g["lo"], g["hi"] - g["score"]], fmt="o-", color=c,
                        ms=4, lw=1.2, capsize=3, label=names[line])
            b = best_of.get((float(budget), line))
            if b is None:
                continue
            if b.status == "located" and b.coef is not None:
                ax.errorbar([b.p], [float(np.polyval(b.coef, b.p))], xerr=[[b.p - b.lo], [b.hi - b.p]], fmt="*",
                            ms=12, color=c, mec="black", capsize=4)
            else:
                ax.plot([b.best_p], [b.best_score], "o", ms=13, mfc="none", mec=c, mew=1.5)
                if b.in_p is not None and b.in_p.call == Call.LOCATED:  # located by the points around it
                    ax.hlines(b.best_score, b.in_p.lo, b.in_p.hi, colors=c, linestyles=":", lw=2)
        ax.set_xlabel("update share p = C_learning / C_total")
        ax.set_ylabel("score at equal FLOPs")
        ax.set_title(f"budget {fmt_flops(budget)}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("star: located best p (bar: 95% interval); ring: pilot best (dotted: to the nearest points below it "
                 "beyond the noise)", fontsize=9)
    fig.tight_layout()
    return to_png(fig)


__all__ = ["TITLE", "line_names", "share_figure", "update_share_section"]
