"""The joint model (:mod:`race.analysis.joint_model`) on a study: data, forecasts, back-test.

``joint_data`` gathers the evaluation points of the allocations (C > 0), their step-0
anchors and, per joint bootstrap replicate, the resampled scores and seed multiplicities
(the same replicates as every other part of the recommendation). ``forecast_joint`` fits
the point model once and refits it on every replicate (warm-started), reading every
allocation at the target's ln C, with the seed bootstrap's small-sample correction
(:func:`small_sample_corrected`). ``joint_fit_at`` serves the rolling-origin back-test: the
joint model fitted on the budgets <= the origin only (one fit per origin, shared by all
allocations), forecasting a larger budget.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import expit

from .backtest import logit
from .joint import Replicates, StudyMatrix
from .joint_model import JointData, JointFit, fit_joint, refit


def _design(sm: StudyMatrix, allocations: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(dn, dg): ln N and ln G of each allocation, centred (0 where unknown)."""
    def col(name: str) -> np.ndarray:
        if name not in sm.runs.columns:
            return np.zeros(len(allocations))
        vals = np.array([pd.to_numeric(sm.runs.loc[sm.runs["allocation"] == a, name], errors="coerce").mean()
                         for a in allocations], dtype=float)
        ok = np.isfinite(vals) & (vals > 0)
        out = np.where(ok, np.log(np.where(ok, vals, 1.0)), np.nan)
        return np.nan_to_num(out - np.nanmean(out), nan=0.0) if ok.any() else np.zeros(len(allocations))
    return col("model_params"), col("num_generations")


def joint_data(sm: StudyMatrix, reps: Replicates | None, allocations: list[str],
               max_budget: float | None = None) -> tuple[list[str], JointData | None, JointData | None]:
    """(allocations with points, point data (R = 1), replicate data (R = reps.n) or None).

    Runs at budgets <= ``max_budget`` only (all by default). r0 is the runs' mean step-0
    score (the lowest-FLOP points' mean where a run has none); per replicate, the
    seed-resampled step-0 scores under the replicate's problem weights."""
    names, xs, ks, ys, ns, yr, wr, r0p, r0r = [], [], [], [], [], [], [], [], []
    for a in allocations:
        keep = (sm.runs["allocation"] == a).to_numpy().copy()
        if max_budget is not None:
            keep &= sm.runs["budget"].to_numpy(float) <= max_budget * (1 + 1e-9)
        idx = sm.runs.index[keep].to_numpy()
        mask = sm.points["run"].isin(idx).to_numpy()
        pts = sm.points[mask]
        if pts.empty:
            continue
        j = len(names)
        names.append(a)
        x, y, n = np.log(pts["flops"].to_numpy(float)), pts["score"].to_numpy(float), pts["n"].to_numpy(float)
        xs.append(x), ks.append(np.full(len(x), j)), ys.append(y), ns.append(n)
        low = x <= x.min() + 1e-9
        has_start = np.isfinite(sm.start[idx]).any()
        r0p.append(float(np.nanmean(sm.start[idx])) if has_start else float(np.average(y[low], weights=n[low])))
        if reps is not None:
            y_reps = reps.scores(sm.point_pp[mask] if sm.point_pp is not None else None, y)
            w_reps = n[None, :] * reps.counts[:, pts["run"].to_numpy(int)]
            yr.append(y_reps), wr.append(w_reps)
            if has_start:
                st = reps.scores(sm.start_pp[idx] if sm.start_pp is not None else None, sm.start[idx])
                c = reps.counts[:, idx]
                r0r.append(np.nansum(c * st, axis=1) / np.maximum(np.sum(c * np.isfinite(st), axis=1), 1e-300))
            else:
                r0r.append((w_reps[:, low] * y_reps[:, low]).sum(axis=1) / w_reps[:, low].sum(axis=1))
    if not names:
        return [], None, None
    dn, dg = _design(sm, names)
    x, k = np.concatenate(xs), np.concatenate(ks)
    point = JointData(x, k, np.concatenate(ys)[None], np.concatenate(ns)[None], np.clip([r0p], 0, 1), dn, dg)
    rep = None
    if reps is not None:
        rep = JointData(x, k, np.concatenate(yr, axis=1), np.concatenate(wr, axis=1),
                        np.clip(np.column_stack(r0r), 0, 1), dn, dg)
    return names, point, rep


def forecast_joint(sm: StudyMatrix, reps: Replicates, allocations: list[str], x_target: float,
                   ) -> tuple[dict[str, float], np.ndarray, list[dict], JointFit]:
    """(point forecast per allocation, (R, K) replicate forecasts in ``allocations`` order
    without extrapolation noise, one info dict per allocation, the point fit)."""
    names, point_d, rep_d = joint_data(sm, reps, allocations)
    if names != list(allocations):
        missing = sorted(set(allocations) - set(names))
        raise ValueError(f"allocations {missing} have no evaluation point after step 0")
    fit = fit_joint(point_d)
    reps_fit = refit(fit, rep_d)
    pt = fit.predict(x_target)[0]
    F = small_sample_corrected(np.clip(reps_fit.predict(x_target), 0.0, 1.0), pt,
                               seeds_at_largest(sm, names) if "seeds" in reps.over else np.ones(len(names)))
    x_max = point_d.x_max
    x_min = np.array([point_d.x[point_d.alloc == j].min() for j in range(len(names))])
    located = fit.located(x_max)
    m_reps, s_reps = reps_fit.midpoint(), reps_fit.slope()
    info = [{"allocation": a, "family": "joint", "x_max": float(x_max[j]), "x_min": float(x_min[j]),
             "r0": float(point_d.r0[0, j]), "c_mid": float(np.exp(fit.midpoint()[0, j])),
             "asymptote": float(fit.asymptote()[0, j]), "midpoint": located[j],
             "midpoint_inside_share": float(np.mean(m_reps[:, j] + 1 / s_reps[:, j] <= x_max[j])),
             "unidentified": located[j] == "not located"} for j, a in enumerate(names)]
    return dict(zip(names, map(float, pt))), F, info, fit


def seeds_at_largest(sm: StudyMatrix, allocations: list[str]) -> np.ndarray:
    """(K,) number of runs (seeds) of each allocation at its largest pilot budget."""
    out = []
    for a in allocations:
        b = sm.runs.loc[sm.runs["allocation"] == a, "budget"].to_numpy(float)
        out.append(int(np.sum(np.isclose(b, b.max(), rtol=1e-9, atol=0.0))) if len(b) else 1)
    return np.array(out)


def small_sample_corrected(F: np.ndarray, point: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(R, K) replicate forecasts with the seed bootstrap's small-sample correction: on the logit
    scale q_r -> q + sqrt(m / (m - 1)) (q_r - q), q the point forecast and m the allocation's
    seeds at its largest budget (no change where m < 2), as the cell means have it
    (:meth:`race.analysis.joint.Replicates.cell_mean`): resampling m seeds with replacement
    spreads a mean by only sqrt((m - 1) / m) of its standard error (2 seeds: by 0.71)."""
    c = np.sqrt(np.where(m >= 2, m / np.maximum(m - 1, 1), 1.0))
    q = logit(np.asarray(point, dtype=float))
    return expit(q[None, :] + c[None, :] * (logit(F) - q[None, :]))


def joint_fit_at(sm: StudyMatrix, allocations: list[str]):
    """``fit_at(allocation, origin, x_target)`` for :func:`race.analysis.backtest.run_backtest`:
    the joint point fit on the runs at budgets <= origin (cached per origin)."""
    cache: dict[float, tuple[list[str], JointFit | None, JointData | None]] = {}

    def fit_at(a: str, origin: float, x_t: float):
        if origin not in cache:
            names, d, _ = joint_data(sm, None, allocations, max_budget=origin)
            cache[origin] = (names, fit_joint(d) if d is not None else None, d)
        names, fit, d = cache[origin]
        if fit is None or a not in names:
            return None
        j = names.index(a)
        xa = d.x[d.alloc == j]
        return float(fit.predict(x_t)[0, j]), float(xa.max()), float(xa.min())

    return fit_at
