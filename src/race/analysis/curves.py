"""Learning curves: score against cumulative training FLOPs, per run and target.

A learning curve is the sequence of evaluation points (flops_i, score_i) of one run on one
target, sorted by FLOPs. Two ways to read a curve at a FLOP level C:

- interpolated: linear interpolation of score between the evaluation points around C
  (clipped to the first/last point outside the evaluated range);
- step / "best reached by C": max{score_i : flops_i <= C} (NaN before the first point),
  the monotone envelope used by frontiers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .tables import (
    RUN_KEYS,
    SchemaError,
    per_problem_array,
    prepare_runs,
    require_columns,
    validate_evals,
)


def learning_curves(
    evals: pd.DataFrame,
    runs: pd.DataFrame | None = None,
    target: str | None = None,
    include_failed: bool = False,
) -> pd.DataFrame:
    """Evaluation points sorted by (run_id, target, flops), with run columns merged.

    When ``runs`` is given, only its (complete, unless ``include_failed``) runs are kept and
    ``budget, seed, allocation, reward_system, model_params`` and the allocation columns
    are added. ``target`` filters one evaluation target.
    """
    validate_evals(evals, ["run_id", "flops", "target", "score"])
    ev = evals if target is None else evals[evals["target"] == target]
    if target is not None and ev.empty:
        raise SchemaError(f"evals has no rows for target {target!r} (targets: {sorted(evals['target'].unique())})")
    ev = ev.copy()
    ev["flops"] = ev["flops"].astype(float)
    ev["score"] = ev["score"].astype(float)
    if runs is not None:
        pr = prepare_runs(runs, include_failed=include_failed)
        cols = [c for c in RUN_KEYS if c in pr.columns]
        ev = ev.merge(pr[cols], on="run_id", how="inner")
    order = ["run_id", "target", "flops"] + (["step"] if "step" in ev.columns else [])
    return ev.sort_values(order, kind="mergesort").reset_index(drop=True)


def score_at(flops: Sequence[float], scores: Sequence[float], c: float, how: str = "interp") -> float:
    """Read one curve at FLOP level ``c``.

    ``how="interp"``: linear interpolation, clipped to the end points.
    ``how="step"``: score of the last point with flops <= c (NaN if none).
    ``how="best"``: max score over points with flops <= c (NaN if none).
    """
    f = np.asarray(flops, dtype=float)
    s = np.asarray(scores, dtype=float)
    order = np.argsort(f, kind="mergesort")
    f, s = f[order], s[order]
    if how == "interp":
        return float(np.interp(c, f, s))
    mask = f <= c * (1 + 1e-12)
    if not mask.any():
        return float("nan")
    if how == "step":
        return float(s[mask][-1])
    if how == "best":
        return float(s[mask].max())
    raise ValueError(f"how must be 'interp', 'step' or 'best', got {how!r}")


def best_reached(curves: pd.DataFrame, flops_grid: Sequence[float]) -> pd.DataFrame:
    """Best score reached by FLOPs C, per run: max{score_i : flops_i <= C} for C in the grid.

    ``curves`` is the output of :func:`learning_curves` (one target). Returns columns
    ``run_id, flops, score`` plus the run columns present in ``curves``; rows where a run
    has no evaluation at or before C are dropped.
    """
    require_columns(curves, ["run_id", "flops", "score"], "curves")
    grid = np.sort(np.asarray(flops_grid, dtype=float))
    keep = [c for c in RUN_KEYS if c in curves.columns and c != "run_id"]
    rows = []
    for run_id, g in curves.groupby("run_id", sort=True):
        g = g.sort_values("flops", kind="mergesort")
        f = g["flops"].to_numpy()
        best = np.maximum.accumulate(g["score"].to_numpy())
        idx = np.searchsorted(f, grid * (1 + 1e-12), side="right") - 1
        ok = idx >= 0
        frame = pd.DataFrame({"run_id": run_id, "flops": grid[ok], "score": best[idx[ok]]})
        for c in keep:
            frame[c] = g[c].iloc[0]
        rows.append(frame)
    if not rows:
        return pd.DataFrame(columns=["run_id", "flops", "score", *keep])
    return pd.concat(rows, ignore_index=True)


AT_CHOICES = ("last", "budget", "equal")


def equal_flops_levels(curves: pd.DataFrame) -> dict[float, float]:
    """Per budget, C*_b = min over its runs of the run's last evaluated FLOPs.

    ``curves``: :func:`learning_curves` output with a ``budget`` column. Reading every run
    of the budget at C*_b compares them at equal counted compute.
    """
    require_columns(curves, ["run_id", "budget", "flops"], "curves")
    last = curves.groupby("run_id", sort=True).agg(budget=("budget", "first"), flops=("flops", "max"))
    trained = last[last["flops"] > 0]  # a run with no evaluation after step 0 does not pull the level to 0
    return {float(b): float(v) for b, v in trained.groupby("budget")["flops"].min().items()}


def final_scores(
    evals: pd.DataFrame,
    runs: pd.DataFrame,
    target: str,
    at: str = "last",
    include_failed: bool = False,
    curves: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One score per run on ``target``.

    ``curves``: ``learning_curves(evals, runs, target=target, include_failed=include_failed)``
    when the caller has it already (it is computed here otherwise).

    ``at="last"``: the last evaluation point (largest flops, then step).
    ``at="equal"``: every run of a budget read at the same counted FLOPs C*_b = the
    smallest last-evaluated FLOPs among that budget's runs (runs spend 38-99% of their
    budget, so "last" compares unequal compute); interpolated as below, never beyond a
    run's own evaluated points.
    ``at="budget"``: linear interpolation in FLOPs at the run's budget C_b between the
    points around it, score = (1 - t) s_i + t s_{i+1} with t = (C_b - f_i)/(f_{i+1} - f_i);
    clipped to the last point when the run stopped before its budget. ``per_problem``
    vectors are interpolated with the same weights, so problem bootstraps stay consistent.

    Returns one row per run: ``run_id, budget, seed, allocation, reward_system,
    model_params``, the allocation columns, ``flops`` (where it was read), ``score``,
    ``n`` and ``per_problem`` (object column, None when absent). Sorted by
    (budget, allocation, seed, run_id).
    """
    if at not in AT_CHOICES:
        raise ValueError(f"at must be one of {AT_CHOICES}, got {at!r}")
    if curves is None:
        curves = learning_curves(evals, runs, target=target, include_failed=include_failed)
    has_pp = "per_problem" in curves.columns
    common = equal_flops_levels(curves) if at == "equal" else {}
    rows = []
    for run_id, g in curves.groupby("run_id", sort=True):
        f = g["flops"].to_numpy()
        s = g["score"].to_numpy()
        pp = [per_problem_array(v) for v in g["per_problem"]] if has_pp else [None] * len(g)
        n = g["n"].to_numpy() if "n" in g.columns else np.full(len(g), np.nan)
        last = len(g) - 1
        c = common.get(g["budget"].iloc[0], f[last]) if at == "equal" else g["budget"].iloc[0]
        if at == "last" or c >= f[last]:
            i, j, t = last, last, 0.0
        else:
            j = int(np.searchsorted(f, c, side="left"))
            if j == 0:
                i, t = 0, 0.0
            else:
                i = j - 1
                t = 0.0 if f[j] == f[i] else float((c - f[i]) / (f[j] - f[i]))
        score = (1 - t) * s[i] + t * s[j]
        per = None
        if pp[i] is not None and pp[j] is not None and pp[i].shape == pp[j].shape:
            per = (1 - t) * pp[i] + t * pp[j]
        row = {c: g[c].iloc[0] for c in RUN_KEYS if c in g.columns}
        row.update(flops=(1 - t) * f[i] + t * f[j], score=float(score), n=n[j], per_problem=per)
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.sort_values(["budget", "allocation", "seed", "run_id"], kind="mergesort").reset_index(drop=True)
