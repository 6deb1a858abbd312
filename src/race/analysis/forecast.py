"""The forecast at the target budget, per allocation: point, joint replicates, back-tested noise.

Steps 4-5 of :mod:`race.analysis.recommend`: every allocation that passed the gate is forecast
by the chosen method (the joint model by default: :mod:`race.analysis.joint_forecast`; the
curve families: :mod:`race.analysis.families`), the others by their recent level or their
straight line in ln C (``race.analysis.recommend.UNGATED``); each replicate then gets the
extrapolation error measured by the study's own rolling-origin back-tests
(:mod:`race.analysis.backtest`), scaled to the target's reach. The observed standings at a
budget (:func:`standings`) and the predictions table (:func:`summarise`) live here too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import expit

from .backtest import JOINT_MISFIT_REACH, JOINT_PRIOR_SCALE, PRIOR_SCALE, BackTest, PairRule, logit, run_backtest, slope_norm
from .bootstrap import win_probabilities
from .families import select_and_forecast
from .joint import Replicates, StudyMatrix
from .joint_forecast import forecast_joint, joint_fit_at


def spend_share(sm: StudyMatrix) -> float:
    """Median over runs of (FLOPs at the equal-FLOP reading) / budget."""
    share = sm.runs["end_flops"].to_numpy(float) / sm.runs["budget"].to_numpy(float)
    return float(np.clip(np.median(share), 1e-6, 1.0))


def _runs_of(sm: StudyMatrix, allocation: str, max_budget: float | None = None) -> np.ndarray:
    keep = sm.runs["allocation"] == allocation
    if max_budget is not None:
        keep &= sm.runs["budget"].to_numpy(float) <= max_budget * (1 + 1e-9)
    return sm.runs.index[keep].to_numpy()


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
    idx = _runs_of(sm, allocation, max_budget)
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
    idx = _runs_of(sm, allocation)
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


def standings(sm: StudyMatrix, reps: Replicates, allocations: list[str], budget: float) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Observed seed-mean scores at equal FLOPs at ``budget``: (allocations present, points, (R, k) replicates)."""
    end_reps = reps.scores(sm.end_pp, sm.end)
    names, pts, cols = [], [], []
    for a in allocations:
        idx = sm.runs.index[(sm.runs["allocation"] == a) & np.isclose(sm.runs["budget"].to_numpy(float), budget)]
        if len(idx):
            names.append(a)
            pts.append(float(np.mean(sm.end[idx])))
            cols.append(reps.cell_mean(end_reps, idx.to_numpy()))
    return names, np.array(pts), np.column_stack(cols) if cols else np.empty((reps.n, 0))


#: A pick whose regret at the target is at most this is right (the benchmark's and the label's threshold)
NEAR_BEST = 0.01


#: how an interval is read from the replicates (:func:`interval_bounds`): ``equal-tailed`` cuts
#: (1 - level) / 2 from each tail; ``shortest`` is the narrowest interval holding ``level`` of them
INTERVALS = ("equal-tailed", "shortest")


def equal_tailed_interval(reps: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per column of (R, k) replicates: the (1 - level) / 2 and (1 + level) / 2
    quantiles (linear interpolation between order statistics, ``np.quantile``'s default)."""
    q = (1 - level) / 2
    return np.quantile(reps, q, axis=0), np.quantile(reps, 1 - q, axis=0)


def shortest_interval(reps: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per column of (R, k) replicates: the narrowest interval between two order
    statistics that holds m = ceil(level x R) of the R replicates (the first such on a tie).
    Convention: it holds at least ``level`` of the replicates and is never wider than the
    equal-tailed interval's order statistics that hold as many; for a symmetric unimodal
    sample it is close to the equal-tailed one, for a skewed one (a forecast pressed against 0
    or 1 in score, or a mixture of two forecasters) it moves toward the dense side."""
    reps = np.asarray(reps, dtype=float)
    if reps.ndim != 2 or reps.shape[0] == 0:
        raise ValueError(f"replicates must be a non-empty (R, k) array, got shape {reps.shape}")
    r = reps.shape[0]
    m = min(r, max(1, int(np.ceil(level * r - 1e-9))))
    s = np.sort(reps, axis=0)
    widths = s[m - 1:] - s[: r - m + 1]
    i = np.argmin(widths, axis=0)
    cols = np.arange(reps.shape[1])
    return s[i, cols], s[i + m - 1, cols]


def interval_bounds(reps: np.ndarray, level: float, interval: str = "equal-tailed") -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per column of (R, k) replicates, read as ``interval`` says (:data:`INTERVALS`)."""
    if interval == "equal-tailed":
        return equal_tailed_interval(reps, level)
    if interval == "shortest":
        return shortest_interval(reps, level)
    raise ValueError(f"interval must be one of {INTERVALS}, got {interval!r}")


def summarise(allocations: list[str], points: np.ndarray, reps: np.ndarray, level: float,
              interval: str = "equal-tailed") -> pd.DataFrame:
    """Predictions table: score, lo, hi (the ``interval`` at ``level``, :func:`interval_bounds`),
    p_best, p_near_best (P(regret <= ``NEAR_BEST``): the share of replicates in which the
    allocation is within 0.01 of the best), expected_regret (step 6)."""
    lo, hi = interval_bounds(reps, level, interval)
    regret = reps.max(axis=1, keepdims=True) - reps
    return pd.DataFrame({"allocation": allocations, "score": points, "lo": lo, "hi": hi,
                         "p_best": win_probabilities(reps), "p_near_best": (regret <= NEAR_BEST).mean(axis=0),
                         "expected_regret": regret.mean(axis=0)})


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


@dataclass(frozen=True)
class TrendMix:
    """A second forecaster beside the curve model: the local trend (:func:`trend_forecast`).

    ``weight``: the share of replicates, per allocation, drawn around the trend forecast
    instead of the curve model's (0: none, the curve model alone; the draws of the other
    replicates are unchanged); ``scale``: those replicates deviate from the trend forecast by
    ``scale`` x the curve model's deviation from its own point (its seeds, problems and
    back-tested extrapolation error) in the same replicate. The point forecast stays the curve
    model's; the interval and P(best) are read from the mixture, so where the two forecasters
    disagree the interval spans both (model uncertainty the back-tests of one model do not see)."""

    weight: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 1:
            raise ValueError(f"the trend weight (trend_weight) must be in [0, 1], got {self.weight!r}")
        if not self.scale > 0:
            raise ValueError(f"the trend scale (trend_scale) must be > 0, got {self.scale!r}")


def trend_forecast(sm: StudyMatrix, allocation: str, x_target: float, min_points: int = 3) -> float | None:
    """Logit of the allocation's local trend at ln C = ``x_target``: a straight line in
    (ln C, logit score) through the evaluation points of its longest runs (the runs at its
    largest budget) within the last d of ln C, d = ``x_target`` - their largest ln C (a window
    as long as the reach). Slope: pooled within-run least squares (each run's own offset
    removed, so seeds do not tilt it); level: the points' mean. None with fewer than
    ``min_points`` points in the window, a window of no width, or no reach.

    Where the curve model assumes saturation, the trend assumes the last stretch goes on as it
    went: it is right about curves still rising at a steady or growing rate in logit (power
    laws, log-linear growth) and wrong about curves about to bend; neither is known from the
    pilots alone."""
    idx = _runs_of(sm, allocation)
    if not len(idx):
        return None
    b = sm.runs.loc[idx, "budget"].to_numpy(float)
    idx = idx[b >= b.max() * (1 - 1e-9)]
    pts = sm.points[sm.points["run"].isin(idx).to_numpy()]
    if pts.empty:
        return None
    x = np.log(pts["flops"].to_numpy(float))
    reach = float(x_target - x.max())
    if not reach > 0:
        return None
    win = x >= x.max() - reach
    x, y, run = x[win], logit(pts["score"].to_numpy(float)[win]), pts["run"].to_numpy()[win]
    if len(x) < min_points or np.ptp(x) <= 0:
        return None
    xd, yd = x.copy(), y.copy()
    for r in np.unique(run):
        m = run == r
        xd[m] -= x[m].mean()
        yd[m] -= y[m].mean()
    if not np.sum(xd**2) > 0:
        return None
    slope = float(np.sum(xd * yd) / np.sum(xd**2))
    return float(y.mean() + slope * (x_target - x.mean()))


def check_min_logit_sd(value, owner: str = "") -> float:
    """``value`` as a replicate SD floor in logit (:func:`floor_spread`): a finite int or float
    >= 0 (0: no floor); otherwise a ValueError naming ``owner``.min_logit_sd."""
    if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
        raise ValueError(f"{owner + '.' if owner else ''}min_logit_sd must be a finite number >= 0 (a logit SD, "
                         f"0: no floor), got {value!r}")
    return float(value)


def floor_spread(logits: np.ndarray, points: np.ndarray, min_sd: float) -> np.ndarray:
    """(R, k) logit replicates whose spread is at least ``min_sd``: in each column whose
    replicate SD s (ddof 1, logit of the score) is below ``min_sd``, every replicate's
    deviation from that column's point forecast (``points``, logit) is multiplied by
    ``min_sd`` / s, so the column's SD becomes ``min_sd`` and its centre, order and skew are
    kept; other columns (a column of equal replicates too: it has no shape to stretch), and
    every column when ``min_sd`` is 0, are returned unchanged.

    Why: a forecast whose replicates agree closely (a curve the model pins down: seeds,
    problems and the back-tested extrapolation error all small) is still a forecast of a curve
    family past its data, and the family is what is uncertain at reach. On the tuning
    generator the pick's 95% interval missed 16% of worlds in the narrowest fifth of replicate
    SDs (below 0.21) and 0.3% in the widest (``RacingRule``'s fifth freeze)."""
    min_sd = check_min_logit_sd(min_sd)
    logits = np.asarray(logits, dtype=float)
    if min_sd == 0 or logits.shape[0] < 2:
        return logits
    sd = np.std(logits, axis=0, ddof=1)
    low = (sd < min_sd) & (np.ptp(logits, axis=0) > 0)  # replicates all equal: no shape to stretch
    if not low.any():
        return logits
    out = logits.copy()
    centre = np.asarray(points, dtype=float)[low]
    out[:, low] = centre + (min_sd / sd[low]) * (logits[:, low] - centre)
    return out


def mix_trend(logits: np.ndarray, points: np.ndarray, trends: list[float | None], mix: TrendMix,
              gen: np.random.Generator) -> np.ndarray:
    """(R, k) logit replicates of the mixture (:class:`TrendMix`): in each column with a trend
    forecast t, a share ``mix.weight`` of the replicates (drawn independently per column) become
    t + ``mix.scale`` (replicate - ``points``); the others are kept. No draw when the weight is 0."""
    if mix.weight <= 0 or all(t is None for t in trends):
        return logits
    out = logits.copy()
    pick = gen.random(logits.shape) < mix.weight
    for i, t in enumerate(trends):
        if t is not None:
            out[pick[:, i], i] = t + mix.scale * (logits[pick[:, i], i] - points[i])
    return out


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
