"""Allocation frontiers: the best allocation at each budget and along the FLOP axis.

- :func:`allocation_scores`: mean final score per (budget, allocation) over seeds.
- :func:`frontier`: at each budget, within each condition (reward system by default), the
  allocation with the highest mean score: best(b, g) = argmax_a mean_seeds score(b, g, a).
- :func:`frontier_envelope`: the upper envelope along compute. For each FLOP level C and
  each (allocation, budget) curve, the seed-mean of "best score reached by C"
  (max{score_i : flops_i <= C} per run); the envelope is the max over curves. A
  (allocation, budget) curve counts at C only when all its seeds have been evaluated by C.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .curves import best_reached, final_scores, learning_curves
from .tables import ALLOCATION_COLUMNS, require_columns, without_controls

CONDITIONS = ("reward_system", "reward", None)


def group_cols(condition_on: str | None) -> list[str]:
    """The columns a frontier is conditioned on: ``[condition_on]`` (one of
    :data:`CONDITIONS`), or none."""
    if condition_on not in CONDITIONS:
        raise ValueError(f"condition_on must be one of {CONDITIONS}, got {condition_on!r}")
    return [] if condition_on is None else [condition_on]


def allocation_scores(finals: pd.DataFrame) -> pd.DataFrame:
    """Seed-aggregated scores per (budget, allocation).

    ``finals``: one row per run (:func:`race.analysis.final_scores`). Returns
    ``budget, allocation``, the allocation columns, ``reward_system, model_params``,
    ``score`` (mean), ``std`` (sample std over seeds, NaN for one seed), ``sem``
    (std / sqrt(n)), ``n_seeds``; sorted by budget then score descending.
    """
    require_columns(finals, ["budget", "allocation", "score"], "finals")
    extra = [c for c in (*ALLOCATION_COLUMNS, "reward_system", "model_params") if c in finals.columns]
    agg = (
        finals.groupby(["budget", "allocation"], sort=True)
        .agg(score=("score", "mean"), std=("score", "std"), n_seeds=("score", "size"))
        .reset_index()
    )
    agg["sem"] = agg["std"] / np.sqrt(agg["n_seeds"])
    attrs = finals[["allocation", *extra]].drop_duplicates("allocation")
    out = agg.merge(attrs, on="allocation", how="left")
    out = out.sort_values(["budget", "score", "allocation"], ascending=[True, False, True], kind="mergesort")
    cols = ["budget", "allocation", *extra, "score", "std", "sem", "n_seeds"]
    return out[cols].reset_index(drop=True)


def frontier(
    evals: pd.DataFrame,
    runs: pd.DataFrame,
    target: str,
    condition_on: str | None = "reward_system",
    at: str = "equal",
    exclude_random: bool = True,
) -> pd.DataFrame:
    """Best allocation at each budget, per condition (reward system by default).

    Returns one row per (budget, condition): ``budget, [condition], target,
    allocation`` (the winner), ``score, sem, n_seeds, n_allocations``, and the
    ``runner_up`` with its ``runner_up_score`` (None/NaN with a single allocation).
    ``reward == "random"`` controls are left out unless ``exclude_random=False``.
    """
    group = group_cols(condition_on)
    finals = final_scores(evals, runs, target, at=at)
    if exclude_random:
        finals = without_controls(finals)
    scores = allocation_scores(finals)
    rows = []
    for key, g in scores.groupby(["budget", *group], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        g = g.sort_values(["score", "allocation"], ascending=[False, True], kind="mergesort")
        top = g.iloc[0]
        row = dict(zip(["budget", *group], key))
        row.update(
            target=target, allocation=top["allocation"], score=float(top["score"]), sem=float(top["sem"]),
            n_seeds=int(top["n_seeds"]), n_allocations=len(g),
            runner_up=g.iloc[1]["allocation"] if len(g) > 1 else None,
            runner_up_score=float(g.iloc[1]["score"]) if len(g) > 1 else np.nan,
        )
        rows.append(row)
    return pd.DataFrame(rows)


def frontier_envelope(
    evals: pd.DataFrame,
    runs: pd.DataFrame,
    target: str,
    flops_grid: Sequence[float] | None = None,
    condition_on: str | None = "reward_system",
    exclude_random: bool = True,
    n_grid: int = 40,
) -> pd.DataFrame:
    """Upper envelope of seed-mean "best reached by C" curves over (allocation, budget).

    env(C) = max over curves k of mean_{runs r in k} max{score_r,i : flops_r,i <= C}.
    ``flops_grid`` defaults to ``n_grid`` log-spaced levels between the smallest positive
    and the largest evaluated FLOPs. A curve keeps its best score after its last
    evaluation (a run that stopped at C_end has reached that score with any C >= C_end),
    so the envelope never decreases. Returns ``[condition], flops, score, allocation, budget,
    n_curves`` (curves defined at C), one row per (condition, C).
    """
    group = group_cols(condition_on)
    curves = learning_curves(evals, runs, target=target)
    if exclude_random:
        curves = without_controls(curves)
    if flops_grid is None:
        pos = curves.loc[curves["flops"] > 0, "flops"]
        flops_grid = np.geomspace(pos.min(), curves["flops"].max(), n_grid)
    reached = best_reached(curves, flops_grid)
    n_runs = curves.groupby(["allocation", "budget"])["run_id"].nunique().rename("n_runs").reset_index()
    mean = (
        reached.groupby([*group, "allocation", "budget", "flops"], sort=True)["score"]
        .agg(score="mean", n="size").reset_index().merge(n_runs, on=["allocation", "budget"])
    )
    mean = mean[mean["n"] == mean["n_runs"]]
    rows = []
    for key, g in mean.groupby([*group, "flops"], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        g = g.sort_values(["score", "allocation", "budget"], ascending=[False, True, True], kind="mergesort")
        row = dict(zip([*group, "flops"], key))
        row.update(score=float(g.iloc[0]["score"]), allocation=g.iloc[0]["allocation"],
                   budget=float(g.iloc[0]["budget"]), n_curves=len(g))
        rows.append(row)
    return pd.DataFrame(rows)
