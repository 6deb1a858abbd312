"""Regimes: which allocation (and which axis) wins in each budget band, and how surely.

An allocation differs from another along four axes:

- size: ``model`` (model_params);
- search: ``num_generations``, ``prompts_per_step``;
- learning: ``num_iterations``, ``learning_rate``;
- feedback: ``reward``.

For each (budget, condition) the winner is the allocation with the highest seed-mean
score; it is compared with the runner-up (or a named baseline), the difference gets a
bootstrap interval (a tie when it covers 0), and its win probability is the share of
bootstrap replicates in which it scores highest. Rank stability across budgets: Kendall's
tau-b between allocation rankings of consecutive budgets, and pairwise decision accuracy
PDA(b) = share of allocation pairs (i, j) with sign(s_b(i) - s_b(j)) = sign(s_L(i) - s_L(j)),
L the largest budget (pairs tied at L are left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from .bootstrap import bootstrap_cells, difference, win_probabilities
from .curves import final_scores
from .frontier import group_cols, allocation_scores
from .tables import AXIS_PREFIX, OPTIONAL_ALLOCATION_COLUMNS, allocation_table, without_controls

AXES: dict[str, tuple[str, ...]] = {
    "size": ("model",),
    "search": ("num_generations", "prompts_per_step"),
    "learning": ("num_iterations", "learning_rate"),
    "feedback": ("reward",),
}


def axes_between(winner: Mapping, other: Mapping) -> tuple[list[str], str]:
    """Axes along which ``winner`` differs from ``other``, and a readable detail.

    Returns (sorted axis names, text such as ``"size: larger model (qwen-1.5b, 1.5e+09 vs
    5e+08 params); search: num_generations 16 vs 8"``).
    """
    axes, details = [], []
    for axis, cols in AXES.items():
        diffs = [c for c in cols if str(winner.get(c)) != str(other.get(c))]
        if not diffs:
            continue
        axes.append(axis)
        if axis == "size" and "model_params" in winner and "model_params" in other:
            wn, on = float(winner["model_params"]), float(other["model_params"])
            word = "larger" if wn > on else "smaller" if wn < on else "different"
            details.append(f"size: {word} model ({winner['model']}, {wn:.3g} vs {on:.3g} params)")
        else:
            details.append(f"{axis}: " + ", ".join(f"{c} {winner.get(c)} vs {other.get(c)}" for c in diffs))
    extra = [c for c in sorted(set(winner) | set(other), key=str)
             if _is_optional_column(c) and str(winner.get(c)) != str(other.get(c))]
    if extra:  # a grid's other allocation axes (lora_r, engine, axis_*)
        axes.append("other")
        details.append("other: " + ", ".join(f"{c.removeprefix(AXIS_PREFIX)} {winner.get(c)} vs {other.get(c)}"
                                             for c in extra))
    return sorted(axes), "; ".join(details)


def regimes(
    evals: pd.DataFrame,
    runs: pd.DataFrame,
    target: str,
    condition_on: str | None = "reward_system",
    at: str = "equal",
    baseline: str | None = None,
    n_boot: int = 1000,
    rng: np.random.Generator | int | None = 0,
    level: float = 0.95,
    over: tuple[str, ...] = ("seeds", "problems"),
    exclude_random: bool = True,
) -> pd.DataFrame:
    """The winning allocation per (budget, condition) and the axis it favours.

    ``baseline`` (an allocation key) is the comparison when present at that budget and
    not the winner; otherwise the runner-up is. Columns: ``budget, condition, target,
    winner, score, lo, hi, win_prob, compared_to, compared_score, diff, diff_lo,
    diff_hi, tie, decisive, axes`` ("size+search", "" for none), ``detail,
    n_allocations``. ``decisive`` = not a tie.
    """
    group = group_cols(condition_on)
    finals = final_scores(evals, runs, target, at=at)
    if exclude_random:
        finals = without_controls(finals)
    bs = bootstrap_cells(finals, ["budget", *group, "allocation"], n_boot=n_boot, rng=rng, over=over)
    ivals = bs.intervals(level)
    attrs = finals.drop_duplicates("allocation").set_index("allocation")
    rows = []
    for key, g in ivals.groupby(["budget", *group], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        idx = g.index.to_numpy()
        probs = win_probabilities(bs.reps[:, idx]) if len(idx) > 1 else np.ones(1)
        order = np.lexsort((g["allocation"].to_numpy(), -g["score"].to_numpy()))
        w = idx[order[0]]
        row = dict(budget=float(key[0]), condition=str(key[1]) if group else None, target=target,
                   winner=ivals.at[w, "allocation"], score=float(ivals.at[w, "score"]),
                   lo=float(ivals.at[w, "lo"]), hi=float(ivals.at[w, "hi"]),
                   win_prob=float(probs[order[0]]), n_allocations=len(idx))
        other = None
        if baseline is not None and baseline in set(g["allocation"]) and baseline != row["winner"]:
            other = int(g.index[g["allocation"] == baseline][0])
        elif len(idx) > 1:
            other = int(idx[order[1]])
        if other is None:
            row.update(compared_to=None, compared_score=np.nan, diff=np.nan, diff_lo=np.nan, diff_hi=np.nan,
                       tie=False, decisive=False, axes="", detail="only one allocation")
        else:
            d = difference(ivals.at[w, "score"], ivals.at[other, "score"], bs.reps[:, w], bs.reps[:, other], level)
            axes, detail = axes_between(attrs.loc[row["winner"]].to_dict(),
                                        attrs.loc[ivals.at[other, "allocation"]].to_dict())
            row.update(compared_to=ivals.at[other, "allocation"], compared_score=float(ivals.at[other, "score"]),
                       diff=d.diff, diff_lo=d.lo, diff_hi=d.hi, tie=d.tie, decisive=not d.tie,
                       axes="+".join(axes), detail=detail)
        rows.append(row)
    cols = ["budget", "condition", "target", "winner", "score", "lo", "hi", "win_prob", "compared_to",
            "compared_score", "diff", "diff_lo", "diff_hi", "tie", "decisive", "axes", "detail", "n_allocations"]
    return pd.DataFrame(rows, columns=cols)


def regime_changes(regime_table: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Consecutive budgets (per condition) whose winners differ.

    ``regime_table`` is the output of :func:`regimes`; ``runs`` (optional) supplies
    model sizes so the detail can say "larger"/"smaller" model.

    Columns: ``condition, from_budget, to_budget, from_winner, to_winner, axes`` (axes
    along which the two winners differ, e.g. "size"), ``detail`` (to_winner vs
    from_winner), ``decisive`` (both winners beat their comparison beyond noise).
    """
    attrs = allocation_table(runs).set_index("allocation") if runs is not None else None

    def lookup(key: str) -> dict:
        if attrs is not None and key in attrs.index:
            return attrs.loc[key].to_dict()
        return _parse_key(key)

    rows = []
    cond = regime_table["condition"].fillna("")
    for c, g in regime_table.assign(_c=cond).groupby("_c", sort=True):
        g = g.sort_values("budget", kind="mergesort")
        for (_, a), (_, b) in zip(g.iloc[:-1].iterrows(), g.iloc[1:].iterrows()):
            if a["winner"] == b["winner"]:
                continue
            axes, detail = axes_between(lookup(b["winner"]), lookup(a["winner"]))
            rows.append(dict(condition=a["condition"], from_budget=a["budget"], to_budget=b["budget"],
                             from_winner=a["winner"], to_winner=b["winner"], axes="+".join(axes),
                             detail=detail, decisive=bool(a["decisive"] and b["decisive"])))
    cols = ["condition", "from_budget", "to_budget", "from_winner", "to_winner", "axes", "detail", "decisive"]
    return pd.DataFrame(rows, columns=cols)


def _parse_key(key: str) -> dict:
    """Allocation columns back from an allocation key (see ``allocation_key``)."""
    parts = key.split("|")
    out = {"model": parts[0], "reward": parts[5]}
    for p, col in zip(parts[1:5], ("num_generations", "prompts_per_step", "num_iterations", "learning_rate")):
        out[col] = p.split("=", 1)[1]
    for p in parts[6:]:  # optional allocation columns that vary in the study
        name, _, value = p.partition("=")
        out[name if name in OPTIONAL_ALLOCATION_COLUMNS else AXIS_PREFIX + name] = value
    return out


def _is_optional_column(name: object) -> bool:
    return isinstance(name, str) and (name in OPTIONAL_ALLOCATION_COLUMNS or name.startswith(AXIS_PREFIX))


def pairwise_decision_accuracy(small: pd.Series, large: pd.Series) -> tuple[float, int]:
    """Share of pairs ordered the same way by ``small`` and ``large`` (indexed by allocation).

    Pairs tied in ``large`` are skipped; a pair tied in ``small`` counts as half right.
    Returns (accuracy, number of pairs); NaN accuracy when there are no pairs.
    """
    common = sorted(set(small.index) & set(large.index))
    right, n = 0.0, 0
    for i, j in combinations(common, 2):
        dl = np.sign(large[i] - large[j])
        if dl == 0:
            continue
        ds = np.sign(small[i] - small[j])
        right += 1.0 if ds == dl else 0.5 if ds == 0 else 0.0
        n += 1
    return (right / n if n else float("nan")), n


def rank_stability(
    evals: pd.DataFrame,
    runs: pd.DataFrame,
    target: str,
    condition_on: str | None = "reward_system",
    at: str = "equal",
    exclude_random: bool = True,
) -> pd.DataFrame:
    """Rank agreement of allocations across budgets (per condition).

    One row per budget b except the largest L: ``condition, budget, next_budget,
    kendall_tau`` (tau-b between seed-mean scores at b and the next budget over their
    common allocations), ``n_common``, ``largest_budget, pda_vs_largest, n_pairs``.
    """
    group = group_cols(condition_on)
    finals = final_scores(evals, runs, target, at=at)
    if exclude_random:
        finals = without_controls(finals)
    scores = allocation_scores(finals)
    rows = []
    conds = [(None, scores)] if not group else list(scores.groupby(group[0], sort=True))
    for cond, g in conds:
        per_budget = {b: s.set_index("allocation")["score"] for b, s in g.groupby("budget", sort=True)}
        budgets = sorted(per_budget)
        largest = budgets[-1]
        for b, nb in zip(budgets[:-1], budgets[1:]):
            common = sorted(set(per_budget[b].index) & set(per_budget[nb].index))
            tau = float("nan")
            if len(common) >= 2:
                tau = float(kendalltau(per_budget[b][common], per_budget[nb][common]).statistic)
            pda, n_pairs = pairwise_decision_accuracy(per_budget[b], per_budget[largest])
            rows.append(dict(condition=None if cond is None else str(cond), budget=b, next_budget=nb,
                             kendall_tau=tau, n_common=len(common), largest_budget=largest,
                             pda_vs_largest=pda, n_pairs=n_pairs))
    cols = ["condition", "budget", "next_budget", "kendall_tau", "n_common", "largest_budget", "pda_vs_largest",
            "n_pairs"]
    return pd.DataFrame(rows, columns=cols)
