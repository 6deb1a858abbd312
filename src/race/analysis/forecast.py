"""The forecast at the target budget, per allocation: point, joint replicates, back-tested noise.

Steps 4-5 of :mod:`race.analysis.recommend`: every allocation that passed the gate is forecast
by the chosen method (the joint model by default: :mod:`race.analysis.joint_forecast`; the
curve families: :mod:`race.analysis.families`), the others by their recent level or their
straight line in ln C (``race.analysis.recommend.UNGATED``); each replicate then gets the
extrapolation error measured by the study's own rolling-origin back-tests
(:func:`backtest_study`: :mod:`race.analysis.backtest` run on this module's point forecasts),
scaled to the target's reach, then widened where the rules say so
(:mod:`race.analysis.spread`: the spread floor and the trend mix). The predictions table
read from the replicates, and the observed standings, are :mod:`race.analysis.standings`'s.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import expit

from .backtest import JOINT_MISFIT_REACH, JOINT_PRIOR_SCALE, PRIOR_SCALE, BackTest, PairRule, logit, run_backtest, slope_norm
from .families import select_and_forecast
from .joint import Replicates, StudyMatrix
from .joint_forecast import forecast_joint, joint_fit_at
from .spread import TrendMix, check_min_logit_sd, floor_spread, mix_trend, trend_forecast
from .standings import INTERVALS, NEAR_BEST, equal_tailed_interval, interval_bounds, shortest_interval, standings, \
    summarise

#: this module's names and those it re-exports from race.analysis.standings and race.analysis.spread
#: (split out of it by job; callers that import them from here keep working)
__all__ = ["INTERVALS", "NEAR_BEST", "TrendMix", "backtest_study", "check_min_logit_sd", "equal_tailed_interval",
           "floor_spread", "forecast_allocation", "forecast_parts", "forecasts", "interval_bounds", "mix_trend",
           "point_forecast", "seed_offset_sd", "shortest_interval", "slope_of", "spend_share", "standings", "summarise",
           "trend_forecast"]


def spend_share(sm: StudyMatrix) -> float:
    """Median over runs of (FLOPs at the equal-FLOP reading) / budget."""
    share = sm.runs["end_flops"].to_numpy(float) / sm.runs["budget"].to_numpy(float)
    return float(np.clip(np.median(share), 1e-6, 1.0))


def _anchor(sm: StudyMatrix, idx: np.ndarray, x: np.ndarray, y: np.ndarray, n: np.ndarray) -> float:
    """Step-0 score of these runs (their mean), or the lowest-FLOP points' mean without one."""
    if np.isfinite(sm.start[idx]).any():
        return float(np.nanmean(sm.start[idx]))
    low = x <= x.min() + 1e-9
    return float(np.average(y[low], weights=n[low]))


def point_forecast(sm: StudyMatrix, allocation: str, x_target: float, families: tuple[str, ...],
                   max_budget: float | None = None) -> tuple[float, float, float] | None:
    """(point forecast at ln C = ``x_target``, largest and smallest ln C fitted) from the runs at
    budgets <= ``max_budget`` (all runs by default); None without evaluation points."""
    idx = sm.runs_of(allocation, max_budget)
    pts = sm.points[sm.points["run"].isin(idx).to_numpy()]
    if pts.empty:
        return None
    x, y, n = np.log(pts["flops"].to_numpy(float)), pts["score"].to_numpy(float), pts["n"].to_numpy(float)
    r0 = _anchor(sm, idx, x, y, n)
    fc = select_and_forecast(x, y[None, :], n[None, :], np.array([r0]), x_target, families)
    return float(fc.forecast[0]), float(x.max()), float(x.min())


def forecast_allocation(sm: StudyMatrix, reps: Replicates, allocation: str, x_target: float,
                        families: tuple[str, ...], rng: np.random.Generator | int | None = 0,
                        ) -> tuple[float, np.ndarray, dict]:
    """(point forecast, replicate forecasts (R,) without extrapolation noise, info);
    ``info["family"]`` is the family with the largest weight in the point fit."""
    idx = sm.runs_of(allocation)
    mask = sm.points["run"].isin(idx).to_numpy()
    pts = sm.points[mask]
    if pts.empty:
        raise ValueError(f"allocation {allocation} has no evaluation point after step 0")
    x, y, n = np.log(pts["flops"].to_numpy(float)), pts["score"].to_numpy(float), pts["n"].to_numpy(float)
    y_reps = reps.scores(sm.point_pp[mask] if sm.point_pp is not None else None, y)
    w_reps = n[None, :] * reps.counts[:, pts["run"].to_numpy(int)]
    r0 = _anchor(sm, idx, x, y, n)
    if np.isfinite(sm.start[idx]).any():
        start_reps = reps.scores(sm.start_pp[idx] if sm.start_pp is not None else None, sm.start[idx])
        c = reps.counts[:, idx]
        r0_reps = np.nansum(c * start_reps, axis=1) / np.maximum(np.sum(c * np.isfinite(start_reps), axis=1), 1e-300)
    else:  # no step-0 evaluation: anchor at the lowest-FLOP points
        low = x <= x.min() + 1e-9
        r0_reps = (w_reps[:, low] * y_reps[:, low]).sum(axis=1) / w_reps[:, low].sum(axis=1)
    point = select_and_forecast(x, y[None, :], n[None, :], np.array([r0]), x_target, families)
    rep = select_and_forecast(x, y_reps, w_reps, np.clip(r0_reps, 0.0, 1.0), x_target, families, rng=rng,
                              extrapolation_noise=False)
    info = {"family": point.families[int(point.family[0])], "holdout": point.selected_by_holdout, "r0": r0,
            "x_max": float(x.max()), "x_min": float(x.min()), **{f"share_{f}": rep.share(f) for f in families},
            **{f"bound_{f}": v for f, v in rep.bound_hits.items()}}
    return float(point.forecast[0]), rep.forecast, info


def backtest_study(sm: StudyMatrix, reps: Replicates, allocations: list[str],
                   families_of: dict[str, tuple[str, ...]], target_ratio: float | None = None,
                   pairs: PairRule = PairRule(), target_reach: float | None = None) -> BackTest:
    """Rolling-origin back-test of the point forecasts (:mod:`race.analysis.backtest`); allocations
    whose family is ``"joint"`` are forecast by the joint model fitted on the smaller budgets."""
    end_reps = reps.scores(sm.end_pp, sm.end)
    runs = sm.runs[sm.runs["allocation"].isin(allocations)]
    budgets = sorted(float(b) for b in runs["budget"].unique())

    def observed_at(a: str, b: float):
        idx = sm.runs.index[(sm.runs["allocation"] == a) & np.isclose(sm.runs["budget"].to_numpy(float), b)].to_numpy()
        if not len(idx):
            return None
        lr = logit(reps.cell_mean(end_reps, idx))
        v = float(np.var(lr, ddof=1)) if reps.n > 1 else 0.0
        return float(np.mean(sm.end[idx])), float(np.log(np.mean(sm.runs.loc[idx, "end_flops"]))), v, lr

    joint = [a for a in allocations if families_of[a] == ("joint",)]
    joint_at = joint_fit_at(sm, joint) if joint else None

    def fit_at(a: str, o: float, xt: float):
        return joint_at(a, o, xt) if a in joint else point_forecast(sm, a, xt, families_of[a], o)

    slopes = {a: slope_of(sm, a) for a in allocations}
    return run_backtest(budgets, allocations, fit_at, observed_at, slopes.get, target_ratio,
                        prior_scale=JOINT_PRIOR_SCALE if joint else PRIOR_SCALE,
                        misfit_reach=JOINT_MISFIT_REACH if joint else 0.0, pairs=pairs, target_reach=target_reach)


def slope_of(sm: StudyMatrix, allocation: str) -> float:
    """min(|b| + c0, c1) of the allocation's seed-mean equal-FLOP scores over its pilot budgets (:func:`slope_norm`)."""
    r = sm.runs.assign(end=sm.end, lnc=np.log(sm.runs["end_flops"].to_numpy(float)))
    g = r[r["allocation"] == allocation].groupby("budget")[["lnc", "end"]].mean()
    return slope_norm(g["lnc"].to_numpy(), g["end"].to_numpy())


def forecast_parts(sm: StudyMatrix, reps: Replicates, allocs: list[str], families_of: dict, forecast_c: float,
                   gen: np.random.Generator, pairs: PairRule = PairRule(),
                   ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, BackTest]:
    """Per allocation: point forecast and info (rows), (R, k) replicates WITHOUT the back-tested
    noise, the effective reach it is scaled by (min(|slope| + c0, c1) x sqrt(r_m^2 + log-FLOP reach^2):
    :func:`race.analysis.backtest.effective_reach`), the back-test."""
    x_t = float(np.log(forecast_c))
    joint = [a for a in allocs if families_of[a] == ("joint",)]
    if joint:
        j_pt, j_reps, j_info, _ = forecast_joint(sm, reps, joint, x_t)
    rows, cols = [], []
    for a in allocs:
        if a in joint:
            i = joint.index(a)
            p, r, info = j_pt[a], j_reps[:, i], {k: v for k, v in j_info[i].items() if k != "allocation"}
        else:
            p, r, info = forecast_allocation(sm, reps, a, x_t, families_of[a], rng=gen)
            info["unidentified"] = info.get("bound_sigmoid", 0.0) >= 0.5
        rows.append({"allocation": a, "point": p, **info})
        cols.append(r)
    info_df = pd.DataFrame(rows)
    info_df["factor"] = [slope_of(sm, a) for a in allocs]
    span = np.maximum(info_df["x_max"].to_numpy(float) - info_df["x_min"].to_numpy(float), 1e-9)
    reach = np.maximum(x_t - info_df["x_max"].to_numpy(float), 0.0)
    bt = backtest_study(sm, reps, allocs, families_of, target_ratio=float(np.median(reach / span)), pairs=pairs,
                        target_reach=float(np.median(reach)))
    return info_df, np.column_stack(cols), bt.effective(reach, info_df["factor"].to_numpy(float)), bt


def forecasts(sm: StudyMatrix, reps: Replicates, allocs: list[str], families_of: dict, forecast_c: float,
              gen: np.random.Generator, pairs: PairRule = PairRule(), trend: TrendMix = TrendMix(),
              min_logit_sd: float = 0.0) -> tuple[pd.DataFrame, np.ndarray, BackTest]:
    """:func:`forecast_parts` with the back-tested extrapolation noise added to every replicate (step 5),
    their spread floored at ``min_logit_sd`` (:func:`floor_spread`; 0, off, by default), then
    mixed with the local trend where ``trend`` says so (:class:`TrendMix`; off by default);
    ``info_df`` gains ``ln_reach`` (ln C past the allocation's last point), ``logit_sd`` (the curve
    model's logit-scale SD: replicates' spread and back-tested noise, read by :func:`open_ends`)
    and, with the mix on, ``trend`` (the trend forecast as a score, NaN where there is none)."""
    info_df, F0, reach, bt = forecast_parts(sm, reps, allocs, families_of, forecast_c, gen, pairs)
    info_df["ln_reach"] = np.maximum(np.log(forecast_c) - info_df["x_max"].to_numpy(float), 0.0)
    info_df["rep_sd"] = np.std(logit(F0), axis=0)
    seed_sd, df = seed_offset_sd(sm, allocs)
    info_df["seed_sd"] = seed_sd
    info_df["logit_sd"] = np.sqrt(info_df["rep_sd"].to_numpy() ** 2 + bt.sd(reach) ** 2 + seed_sd**2)
    noise = bt.noise(reach, reps.n, len(allocs), gen)
    if df > 0:  # Student-t draws: the pooled seed variance is itself estimated on df degrees of freedom
        noise = noise + seed_sd[None, :] * gen.standard_normal(noise.shape) * np.sqrt(df / gen.chisquare(df, (reps.n, 1)))
    trends = [trend_forecast(sm, a, float(np.log(forecast_c))) if trend.weight > 0 else None for a in allocs]
    if trend.weight > 0:
        info_df["trend"] = [np.nan if t is None else float(expit(t)) for t in trends]
    points = logit(info_df["point"].to_numpy(float))
    mixed = mix_trend(floor_spread(logit(F0) + noise, points, min_logit_sd), points, trends, trend, gen)
    return info_df, expit(mixed), bt


def seed_offset_sd(sm: StudyMatrix, allocs: list[str]) -> tuple[np.ndarray, int]:
    """((K,) logit-scale SD of a seed's offset for each allocation read from ONE seed at its
    largest budget (0 elsewhere), degrees of freedom): a racing study continues one seed's run
    per allocation, whose forecast is that seed's trajectory, not the allocation's mean; the
    replicates cannot resample one seed, so its offset (SD s) is added to each replicate.
    s^2 pools, over the allocations, the between-seed variance of logit(score at equal FLOPs)
    in each allocation's largest cell with >= 2 seeds (one cell per allocation: a seed's cells
    at several budgets are one trajectory); 0 (and 0 df) when no cell has 2 seeds."""
    r = sm.runs.assign(end=logit(sm.end))
    ss, df, single = 0.0, 0, np.zeros(len(allocs), bool)
    for i, a in enumerate(allocs):
        g = r[r["allocation"] == a]
        if g.empty:
            continue
        n = g.groupby("budget")["end"].agg(["size", "var"]).sort_index()
        single[i] = n["size"].iloc[-1] == 1
        multi = n[n["size"] >= 2]
        if len(multi):
            ss += float(multi["var"].iloc[-1]) * (int(multi["size"].iloc[-1]) - 1)
            df += int(multi["size"].iloc[-1]) - 1
    s = np.sqrt(ss / df) if df else 0.0
    return np.where(single & (df > 0), s, 0.0), df
