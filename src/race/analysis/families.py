"""Curve families for forecasting a score at a larger budget, fitted by binomial likelihood.

Every family describes the expected score mu(C) of an allocation after C counted FLOPs,
anchored at the measured step-0 score R0 where the family has a start (R0 is data, never
a free parameter). With x = ln C and x_ref = ln (largest pilot FLOPs):

- ``sigmoid``   mu = R0 + alpha * expit(B (x - m))          (ScaleRL form; A = R0 + alpha, C_mid = e^m)
- ``power``     mu = R0 + alpha * exp(beta (x - x_ref))      (gain = alpha (C / C_ref)^beta)
- ``loglinear`` mu = a + b (x - x_ref)                        (straight line in log FLOPs)
- ``quadratic`` mu = a + b (x - x_ref) + c (x - x_ref)^2      (a parabola: can rise then fall)
- ``constant``  mu = c                                        (the recent level: no further change)

Fits maximise the binomial log-likelihood sum_i w_i [y_i ln mu_i + (1 - y_i) ln(1 - mu_i)]
of the evaluation points (y_i = share of problems solved, w_i = problems x seed
multiplicity): the per-problem 0/1 outcomes at one point share mu_i, so this is their
Bernoulli likelihood. The nonlinear parameters (B, m) and beta are searched on a coarse
grid (for the replicates' average data), then refined per replicate by ``ZOOM_LEVELS``
grids of halving spacing around the best point; the linear one (alpha) is solved by
Newton's method inside its box, vectorised over replicates and grid points at once (no
iterative optimiser, so every replicate costs the same and none "fails"). The straight
line, the parabola and the constant are weighted least squares (closed form), scored by
the same binomial deviance.

A fit is *identified* when no parameter sits at the edge of its grid or box: B or m at a
grid edge, A = R0 + alpha at 0 or 1, the midpoint C_mid beyond the data (the asymptote
would be an extrapolation), beta at a grid edge. Unidentified fits never make a forecast.

Which family forecasts is decided on held-out points: each family is fitted on the points
below ``holdout_cut`` of the log-FLOP range and scored by the binomial deviance of the
points above it. Family weights are exp(-0.5 (D_f - D_min) / phi) over the families whose
full-data fit is identified (phi: the dispersion of the best full fit, at least 1); the
point forecast averages the families by weight, each bootstrap replicate draws one family
by weight and adds noise with that family's RMS held-out error scaled to the target's
distance, (x_target - x_max) / (mean held-out x - last fitted x). The saturating curve
thus forecasts only where it beats a constant and a straight line in log FLOPs on points
it has not seen, and the intervals include model choice and extrapolation error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from .bootstrap import as_rng

FAMILIES: tuple[str, ...] = ("constant", "loglinear", "quadratic", "power", "sigmoid")  # simplest first (ties go to it)
EPS = 1e-6
B_GRID = np.geomspace(0.3, 8.0, 9)
BETA_GRID = np.geomspace(0.05, 2.0, 11)
M_STEPS = 13
BOUND_TOL = 1e-3
HOLDOUT_CUT = 0.6
ZOOM_LEVELS = 4
N_PARAMS = {"constant": 1, "loglinear": 2, "quadratic": 3, "power": 2, "sigmoid": 3}


def binomial_deviance(y: np.ndarray, mu: np.ndarray, w: np.ndarray) -> np.ndarray:
    """2 sum_i w_i [y_i ln(y_i / mu_i) + (1 - y_i) ln((1 - y_i) / (1 - mu_i))] over the last axis.

    0 ln 0 = 0; mu is clipped to [1e-6, 1 - 1e-6]. Broadcasts over leading axes.
    """
    mu = np.clip(mu, EPS, 1 - EPS)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = np.where(y > 0, y * np.log(np.where(y > 0, y, 1.0) / mu), 0.0)
        t2 = np.where(y < 1, (1 - y) * np.log(np.where(y < 1, 1 - y, 1.0) / (1 - mu)), 0.0)
    return 2.0 * np.sum(w * (t1 + t2), axis=-1)


def _newton_alpha(h: np.ndarray, y: np.ndarray, w: np.ndarray, r0: np.ndarray, iters: int = 5) -> np.ndarray:
    """argmax over alpha in [-R0, 1 - R0] of the binomial likelihood of mu = R0 + alpha h.

    ``h``: (G, n) or (R, G, n) shapes in [0, 1] (one row per grid point); ``y, w``: (R, n);
    ``r0``: (R,). Returns alpha of shape (R, G). Start: weighted least squares; then Newton
    steps on the concave log-likelihood, clipped to the box (mu stays in [0, 1] as 0 <= h <= 1).
    """
    r0b = r0[:, None, None]
    yb, wb = y[:, None, :], w[:, None, :]
    hb = h if h.ndim == 3 else h[None, :, :]
    lo, hi = -r0[:, None] + EPS, 1 - r0[:, None] - EPS
    wh = wb * hb
    whh = wh * hb
    alpha = np.clip(np.sum(wh * (yb - r0b), axis=-1) / np.maximum(np.sum(whh, axis=-1), 1e-300), lo, hi)
    ny = 1 - yb
    for _ in range(iters):
        mu = np.clip(r0b + alpha[..., None] * hb, EPS, 1 - EPS)
        inv, inv1 = 1 / mu, 1 / (1 - mu)
        grad = np.sum(wh * (yb * inv - ny * inv1), axis=-1)
        curv = np.sum(whh * (yb * inv * inv + ny * inv1 * inv1), axis=-1)
        alpha = np.clip(alpha + grad / np.maximum(curv, 1e-300), lo, hi)
    return alpha


def _best_on_grid(h: np.ndarray, y: np.ndarray, w: np.ndarray, r0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per replicate: (index of the best grid point, its alpha, its deviance)."""
    alpha = _newton_alpha(h, y, w, r0)
    hb = h if h.ndim == 3 else h[None]
    dev = binomial_deviance(y[:, None, :], r0[:, None, None] + alpha[..., None] * hb, w[:, None, :])
    k = np.argmin(dev, axis=1)
    rows = np.arange(len(k))
    return k, alpha[rows, k], dev[rows, k]


def _central_start(h: np.ndarray, y: np.ndarray, w: np.ndarray, r0: np.ndarray) -> int:
    """Best coarse-grid point for the replicates' average data (the start every replicate refines)."""
    sw = np.maximum(w.sum(axis=0, keepdims=True), 1e-300)
    k, _, _ = _best_on_grid(h, (w * y).sum(axis=0, keepdims=True) / sw, w.mean(axis=0, keepdims=True),
                            r0.mean(keepdims=True))
    return int(k[0])


def _zoom(theta: np.ndarray, step: np.ndarray, lo: np.ndarray, hi: np.ndarray, shape_fn, y, w, r0,
          levels: int = ZOOM_LEVELS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Refine grid optima: per replicate, a 5^d grid of half the previous spacing around the
    best point, ``levels`` times. ``theta`` (R, d) start, ``step`` (d,) coarse spacing,
    ``lo/hi`` (d,) box; ``shape_fn(theta (R, G, d)) -> h (R, G, n)``.
    Returns (theta (R, d), alpha (R,), deviance (R,))."""
    d = theta.shape[1]
    offs = np.stack(np.meshgrid(*[np.array([-1.0, -0.5, 0.0, 0.5, 1.0])] * d, indexing="ij"), -1).reshape(-1, d)
    alpha = dev = None
    for level in range(levels):
        cand = np.clip(theta[:, None, :] + offs[None] * (step * 0.5**level)[None, None, :], lo, hi)  # (R, G, d)
        k, alpha, dev = _best_on_grid(shape_fn(cand), y, w, r0)
        theta = cand[np.arange(len(k)), k]
    return theta, alpha, dev


@dataclass
class FamilyFit:
    """One family fitted to R replicates: forecast at the target and identification flags."""

    family: str
    forecast: np.ndarray  # (R,) mu at the target FLOPs, in [0, 1]
    fitted: np.ndarray  # (R, n_eval) mu at the points asked for in ``at``
    identified: np.ndarray  # (R,) no parameter at an edge
    deviance: np.ndarray  # (R,) binomial deviance on the fitted points
    params: dict[str, np.ndarray]


def fit_family(family: str, x: np.ndarray, y: np.ndarray, w: np.ndarray, r0: np.ndarray, x_ref: float,
               x_target: float, at: np.ndarray | None = None) -> FamilyFit:
    """Fit ``family`` to every replicate row of (y, w) at log-FLOPs ``x`` (formulas above).

    ``x``: (n,); ``y, w``: (R, n); ``r0``: (R,) step-0 scores; ``x_ref``: ln C_ref;
    ``x_target``: ln C at which to forecast; ``at``: extra log-FLOPs to evaluate mu at
    (held-out points). Needs >= 2 distinct x for every family but ``constant``.
    """
    if family not in _FITS:
        raise ValueError(f"unknown curve family {family!r}; choose from {FAMILIES}")
    return _FITS[family](x, y, w, r0, x_ref, x_target, np.asarray([] if at is None else at, dtype=float))


def _fit_constant(x, y, w, r0, x_ref, x_target, at) -> FamilyFit:
    """The recent level: the weighted mean of the points at or above the median ln C."""
    recent = x >= np.median(x)
    c = (w[:, recent] * y[:, recent]).sum(axis=1) / np.maximum(w[:, recent].sum(axis=1), 1e-300)
    mu = np.repeat(c[:, None], len(x), axis=1)
    return FamilyFit("constant", c, np.repeat(c[:, None], len(at), axis=1), np.ones(y.shape[0], bool),
                     binomial_deviance(y, mu, w), {"c": c})


def _fit_loglinear(x, y, w, r0, x_ref, x_target, at) -> FamilyFit:
    """A weighted least-squares line in ln C, clipped to [0, 1]."""
    sw = np.maximum(w.sum(axis=1), 1e-300)
    u = x - x_ref
    mu_u = (w * u).sum(axis=1) / sw
    mu_y = (w * y).sum(axis=1) / sw
    suu = (w * (u - mu_u[:, None]) ** 2).sum(axis=1)
    b = np.where(suu > 0, (w * (u - mu_u[:, None]) * (y - mu_y[:, None])).sum(axis=1) / np.maximum(suu, 1e-300), 0.0)
    a = mu_y - b * mu_u
    line = lambda xx: np.clip(a[:, None] + b[:, None] * (np.atleast_1d(xx)[None, :] - x_ref), 0.0, 1.0)  # noqa: E731
    return FamilyFit("loglinear", line(x_target)[:, 0], line(at), suu > 0, binomial_deviance(y, line(x), w),
                     {"a": a, "b": b})


def _fit_quadratic(x, y, w, r0, x_ref, x_target, at) -> FamilyFit:
    """A weighted least-squares parabola in ln C, clipped to [0, 1]; identified with a
    well-conditioned normal matrix and >= 3 distinct ln C."""
    u = x - x_ref
    X = np.stack([np.ones_like(u), u, u * u], axis=1)  # (n, 3)
    A = np.einsum("rn,ni,nj->rij", w, X, X)
    bvec = np.einsum("rn,ni,rn->ri", w, X, y)
    ok = np.abs(np.linalg.det(A)) > 1e-12 * np.maximum(np.einsum("rii->r", A) ** 3, 1e-300)
    coef = np.linalg.solve(A + (~ok)[:, None, None] * np.eye(3), bvec[..., None])[..., 0]  # (R, 3)
    quad = lambda xx: np.clip(coef @ np.stack([np.ones_like(np.atleast_1d(xx)), np.atleast_1d(xx) - x_ref,  # noqa: E731
                                               (np.atleast_1d(xx) - x_ref) ** 2]), 0.0, 1.0)
    return FamilyFit("quadratic", quad(x_target)[:, 0], quad(at), ok & (len(np.unique(x)) >= 3),
                     binomial_deviance(y, quad(x), w), {"coef": coef})


def _fit_power(x, y, w, r0, x_ref, x_target, at) -> FamilyFit:
    """r0 + alpha exp(beta (ln C - ln C_ref)): beta on the grid :data:`BETA_GRID`, zoomed;
    unidentified at the grid's edge or with an asymptote at 0 or 1."""
    lg = np.log(BETA_GRID)
    lo, hi = lg[[0]], lg[[-1]]
    shape = lambda th: np.minimum(np.exp(np.exp(th[..., :1]) * (x - x_ref)), 1.0)  # noqa: E731  (<= 1 on data)
    k = _central_start(shape(lg[:, None]), y, w, r0)
    th, a_k, dev = _zoom(np.repeat(lg[[k]][:, None], len(y), axis=0), np.array([lg[1] - lg[0]]), lo, hi, shape, y, w, r0)
    beta = np.exp(th[:, 0])
    fc = np.clip(r0 + a_k * np.exp(beta * (x_target - x_ref)), 0.0, 1.0)
    fitted = np.clip(r0[:, None] + a_k[:, None] * np.exp(beta[:, None] * (at[None, :] - x_ref)), 0.0, 1.0)
    edge = (th[:, 0] <= lo[0] + 1e-9) | (th[:, 0] >= hi[0] - 1e-9)
    at_box = (np.abs(a_k + r0) < BOUND_TOL) | (np.abs(a_k + r0 - 1) < BOUND_TOL)
    return FamilyFit("power", fc, fitted, ~edge & ~at_box, dev, {"alpha": a_k, "beta": beta})


def _fit_sigmoid(x, y, w, r0, x_ref, x_target, at) -> FamilyFit:
    """r0 + a expit(b (ln C - m)): (ln b, m) on a grid (:data:`B_GRID`, :data:`M_STEPS`
    midpoints around the data), zoomed; unidentified at the grid's edge, with an asymptote
    at 0 or 1, or a midpoint past the data."""
    span = max(float(np.ptp(x)), np.log(4.0))
    m_grid = np.linspace(x.min() - span, x.max() + span, M_STEPS)
    lb_grid = np.log(B_GRID)
    lo, hi = np.array([lb_grid[0], m_grid[0]]), np.array([lb_grid[-1], m_grid[-1]])
    grid = np.stack(np.meshgrid(lb_grid, m_grid, indexing="ij"), -1).reshape(-1, 2)
    shape = lambda th: expit(np.exp(th[..., :1]) * (x - th[..., 1:]))  # noqa: E731
    k = _central_start(shape(grid), y, w, r0)
    step = np.array([lb_grid[1] - lb_grid[0], m_grid[1] - m_grid[0]])
    th, a_k, dev = _zoom(np.repeat(grid[[k]], len(y), axis=0), step, lo, hi, shape, y, w, r0)
    b_k, m_k = np.exp(th[:, 0]), th[:, 1]
    fc = r0 + a_k * expit(b_k * (x_target - m_k))
    fitted = r0[:, None] + a_k[:, None] * expit(b_k[:, None] * (at[None, :] - m_k[:, None]))
    asym = r0 + a_k
    edge = ((th <= lo + 1e-9) | (th >= hi - 1e-9)).any(axis=1)
    edge |= (asym < BOUND_TOL) | (asym > 1 - BOUND_TOL) | (m_k > x.max())
    return FamilyFit("sigmoid", np.clip(fc, 0, 1), np.clip(fitted, 0, 1), ~edge, dev,
                     {"a": asym, "b": b_k, "c_mid": np.exp(m_k)})


#: each family's fit (:func:`fit_family`)
_FITS = {"constant": _fit_constant, "loglinear": _fit_loglinear, "quadratic": _fit_quadratic, "power": _fit_power,
         "sigmoid": _fit_sigmoid}


@dataclass
class Forecast:
    """Per-replicate forecasts of one allocation and how each was made."""

    forecast: np.ndarray  # (R,) chosen family's forecast
    family: np.ndarray  # (R,) index into ``families``
    families: tuple[str, ...]
    bound_hits: dict[str, float]  # share of replicates whose full-data fit of a family is unidentified
    holdout: dict[str, float]  # mean held-out deviance per family (over replicates where it was scored)
    selected_by_holdout: bool  # False when too few points to hold any out

    def share(self, family: str) -> float:
        return float(np.mean(self.family == self.families.index(family))) if family in self.families else 0.0


def select_and_forecast(x: np.ndarray, y: np.ndarray, w: np.ndarray, r0: np.ndarray, x_target: float,
                        families: tuple[str, ...] = FAMILIES, holdout_cut: float = HOLDOUT_CUT,
                        rng: np.random.Generator | int | None = 0, average: bool = False,
                        extrapolation_noise: bool = True) -> Forecast:
    """Weigh the families on held-out points and forecast (module docstring).

    Points with ln C above ``x.min() + holdout_cut * ptp(x)`` are held out. Without >= 3
    fitting points at >= 2 FLOP levels and >= 1 held-out point, the weights use the
    in-sample deviance plus 2 per parameter (AIC-like) and no extrapolation noise is added.
    One replicate row (or ``average=True``): the weight-averaged forecast; several rows:
    one family drawn per row by weight (``rng``), plus its held-out extrapolation noise
    unless ``extrapolation_noise=False`` (the recommendation adds the study's back-tested
    error instead: :mod:`race.analysis.backtest`).
    """
    asked = tuple(families)
    families = tuple(f for f in FAMILIES if f in asked)
    if not families:
        raise ValueError(f"no known family among {asked}; choose from {FAMILIES}")
    x_ref = float(x.max())
    R = y.shape[0]
    distinct = len(np.unique(x)) >= 2
    usable = [f for f in families if f == "constant" or distinct]
    if not usable:
        usable = ["constant"]
    cut = x.min() + holdout_cut * np.ptp(x)
    train, test = x <= cut, x > cut
    can_hold = train.sum() >= 3 and len(np.unique(x[train])) >= 2 and test.sum() >= 1
    full = {f: fit_family(f, x, y, w, r0, x_ref, x_target) for f in usable}
    score, miss, holdout = _holdout_scores(full, x, y, w, r0, x_ref, x_target, (train, test) if can_hold else None)
    weights = _family_weights(score, full, len(x))
    forecasts = np.stack([full[f].forecast for f in usable], axis=1)
    if R == 1 or average:
        fc = (weights * forecasts).sum(axis=1)
        choice = np.argmax(weights, axis=1)
    else:  # one family per replicate, drawn by its weight: model uncertainty enters the interval
        u = as_rng(rng).random(R)[:, None]
        choice = np.minimum((np.cumsum(weights, axis=1) < u).sum(axis=1), len(usable) - 1)
        fc = forecasts[np.arange(R), choice]
        if can_hold and extrapolation_noise:  # the chosen family's own held-out error, scaled to the target's distance
            reach = max(x_target - x_ref, 0.0) / max(float(x[test].mean() - x[train].max()), 1e-3)
            rms = np.sqrt(np.mean(miss**2, axis=0))  # each family's typical held-out error over replicates
            sd = rms[choice] * reach
            fc = np.clip(fc + sd * as_rng(rng).standard_normal(R), 0.0, 1.0)
    idx = np.array([families.index(usable[c]) for c in choice])
    bound_hits = {f: float(np.mean(~full[f].identified)) for f in usable if f in ("power", "sigmoid")}
    return Forecast(forecast=fc, family=idx, families=families, bound_hits=bound_hits, holdout=holdout,
                    selected_by_holdout=bool(can_hold))


def _holdout_scores(full: dict[str, FamilyFit], x: np.ndarray, y: np.ndarray, w: np.ndarray, r0: np.ndarray,
                    x_ref: float, x_target: float, split: tuple[np.ndarray, np.ndarray] | None,
                    ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Per replicate and family: (its score, inf where its full fit is unidentified; its mean
    held-out error, prediction - observed; per family the mean held-out deviance). With
    ``split`` (the masks of the fitting and the held-out points) the score is the held-out
    deviance; without, the in-sample deviance plus 2 per parameter (AIC-like: nothing can be
    held out)."""
    usable = list(full)
    R = y.shape[0]
    score = np.full((R, len(usable)), np.inf)
    miss = np.zeros((R, len(usable)))  # held-out error (prediction - observed) per family
    holdout: dict[str, float] = {}
    for j, f in enumerate(usable):
        if split is not None:
            train, test = split
            part = fit_family(f, x[train], y[:, train], w[:, train], r0, x_ref, x_target, at=x[test])
            d = binomial_deviance(y[:, test], part.fitted, w[:, test])
            wt = w[:, test]
            miss[:, j] = (wt * (part.fitted - y[:, test])).sum(axis=1) / np.maximum(wt.sum(axis=1), 1e-300)
            ok = full[f].identified  # held-out skill scores the procedure; identification gates the forecast
            holdout[f] = float(np.mean(d))
        else:
            d = full[f].deviance + 2.0 * N_PARAMS[f]  # AIC-like penalty when nothing can be held out
            ok = full[f].identified
        score[:, j] = np.where(ok, d, np.inf)
    return score, miss, holdout


def _family_weights(score: np.ndarray, full: dict[str, FamilyFit], n_points: int) -> np.ndarray:
    """(R, families) quasi-likelihood weights: deviance differences scaled by the dispersion
    phi of the best full fit (seed noise makes points vary more than binomially),
    exp(-0.5 delta / phi), normalised per replicate."""
    usable = list(full)
    n_par = np.array([N_PARAMS[f] for f in usable])
    full_dev = np.stack([full[f].deviance for f in usable], axis=1) / np.maximum(n_points - n_par, 1)[None, :]
    phi = np.maximum(np.min(np.where(np.isfinite(score), full_dev, np.inf), axis=1), 1.0)  # (R,)
    rel = (score - score.min(axis=1, keepdims=True)) / phi[:, None]
    weights = np.where(np.isfinite(score), np.exp(-0.5 * np.where(np.isfinite(rel), rel, 0.0)), 0.0)
    weights /= weights.sum(axis=1, keepdims=True)  # "constant" is always identified: a finite row
    return weights
