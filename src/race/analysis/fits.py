"""Saturating compute curves (ScaleRL form) fitted by variable projection.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

R0 is the score at C -> 0, A the asymptote at C -> inf, C_mid the compute at which half
the gain is reached and B > 0 the steepness. With f(C) = 1 / (1 + exp(B (ln C_mid - ln C)))
the model is R = R0 (1 - f) + A f, linear in (R0, A) for fixed (B, ln C_mid). Variable
projection therefore solves (R0, A) in closed form (least squares on two columns, then
clipped to the box ``bounds`` exactly: a convex quadratic on a box has its minimum inside
or at the 1-D minimum of an edge) and optimises only (ln B, ln C_mid): a coarse grid of
starts, the best few refined by bounded Nelder-Mead. (Nelder-Mead, not L-BFGS-B: in
two dimensions it reaches the same optimum, and scipy's L-BFGS-B spends most of its time
in multi-threaded BLAS calls on 2-vectors, 3-4x slower on a busy 2-core machine.)

When the data end before C_mid (max C < C_mid) the asymptote A is an extrapolation:
``A_identified`` is then False.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike
import pandas as pd
from scipy.optimize import minimize
from scipy.special import expit

from .bootstrap import as_rng
from .tables import require_columns

DEFAULT_BOUNDS = (0.0, 1.0)
B_RANGE = (0.05, 20.0)


def saturating_curve(c: np.ndarray | float, r0: ArrayLike, a: ArrayLike, b: ArrayLike, c_mid: ArrayLike) -> np.ndarray:
    """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), evaluated stably in log space.

    Parameters may be arrays (one value per bootstrap replicate): they broadcast with C.
    """
    u = np.log(np.asarray(c, dtype=float))
    return r0 + (a - r0) * expit(b * (u - np.log(c_mid)))


def _linear_box(f: np.ndarray, y: np.ndarray, bounds: tuple[float, float] | None) -> tuple[float, float, float]:
    """min over (r0, a) in the box of ||y - r0 (1 - f) - a f||^2 -> (r0, a, rss)."""
    g = 1.0 - f
    gg, gf, ff = g @ g, g @ f, f @ f
    gy, fy = g @ y, f @ y
    det = gg * ff - gf * gf

    def rss(r0: float, a: float) -> float:
        r = y - r0 * g - a * f
        return float(r @ r)

    if det > 1e-12 * max(gg * ff, 1e-300):
        r0 = (ff * gy - gf * fy) / det
        a = (gg * fy - gf * gy) / det
    else:  # f (nearly) constant: only one combination is determined
        r0 = a = float(np.mean(y))
    if bounds is None:
        return float(r0), float(a), rss(r0, a)
    lo, hi = bounds
    if lo <= r0 <= hi and lo <= a <= hi:
        return float(r0), float(a), rss(r0, a)
    cands = []
    for r0_fixed in (lo, hi):
        a_c = float(np.clip((fy - r0_fixed * gf) / ff, lo, hi)) if ff > 0 else lo
        cands.append((r0_fixed, a_c))
    for a_fixed in (lo, hi):
        r_c = float(np.clip((gy - a_fixed * gf) / gg, lo, hi)) if gg > 0 else lo
        cands.append((r_c, a_fixed))
    best = min(cands, key=lambda p: rss(*p))
    return float(best[0]), float(best[1]), rss(*best)


@dataclass
class SaturatingFit:
    """Fitted R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) and how well it is determined."""

    r0: float
    a: float
    b: float
    c_mid: float
    rss: float
    rmse: float
    n_points: int
    c_min: float
    c_max: float
    A_identified: bool
    success: bool

    def predict(self, c: np.ndarray | float) -> np.ndarray:
        """R(C) at the given compute levels."""
        return saturating_curve(c, self.r0, self.a, self.b, self.c_mid)

    def to_dict(self) -> dict:
        return {k: (bool(v) if isinstance(v, (bool, np.bool_)) else v) for k, v in asdict(self).items()}


def fit_saturating(
    flops: Sequence[float],
    scores: Sequence[float],
    bounds: tuple[float, float] | None = DEFAULT_BOUNDS,
    n_refine: int = 4,
    start: tuple[float, float] | None = None,
    xatol: float = 1e-7,
) -> SaturatingFit:
    """Fit the saturating curve to points (C_i, R_i) by variable projection.

    Minimises sum_i (R_i - R(C_i))^2. (R0, A) are solved in closed form inside ``bounds``
    (``None`` for unbounded); (B, ln C_mid) start from a grid of 6 x 9 values (B in
    [0.2, 5], ln C_mid from one log-span below to one above the data), the ``n_refine``
    best refined by bounded Nelder-Mead with B in [0.05, 20] and ln C_mid within 3 log-spans of the
    data. ``start=(B, C_mid)`` replaces the grid by that single start (warm starts for
    bootstraps). ``xatol``: Nelder-Mead's tolerance on (ln B, ln C_mid); bootstrap
    replicates use 1e-4 (their spread is what matters, and it is orders of magnitude
    wider). Points with C <= 0 are dropped (log compute is undefined there).
    """
    c = np.asarray(flops, dtype=float)
    y = np.asarray(scores, dtype=float)
    ok = np.isfinite(c) & np.isfinite(y) & (c > 0)
    c, y = c[ok], y[ok]
    if len(c) < 4:
        raise ValueError(f"need at least 4 points with C > 0 to fit 4 parameters, got {len(c)}")
    u = np.log(c)
    u_min, u_max = float(u.min()), float(u.max())
    span = max(u_max - u_min, 1.0)
    lcm_bounds = (u_min - 3 * span, u_max + 3 * span)
    lb_bounds = (np.log(B_RANGE[0]), np.log(B_RANGE[1]))

    def objective(theta: np.ndarray) -> float:
        f = expit(np.exp(theta[0]) * (u - theta[1]))
        return _linear_box(f, y, bounds)[2]

    starts = _starts(objective, start, (u_min - span, u_max + span), lcm_bounds, n_refine)
    best_theta, best_val, success = starts[0], objective(starts[0]), False
    for s in starts:
        res = minimize(objective, s, method="Nelder-Mead", bounds=[lb_bounds, lcm_bounds],
                       options={"xatol": xatol, "fatol": 1e-13 if xatol <= 1e-7 else 1e-10, "maxiter": 2000})
        if res.fun < best_val - 1e-15 or (not success and res.success and res.fun <= best_val):
            best_theta, best_val, success = res.x, float(res.fun), bool(res.success)
    b = float(np.exp(best_theta[0]))
    lcm = float(best_theta[1])
    r0, a, rss = _linear_box(expit(b * (u - lcm)), y, bounds)
    c_mid = float(np.exp(lcm))
    return SaturatingFit(
        r0=r0, a=a, b=b, c_mid=c_mid, rss=rss, rmse=float(np.sqrt(rss / len(y))),
        n_points=int(len(y)), c_min=float(c.min()), c_max=float(c.max()),
        A_identified=bool(c.max() >= c_mid), success=success,
    )


def _starts(objective: Callable[[np.ndarray], float], start: tuple[float, float] | None,
            lcm_range: tuple[float, float], lcm_bounds: tuple[float, float], n_refine: int) -> list[np.ndarray]:
    """Nelder-Mead's starts in (ln B, ln C_mid): ``start`` (clipped into the bounds) alone,
    else the ``n_refine`` best of a 6 x 9 grid (B in [0.2, 5], ln C_mid across ``lcm_range``)."""
    if start is not None:
        return [np.array([np.log(np.clip(start[0], *B_RANGE)), np.clip(np.log(start[1]), *lcm_bounds)])]
    grid = [
        np.array([lb, lcm])
        for lb in np.log(np.geomspace(0.2, 5.0, 6))
        for lcm in np.linspace(*lcm_range, 9)
    ]
    vals = np.array([objective(t) for t in grid])
    return [grid[i] for i in np.argsort(vals, kind="mergesort")[:n_refine]]


#: Nelder-Mead tolerance of bootstrap replicate fits (see ``fit_saturating``).
REPLICATE_XATOL = 1e-4


@dataclass
class SaturatingFitCI:
    """A point fit plus bootstrap percentile intervals over whole runs (seeds)."""

    fit: SaturatingFit
    intervals: dict[str, tuple[float, float]]
    reps: pd.DataFrame
    level: float

    def predict_interval(self, c: float) -> tuple[float, float, float]:
        """(point, lo, hi) of R(c) over the bootstrap replicates."""
        r = self.reps.dropna()
        preds = saturating_curve(c, r["r0"].to_numpy(), r["a"].to_numpy(), r["b"].to_numpy(), r["c_mid"].to_numpy())
        q = (1 - self.level) / 2
        return float(self.fit.predict(c)), float(np.quantile(preds, q)), float(np.quantile(preds, 1 - q))

    def to_dict(self) -> dict:
        return {"fit": self.fit.to_dict(), "level": self.level,
                "intervals": {k: [float(v[0]), float(v[1])] for k, v in self.intervals.items()}}


def bootstrap_saturating(
    curves: pd.DataFrame,
    n_boot: int = 200,
    rng: np.random.Generator | int | None = 0,
    level: float = 0.95,
    strata: Sequence[str] = (),
    bounds: tuple[float, float] | None = DEFAULT_BOUNDS,
) -> SaturatingFitCI:
    """Fit pooled curves, then refit on runs resampled with replacement (whole runs).

    ``curves`` has ``run_id, flops, score`` (one row per evaluation point); ``strata``
    columns (e.g. ``budget``) resample runs within each stratum. Replicates start from
    the point fit (warm start). Intervals are percentiles of the replicate parameters.
    """
    require_columns(curves, ["run_id", "flops", "score", *strata], "curves")
    gen = as_rng(rng)
    fit = fit_saturating(curves["flops"], curves["score"], bounds=bounds)
    by_run = {rid: g[["flops", "score"]].to_numpy(float) for rid, g in curves.groupby("run_id", sort=True)}
    if strata:
        strat = curves.drop_duplicates("run_id").sort_values("run_id", kind="mergesort")
        groups = [list(g["run_id"]) for _, g in strat.groupby(list(strata), sort=True)]
    else:
        groups = [sorted(by_run)]
    rows = []
    for _ in range(n_boot):
        picked = [ids[i] for ids in groups for i in gen.integers(0, len(ids), size=len(ids))]
        sample = np.concatenate([by_run[r] for r in picked])
        try:
            rep = fit_saturating(sample[:, 0], sample[:, 1], bounds=bounds, start=(fit.b, fit.c_mid),
                                 xatol=REPLICATE_XATOL)
        except ValueError:  # too few points in this resample: keep the row count, mark it
            rows.append(dict(r0=np.nan, a=np.nan, b=np.nan, c_mid=np.nan))
            continue
        rows.append(dict(r0=rep.r0, a=rep.a, b=rep.b, c_mid=rep.c_mid))
    reps = pd.DataFrame(rows, columns=["r0", "a", "b", "c_mid"])
    q = (1 - level) / 2
    ok = reps.dropna()
    intervals = {k: (float(ok[k].quantile(q)), float(ok[k].quantile(1 - q))) for k in reps.columns}
    return SaturatingFitCI(fit=fit, intervals=intervals, reps=reps, level=level)


def fit_curves(curves: pd.DataFrame, by: Sequence[str] = ("allocation",), bounds: tuple[float, float] | None = DEFAULT_BOUNDS) -> pd.DataFrame:
    """One pooled saturating fit per group of ``curves`` (e.g. per allocation).

    Returns columns ``by..., r0, a, b, c_mid, rss, rmse, n_points, c_min, c_max,
    A_identified, success``; groups with fewer than 4 points get NaN parameters.
    """
    by = list(by)
    require_columns(curves, [*by, "flops", "score"], "curves")
    rows = []
    for key, g in curves.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        try:
            row.update(fit_saturating(g["flops"], g["score"], bounds=bounds).to_dict())
        except ValueError:
            row.update(n_points=len(g), A_identified=False, success=False)
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass
class HoldoutResult:
    """Out-of-sample check of a curve fit: fit on early compute, predict the rest."""

    fit_fraction: float
    cutoff_flops: float
    n_fit: int
    n_test: int
    rmse: float
    mae: float
    max_abs_error: float
    bias: float
    baseline_rmse: float
    A_identified: bool

    def to_dict(self) -> dict:
        return asdict(self)


def holdout_check(
    flops: Sequence[float],
    scores: Sequence[float],
    fit_fraction: float = 0.5,
    bounds: tuple[float, float] | None = DEFAULT_BOUNDS,
) -> HoldoutResult:
    """Fit on points with ln C in the first ``fit_fraction`` of the log-compute range,
    predict the later points and report their errors.

    rmse/mae/max_abs_error/bias (mean of prediction - observation) are over the held-out
    points; ``baseline_rmse`` is the rmse of carrying the mean score of the last quarter
    of fitted points forward (a fit worth using beats it).
    """
    if not 0 < fit_fraction < 1:
        raise ValueError("fit_fraction must be in (0, 1)")
    c = np.asarray(flops, dtype=float)
    y = np.asarray(scores, dtype=float)
    ok = (c > 0) & np.isfinite(y)
    c, y = c[ok], y[ok]
    u = np.log(c)
    cut_u = u.min() + fit_fraction * (u.max() - u.min())
    train = u <= cut_u
    test = ~train
    if train.sum() < 4 or test.sum() < 1:
        raise ValueError(f"holdout needs >= 4 fitting and >= 1 held-out points, got {train.sum()} and {test.sum()}")
    fit = fit_saturating(c[train], y[train], bounds=bounds)
    err = fit.predict(c[test]) - y[test]
    order = np.argsort(c[train], kind="mergesort")
    tail = y[train][order][-max(1, int(train.sum()) // 4):]
    base = tail.mean() - y[test]
    return HoldoutResult(
        fit_fraction=float(fit_fraction), cutoff_flops=float(np.exp(cut_u)),
        n_fit=int(train.sum()), n_test=int(test.sum()),
        rmse=float(np.sqrt(np.mean(err**2))), mae=float(np.mean(np.abs(err))),
        max_abs_error=float(np.max(np.abs(err))), bias=float(np.mean(err)),
        baseline_rmse=float(np.sqrt(np.mean(base**2))), A_identified=fit.A_identified,
    )
