"""IsoFLOP profiles: score against model size at a fixed budget.

At one budget (and condition), each model size N_k gets the best seed-mean score over the
allocations of that size, y_k = max_a mean_seeds score(N_k, a). With x = ln N a quadratic

    y = c2 x^2 + c1 x + c0

is fitted when there are >= 3 sizes; if c2 < 0 its vertex x* = -c1 / (2 c2) is the
optimum size N* = exp(x*). The interval on N* comes from a joint bootstrap over seeds
(whole runs resampled within each (size, allocation) cell) and evaluation problems (one
draw shared by every run), y_k re-selected and the parabola refitted, PLUS the parabola's
own parameter uncertainty: with n > 3 sizes, each replicate's coefficients get a draw from
N(0, s^2 (X'X)^-1), s^2 = RSS / (n - 3) the residual variance of the point fit (the profile
need not be a parabola; the residuals say by how much).

With exactly 3 sizes the parabola passes through the three points: nothing measures how
wrong the parabola is, so the vertex is NOT located. When the middle size scores best the
optimum is **bracketed** between the smallest and the largest size (``located=False``,
``ci_low/ci_high`` = that bracket, ``opt_score`` left out: a parabola's peak above every
observation is not data). Warnings say when the parabola opens upward (no interior
optimum), when the vertex lies outside the sizes tried, or when it lies in the outer
half-interval next to an edge size (the grid is not centred on it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from .bootstrap import as_rng, bootstrap_cells
from .curves import final_scores
from .frontier import group_cols
from .tables import require_columns, without_controls


@dataclass
class IsoFLOPFit:
    """Quadratic-in-log-size fit at one budget; parameter counts in ``*_params``."""

    budget: float
    condition: str | None
    sizes: list[float]
    scores: list[float]
    coef: list[float] | None  # [c2, c1, c0] of y = c2 (ln N)^2 + c1 ln N + c0
    opens_upward: bool | None
    opt_params: float | None
    ci_low: float | None
    ci_high: float | None
    opt_score: float | None
    frac_valid: float | None  # share of bootstrap replicates with a maximum (c2 < 0)
    level: float
    warnings: list[str] = field(default_factory=list)
    located: bool | None = None  # False: 3 sizes bracket the optimum but cannot locate it

    @property
    def n_sizes(self) -> int:
        return len(self.sizes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["n_sizes"] = self.n_sizes
        return d


def _vertex(coef: np.ndarray) -> np.ndarray:
    """x* = -c1 / (2 c2) where c2 < 0, else NaN (columns of coef are fits)."""
    c2, c1 = coef[0], coef[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(c2 < 0, -c1 / (2 * c2), np.nan)


def fit_isoflop(
    finals: pd.DataFrame,
    n_boot: int = 500,
    rng: np.random.Generator | int | None = 0,
    level: float = 0.95,
    over: tuple[str, ...] = ("seeds", "problems"),
    condition: str | None = None,
) -> IsoFLOPFit:
    """Fit the isoFLOP parabola to per-run rows of ONE budget (see module docstring).

    ``finals`` needs ``budget, model_params, allocation, run_id, score``. ``over``
    chooses the bootstrap (add ``"problems"`` to resample evaluation problems too).
    """
    require_columns(finals, ["budget", "model_params", "allocation", "run_id", "score"], "finals")
    budgets = finals["budget"].unique()
    if len(budgets) != 1:
        raise ValueError(f"fit_isoflop takes one budget, got {len(budgets)}; use isoflop_table")
    budget = float(budgets[0])
    sizes, point, reps = _best_per_size(finals, n_boot, rng, over)
    warnings: list[str] = []
    base = dict(budget=budget, condition=condition, sizes=[float(s) for s in sizes],
                scores=[float(v) for v in point], level=level)
    if len(sizes) < 3:
        warnings.append(f"only {len(sizes)} model size(s): a parabola needs >= 3")
        return IsoFLOPFit(coef=None, opens_upward=None, opt_params=None, ci_low=None, ci_high=None,
                          opt_score=None, frac_valid=None, warnings=warnings, **base)
    x = np.log(sizes)
    coef = np.polyfit(x, point, 2)
    rep_vertex = _vertex(_replicate_coefs(x, point, reps, coef, rng))
    valid = np.isfinite(rep_vertex)
    frac_valid = float(valid.mean()) if len(rep_vertex) else 0.0
    opens_upward = bool(coef[0] >= 0)
    q = (1 - level) / 2
    ci_low = ci_high = None
    if valid.sum() >= 2:
        ci_low, ci_high = (float(np.exp(v)) for v in np.quantile(rep_vertex[valid], [q, 1 - q]))
    if frac_valid < 0.9:
        warnings.append(f"only {frac_valid:.0%} of bootstrap replicates have a maximum: the optimum is poorly determined")
    opt_params, opt_score = _optimum(coef, x, sizes, point, warnings)
    located = None if opt_params is None else len(sizes) > 3
    if opt_params is not None and len(sizes) == 3:
        if point[1] > max(point[0], point[2]):
            ci_low, ci_high = float(sizes[0]), float(sizes[-1])
            warnings.append(f"bracketed between {sizes[0]:.3g} and {sizes[-1]:.3g}, not located: three sizes give a "
                            "parabola through three points, which cannot say where between them the optimum lies "
                            "(add sizes between them)")
        else:
            warnings.append("three sizes give a parabola through three points: its vertex is not located")
        opt_score = None
    return IsoFLOPFit(coef=[float(c) for c in coef], opens_upward=opens_upward, opt_params=opt_params,
                      ci_low=ci_low, ci_high=ci_high, opt_score=opt_score, frac_valid=frac_valid,
                      warnings=warnings, located=located, **base)


def _best_per_size(finals: pd.DataFrame, n_boot: int, rng: np.random.Generator | int | None,
                   over: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(model sizes ascending, the best allocation's score per size, (n_boot, n_sizes) its
    bootstrap replicates: the best cell of each size in each replicate)."""
    bs = bootstrap_cells(finals, ("model_params", "allocation"), n_boot=n_boot, rng=rng, over=over)
    sizes = np.sort(bs.cells["model_params"].unique())
    cols = [np.flatnonzero(bs.cells["model_params"].to_numpy() == s) for s in sizes]
    point = np.array([bs.cells["score"].to_numpy()[c].max() for c in cols])
    reps = np.column_stack([bs.reps[:, c].max(axis=1) for c in cols])  # (n_boot, n_sizes)
    return sizes, point, reps


def _replicate_coefs(x: np.ndarray, point: np.ndarray, reps: np.ndarray, coef: np.ndarray,
                     rng: np.random.Generator | int | None) -> np.ndarray:
    """(3, n_boot) parabola coefficients of the replicates; with more than three sizes each
    gets the parabola's own misfit too (a normal draw with residual covariance s^2 (X'X)^-1)."""
    rep_coef = np.polyfit(x, reps.T, 2)  # (3, n_boot)
    if len(x) > 3:  # the parabola's own misfit: residual variance s^2 (X'X)^-1 on every replicate
        X = np.vander(x, 3)
        s2 = float(np.sum((point - X @ coef) ** 2) / (len(x) - 3))
        cov = s2 * np.linalg.inv(X.T @ X)
        rep_coef = rep_coef + as_rng(rng).multivariate_normal(np.zeros(3), cov, size=rep_coef.shape[1]).T
    return rep_coef


def _optimum(coef: np.ndarray, x: np.ndarray, sizes: np.ndarray, point: np.ndarray,
             warnings: list[str]) -> tuple[float | None, float | None]:
    """(N*, the parabola's score there), None for both when it opens upward; appends to
    ``warnings`` what is wrong with where N* lies (outside the grid, at its edge)."""
    if coef[0] >= 0:
        edge = "largest" if point[-1] >= point[0] else "smallest"
        warnings.append(f"parabola opens upward (no interior optimum): the {edge} size scores best; "
                        f"extend the grid beyond it")
        return None, None
    xv = float(_vertex(coef))
    opt_params, opt_score = float(np.exp(xv)), float(np.polyval(coef, xv))
    if xv < x[0] or xv > x[-1]:
        side = "below the smallest" if xv < x[0] else "above the largest"
        warnings.append(f"optimum N*={opt_params:.3g} lies outside the grid ({side} size "
                        f"{sizes[0] if xv < x[0] else sizes[-1]:.3g}): extend the grid")
    elif xv < (x[0] + x[1]) / 2 or xv > (x[-2] + x[-1]) / 2:
        warnings.append(f"optimum N*={opt_params:.3g} is at the edge of the grid: the grid is not "
                        f"centred on it")
    return opt_params, opt_score


def isoflop_table(
    evals: pd.DataFrame,
    runs: pd.DataFrame,
    target: str,
    condition_on: str | None = "reward_system",
    at: str = "equal",
    n_boot: int = 500,
    rng: np.random.Generator | int | None = 0,
    level: float = 0.95,
    exclude_random: bool = True,
) -> pd.DataFrame:
    """:func:`fit_isoflop` at every (budget, condition); one row per fit.

    Columns: ``budget, condition, n_sizes, opt_params, ci_low, ci_high, opt_score,
    opens_upward, frac_valid, coef, sizes, scores, level, located, warnings`` (warnings joined by "; ",
    empty when none). One generator is consumed in sorted (budget, condition) order.
    """
    group = group_cols(condition_on)
    finals = final_scores(evals, runs, target, at=at)
    if exclude_random:
        finals = without_controls(finals)
    gen = as_rng(rng)
    rows = []
    for key, g in finals.groupby(["budget", *group], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        cond = str(key[1]) if group else None
        fit = fit_isoflop(g, n_boot=n_boot, rng=gen, level=level, condition=cond)
        d = fit.to_dict()
        d["warnings"] = "; ".join(fit.warnings)
        rows.append(d)
    cols = ["budget", "condition", "n_sizes", "opt_params", "ci_low", "ci_high", "opt_score", "opens_upward",
            "frac_valid", "coef", "sizes", "scores", "level", "located", "warnings"]
    return pd.DataFrame(rows, columns=cols)


def optimal_size_trend(table: pd.DataFrame) -> dict:
    """Least-squares fit ln N*(C) = a ln C + b over budgets with an interior vertex.

    ``table``: output of :func:`isoflop_table` (one condition). Returns ``{"exponent": a,
    "intercept": b, "n_budgets": k}``; a and b are NaN with fewer than 2 usable budgets.
    """
    require_columns(table, ["budget", "opt_params"], "isoflop table")
    ok = table["opt_params"].notna()
    k = int(ok.sum())
    if k < 2:
        return {"exponent": float("nan"), "intercept": float("nan"), "n_budgets": k}
    a, b = np.polyfit(np.log(table.loc[ok, "budget"].astype(float)), np.log(table.loc[ok, "opt_params"].astype(float)), 1)
    return {"exponent": float(a), "intercept": float(b), "n_budgets": k}
