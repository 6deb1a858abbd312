"""Scaling-law fit on a known answer: Chinchilla's L(N, D) = E + A / N^alpha + B / D^beta.

Recipe of Hoffmann et al. (2022) Approach 3 as refitted by Besiroglu et al. (2024, Epoch):

- D = C / (6 N) tokens from training FLOPs C and parameters N;
- drop the ``drop_highest`` (5) highest-loss runs;
- log-sum-exp parameterisation: with a = ln A, b = ln B, e = ln E,
      ln L_hat = LSE(a - alpha ln N, b - beta ln D, e);
- objective: sum_i Huber_delta(ln L_hat_i - ln L_i), delta = 1e-3, SUMMED (the mean
  makes L-BFGS stop early);
- starts: the grid alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ..., 1},
  a, b in {0, 5, ..., 25}; the objective is evaluated at every grid point and the
  ``n_refine`` best are refined by L-BFGS-B (analytic gradient); the best result wins.

The compute-optimal size then grows as N* ~ C^a_exp with a_exp = beta / (alpha + beta)
(and D* ~ C^(alpha / (alpha + beta))).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import product

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import logsumexp

from .bootstrap import as_rng
from .tables import require_columns

HOFFMANN_GRID = {
    "a": np.arange(0.0, 25.1, 5.0),
    "b": np.arange(0.0, 25.1, 5.0),
    "e": np.arange(-1.0, 1.01, 0.5),
    "alpha": np.arange(0.0, 2.01, 0.5),
    "beta": np.arange(0.0, 2.01, 0.5),
}


def huber(r: np.ndarray, delta: float) -> np.ndarray:
    """Huber loss: r^2 / 2 for |r| <= delta, else delta (|r| - delta / 2)."""
    ar = np.abs(r)
    return np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))


def _objective(theta: np.ndarray, ln_n: np.ndarray, ln_d: np.ndarray, ln_l: np.ndarray, delta: float) -> tuple[float, np.ndarray]:
    """Summed Huber objective and its gradient in theta = (a, b, e, alpha, beta)."""
    a, b, e, alpha, beta = theta
    terms = np.stack([a - alpha * ln_n, b - beta * ln_d, np.full_like(ln_n, e)])
    lse = logsumexp(terms, axis=0)
    r = lse - ln_l
    w = np.exp(terms - lse)  # softmax weights, d lse / d term
    psi = np.clip(r, -delta, delta)  # d huber / d r
    grad = np.array([
        np.sum(psi * w[0]),
        np.sum(psi * w[1]),
        np.sum(psi * w[2]),
        np.sum(psi * w[0] * -ln_n),
        np.sum(psi * w[1] * -ln_d),
    ])
    return float(np.sum(huber(r, delta))), grad


@dataclass
class ChinchillaFit:
    """Fitted L(N, D) = E + A / N^alpha + B / D^beta; ``a_exp`` = beta / (alpha + beta)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    a_exp: float
    b_exp: float
    objective: float
    n_used: int
    n_starts: int
    success: bool

    def predict(self, n: np.ndarray | float, d: np.ndarray | float) -> np.ndarray:
        """L(N, D)."""
        return self.E + self.A / np.asarray(n, float) ** self.alpha + self.B / np.asarray(d, float) ** self.beta

    def to_dict(self) -> dict:
        return asdict(self)


def _prepare(df: pd.DataFrame, params_col: str, flops_col: str, loss_col: str, drop_highest: int):
    require_columns(df, [params_col, flops_col, loss_col], "scaling runs")
    d = df[[params_col, flops_col, loss_col]].astype(float).dropna()
    if drop_highest:
        d = d.sort_values(loss_col, kind="mergesort").iloc[: len(d) - drop_highest]
    n = d[params_col].to_numpy()
    tokens = d[flops_col].to_numpy() / (6.0 * n)
    return np.log(n), np.log(tokens), np.log(d[loss_col].to_numpy())


def fit_chinchilla(
    df: pd.DataFrame,
    params_col: str = "params",
    flops_col: str = "train_flops",
    loss_col: str = "loss",
    drop_highest: int = 5,
    delta: float = 1e-3,
    grid: dict[str, np.ndarray] | None = None,
    n_refine: int = 10,
) -> ChinchillaFit:
    """Fit L(N, D) with D = C / (6N) by the recipe in the module docstring.

    ``grid`` maps each of a, b, e, alpha, beta to its start values (default: the
    Hoffmann/Epoch grid, 4,500 starts screened, ``n_refine`` refined).
    """
    ln_n, ln_d, ln_l = _prepare(df, params_col, flops_col, loss_col, drop_highest)
    grid = HOFFMANN_GRID if grid is None else grid
    starts = np.array(list(product(grid["a"], grid["b"], grid["e"], grid["alpha"], grid["beta"])))
    # Screen every start at once: objective at each grid point (batched to bound memory).
    vals = np.empty(len(starts))
    for i in range(0, len(starts), 512):
        s = starts[i:i + 512]
        terms = np.stack([s[:, [0]] - s[:, [3]] * ln_n, s[:, [1]] - s[:, [4]] * ln_d,
                          np.broadcast_to(s[:, [2]], (len(s), len(ln_n)))])
        vals[i:i + 512] = huber(logsumexp(terms, axis=0) - ln_l, delta).sum(axis=1)
    order = np.argsort(vals, kind="mergesort")[:n_refine]
    best = None
    for s in starts[order]:
        res = minimize(_objective, s, args=(ln_n, ln_d, ln_l, delta), jac=True, method="L-BFGS-B",
                       options={"maxiter": 10000, "ftol": 1e-15, "gtol": 1e-12})
        if best is None or res.fun < best.fun:
            best = res
    a, b, e, alpha, beta = best.x
    return ChinchillaFit(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=float(alpha),
                         beta=float(beta), a_exp=float(beta / (alpha + beta)), b_exp=float(alpha / (alpha + beta)),
                         objective=float(best.fun), n_used=int(len(ln_l)), n_starts=len(order),
                         success=bool(best.success))


def bootstrap_chinchilla(
    df: pd.DataFrame,
    n_boot: int = 100,
    rng: np.random.Generator | int | None = 0,
    level: float = 0.95,
    **fit_kwargs: object,
) -> pd.DataFrame:
    """Percentile intervals of (E, A, B, alpha, beta, a_exp) over runs resampled with
    replacement (whole runs; each replicate is refitted by L-BFGS-B from the point fit,
    about 1 s each on one core). Returns columns ``param, estimate, lo, hi``.
    """
    gen = as_rng(rng)
    point = fit_chinchilla(df, **fit_kwargs)  # type: ignore[arg-type]
    local = {"a": np.array([np.log(point.A)]), "b": np.array([np.log(point.B)]), "e": np.array([np.log(point.E)]),
             "alpha": np.array([point.alpha]), "beta": np.array([point.beta])}
    kw = {k: v for k, v in fit_kwargs.items() if k not in ("grid", "n_refine")}
    reps = []
    for _ in range(n_boot):
        sample = df.iloc[gen.integers(0, len(df), size=len(df))]
        reps.append(fit_chinchilla(sample, grid=local, n_refine=1, **kw).to_dict())  # type: ignore[arg-type]
    reps_df = pd.DataFrame(reps)
    q = (1 - level) / 2
    rows = []
    for p in ("E", "A", "B", "alpha", "beta", "a_exp"):
        rows.append(dict(param=p, estimate=getattr(point, p), lo=float(reps_df[p].quantile(q)),
                         hi=float(reps_df[p].quantile(1 - q))))
    return pd.DataFrame(rows)
