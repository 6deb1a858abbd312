"""Rolling-origin back-tests inside one study: how far off the forecasts are, measured.

For every origin budget b_o below the largest pilot budget and every larger budget b_t,
each allocation is fitted (point fit, the same curve families as the forecast) on the
evaluation points of its runs at budgets <= b_o only, and forecasts the seed-mean
equal-FLOP score of its runs at b_t, read at their mean counted FLOPs C_t. With
d = ln C_t - (largest ln C fitted) the reach of that forecast,

    e_k = logit(forecast_k) - logit(observed_k),     u_k = e_k / (f_k sqrt(r_m^2 + d^2)),   f_k = min(|b_k| + c0, c1)

with b_k the allocation's observed logit slope per unit ln C (least squares over its
seed-mean equal-FLOP scores at the pilot budgets), c0 = ``SLOPE_FLOOR`` and c1 =
``SLOPE_CAP``: errors grow in proportion to the reach and to how fast the curve is still
moving (on the tuning worlds the 95th percentile of |error| / reach is 0.4 logit for curves
flatter than 0.05 per ln C and about 3 for curves rising faster than 0.3 per ln C), but not
beyond |b| + c0 = 0.5: a curve rising faster in logit is near its ceiling, and its error at
the target is no larger (uncapped, such curves got intervals from near 0 to 1). Only pairs at the target's extrapolation ratio count: the ratio of a forecast is its reach
over the log-FLOP range it was fitted on, and pairs whose ratio exceeds 1.5x the target's
are left out (the one with the smallest ratio is kept when none qualifies): fitting on the
smallest budget's few points and forecasting 10x beyond says little about a target 4x
beyond a 10x range. Per (origin, b_t) pair with K allocations, the shared part is
u_bar = mean_k u_k and the specific part u_k - u_bar. The observed mean is itself noisy
(variance v_k on the logit scale, from the joint replicates); its share is removed (with
D_k = f_k sqrt(r_m^2 + d^2) the effective reach):

    s_specific^2 = max(0, mean_pairs [sum_k (u_k - u_bar)^2 / (K - 1) - n_specific])
    s_shared^2   = max(0, mean_pairs [u_bar^2 - n_shared - s_specific^2 / K])

n_shared and n_specific are what the observation noise adds to each (:func:`observation_noise`:
from the covariance of the observed means over the joint replicates, whose problem part is
shared by the allocations and cancels in u_k - u_bar; the variances alone where there are no
replicates), and the specific errors' own share of u_bar^2 is s_specific^2 / K.

**Effective reach.** An error that grew in proportion to the reach d alone would vanish at
d = 0, but a forecast at the last pilot still misses the truth: the curve family does not
fit every world exactly (a kink, a decline, a plateau the fitted shape bends through). So
the error scales with sqrt(r_m^2 + d^2): r_m (``misfit_reach``, ln C) is the reach whose
extrapolation error equals that misfit. With r_m = 0 the joint model's 95% intervals
covered the truth in 95% of tuning worlds at the generator's own targets (4-16x beyond the
largest pilot) but in only 72-87% with the pilots moved to 1.25-2x below the target
(``race.analysis.synthetic.move_pilots``); r_m is measured there (``JOINT_MISFIT_REACH``).

Three pairs per study are few, so each scale is pooled with a prior (empirical Bayes, the
prior set once on the tuning generator's worlds and frozen: ``PRIOR_SCALE`` per unit reach,
worth ``PRIOR_PAIRS`` pairs, split equally between the two parts):

    S_part^2 = (n s_part^2 + n0 s0^2 / 2) / (n + n0)

A forecast at reach d then gets logit-scale noise D_k (S_shared z_r + S_specific z_rk),
D_k = f_k sqrt(r_m^2 + d^2) (:func:`effective_reach`),
z standard normal: one z_r
per joint replicate shared by every allocation (the errors are correlated across
allocations, as the back-tests show them), one z_rk per allocation (:meth:`BackTest.noise`).
The back-test also says whether the forecast would have picked the observed winner at the
largest pilot budget from the smaller ones (``picked_right``), which the "stable regime"
label requires.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

EPS = 1e-3
PRIOR_SCALE = 2.25  # logit error per unit reach per unit (|slope| + c0) (tuning generator, seeds 1000-1199)
# the prior and the misfit reach of the joint model's back-tests, set together on the tuning generator with every
# world's pilots at six distances from the target (benchmarks/reach_calibration.py; seeds 1000-1399, confirmed on
# 1400-1799) and frozen; the prior carries the calibration (docs/analysis.md section 4, "Calibrated at every distance")
JOINT_PRIOR_SCALE = 1.6
JOINT_MISFIT_REACH = 0.7
PRIOR_PAIRS = 2.0
SLOPE_FLOOR = 0.1  # c0: logit per unit ln C
# the slope factor |b| + c0 is capped here (the error per unit reach stops growing with |b| at about 0.5 on the tuning
# generator); frozen (docs/analysis.md section 4, "Where the width comes from")
SLOPE_CAP = 0.5


def logit(p: np.ndarray | float) -> np.ndarray:
    """ln(p / (1 - p)) with p clipped to [1e-3, 1 - 1e-3] (a score of 0 or 1 is 1/1000 away)."""
    p = np.clip(np.asarray(p, dtype=float), EPS, 1 - EPS)
    return np.log(p / (1 - p))


@dataclass(frozen=True)
class PairRule:
    """Which back-test pairs calibrate the intervals, and when the study's scale stands alone.

    ``max_reach`` None: the pairs at the target's extrapolation ratio (reach over the fitted
    log-FLOP range, at most 1.5x the target's: :func:`at_ratio`), for pilots 4-16x below the
    target; a number m: the pairs whose log-FLOP reach is at most m x the target's (a racing
    study's rungs, each forecast from the ones before, at about the target's reach: the ratio
    rule would drop them because the rungs span a long range). ``own_pairs``: with this many
    pairs or more the study's own scales are used without the prior (:meth:`BackTest.pooled`)."""

    own_pairs: float = float("inf")
    max_reach: float | None = None


@dataclass
class BackTest:
    """Back-test errors of one study and the error scale they imply."""

    table: pd.DataFrame  # origin, budget, allocation, forecast, observed, reach, error (logit), obs_var, norm
    s_shared: float  # logit error per unit reach, shared by all allocations
    s_specific: float  # logit error per unit reach, per allocation
    n_pairs: int
    picked_right: bool | None  # from the largest origin: the forecast's best at the largest budget is the observed best
    prior_scale: float = PRIOR_SCALE  # s0 of the prior (``JOINT_PRIOR_SCALE`` for the joint model)
    misfit_reach: float = 0.0  # r_m (``JOINT_MISFIT_REACH`` for the joint model)

    @property
    def available(self) -> bool:
        return self.n_pairs > 0

    own_pairs: float = float("inf")  # with this many pairs or more the study's scales are used alone

    def pooled(self) -> tuple[float, float]:
        """(S_shared, S_specific): the study's own scales when it has ``own_pairs`` pairs or more,
        else pooled with the prior (module docstring)."""
        n, n0 = self.n_pairs, PRIOR_PAIRS
        if n >= self.own_pairs:
            return float(self.s_shared), float(self.s_specific)
        sh = np.sqrt((n * self.s_shared**2 + n0 * self.prior_scale**2 / 2) / (n + n0))
        sp = np.sqrt((n * self.s_specific**2 + n0 * self.prior_scale**2 / 2) / (n + n0))
        return float(sh), float(sp)

    @property
    def calibration(self) -> str:
        """Which error scale the intervals use: the study's own back-tests, pooled with the prior, or the prior."""
        if self.n_pairs >= self.own_pairs:
            return f"the study's own back-tests ({self.n_pairs} pairs at the target's reach)"
        if self.n_pairs:
            return (f"the study's back-tests ({self.n_pairs} pairs at the target's reach, fewer than "
                    f"{self.own_pairs:g}) pooled with the prior (worth {PRIOR_PAIRS:g} pairs)")
        return "the prior alone (no back-test pair)"

    def effective(self, ln_reach: np.ndarray | float, factor: np.ndarray | float) -> np.ndarray:
        """:func:`effective_reach` with this back-test's misfit reach: what :meth:`sd` and :meth:`noise` scale by."""
        return effective_reach(ln_reach, factor, self.misfit_reach)

    def sd(self, reach: np.ndarray | float) -> np.ndarray:
        """Logit-scale SD of the noise at ``reach`` (as in :meth:`noise`): reach sqrt(S_shared^2 + S_specific^2)."""
        return np.maximum(np.asarray(reach, dtype=float), 0.0) * float(np.hypot(*self.pooled()))

    def noise(self, reach: np.ndarray | float, n_reps: int, k: int, rng: np.random.Generator) -> np.ndarray:
        """(R, k) logit-scale extrapolation noise at ``reach`` = log-FLOP reach x f_k = min(|b_k| + c0, c1), scalar or (k,)."""
        sh, sp = self.pooled()
        shared = rng.standard_normal((n_reps, 1)) * sh
        spec = rng.standard_normal((n_reps, k)) * sp
        return np.maximum(np.asarray(reach, dtype=float), 0.0) * (shared + spec)


def effective_reach(ln_reach: np.ndarray | float, factor: np.ndarray | float, misfit_reach: float = 0.0) -> np.ndarray:
    """D = f sqrt(r_m^2 + max(d, 0)^2): the reach the back-tested error scales with (module
    docstring), for log-FLOP reach d = ``ln_reach`` past the last fitted point, slope factor
    f = ``factor`` (:func:`slope_norm`) and misfit reach r_m = ``misfit_reach`` (ln C)."""
    d = np.maximum(np.asarray(ln_reach, dtype=float), 0.0)
    return np.asarray(factor, dtype=float) * np.sqrt(float(misfit_reach) ** 2 + d**2)


def at_ratio(table: pd.DataFrame, max_ratio: float | None) -> pd.DataFrame:
    """Back-test rows of the (origin, budget) pairs whose median ratio is <= ``max_ratio``
    (the pair with the smallest ratio when none is)."""
    if max_ratio is None or table.empty:
        return table
    pair_ratio = table.groupby(["origin", "budget"])["ratio"].transform("median")
    keep = pair_ratio <= max_ratio
    return table[keep] if keep.any() else table[pair_ratio == pair_ratio.min()]


def observation_noise(u_reps: np.ndarray | None, v: np.ndarray) -> tuple[float, float]:
    """(shared, specific) parts of the observation noise of one pair's normalised errors u_k:
    E[u_bar^2] and E[sum_k (u_k - u_bar)^2 / (K - 1)] that the noise of the observed means adds.

    With Sigma the covariance of the observed means' noise over the allocations (logit scale,
    divided by D_k D_l): shared = 1' Sigma 1 / K^2, specific = (tr Sigma - 1' Sigma 1 / K) / (K - 1).
    ``u_reps`` (R, K): the joint replicates of the observed means, normalised the same way (one
    problem draw shared by every allocation, so the problem part of the noise is correlated
    across allocations and cancels in the differences u_k - u_bar); None: independent noise
    of variances ``v`` (Sigma diagonal)."""
    K = len(v)
    if u_reps is not None and u_reps.shape[0] > 1:
        sigma = np.atleast_2d(np.cov(u_reps, rowvar=False))
    else:
        sigma = np.diag(np.asarray(v, dtype=float))
    total = float(sigma.sum())
    return total / K**2, (float(np.trace(sigma)) - total / K) / (K - 1) if K >= 2 else 0.0


def at_reach(table: pd.DataFrame, max_reach: float) -> pd.DataFrame:
    """Back-test rows of the (origin, budget) pairs whose median log-FLOP reach is <= ``max_reach``
    (the pair with the smallest reach when none is)."""
    if table.empty:
        return table
    pair_reach = table.groupby(["origin", "budget"])["reach"].transform("median")
    keep = pair_reach <= max_reach
    return table[keep] if keep.any() else table[pair_reach == pair_reach.min()]


def error_scale(table: pd.DataFrame, misfit_reach: float = 0.0,
                obs_reps: dict[tuple[float, str], np.ndarray] | None = None) -> tuple[float, float, int]:
    """(s_shared, s_specific, pairs) from back-test rows (formulas in the module docstring).

    ``obs_reps``: (budget, allocation) -> (R,) joint replicates of the observed mean's logit
    (:func:`observation_noise`); without them the observation noise is taken as independent
    across allocations, of variance ``obs_var``."""
    pairs = []
    for (_, budget), g in table.groupby(["origin", "budget"], sort=True):
        d = effective_reach(g["reach"].to_numpy(float), g["norm"].to_numpy(float), misfit_reach)
        u = g["error"].to_numpy(float) / d
        reps = None
        if obs_reps is not None and all((budget, a) in obs_reps for a in g["allocation"]):
            reps = np.column_stack([obs_reps[(budget, a)] for a in g["allocation"]]) / d[None, :]
        pairs.append((u, *observation_noise(reps, g["obs_var"].to_numpy(float) / d**2)))
    specific = [np.sum((u - u.mean()) ** 2) / (len(u) - 1) - n_sp for u, _, n_sp in pairs if len(u) >= 2]
    s_sp2 = max(0.0, float(np.mean(specific))) if specific else 0.0
    # E[u_bar^2] = s_shared^2 + s_specific^2 / K + the observation noise's shared part
    shared = [u.mean() ** 2 - n_sh - s_sp2 / len(u) for u, n_sh, _ in pairs]
    s_sh = float(np.sqrt(max(0.0, np.mean(shared)))) if shared else 0.0
    return s_sh, float(np.sqrt(s_sp2)), len(pairs)


def slope_norm(lnc: np.ndarray, scores: np.ndarray) -> float:
    """min(|b| + c0, ``SLOPE_CAP``): b the least-squares slope of logit(score) on ln C (0 with fewer
    than 2 FLOP levels), c0 = ``SLOPE_FLOOR``."""
    lnc, scores = np.asarray(lnc, dtype=float), np.asarray(scores, dtype=float)
    if len(lnc) < 2 or np.ptp(lnc) <= 0:
        return SLOPE_FLOOR
    return float(min(abs(np.polyfit(lnc, logit(scores), 1)[0]) + SLOPE_FLOOR, SLOPE_CAP))


def run_backtest(budgets: list[float], allocations: list[str], fit_at, observed_at,
                 norm_of=None, target_ratio: float | None = None, prior_scale: float = PRIOR_SCALE,
                 misfit_reach: float = 0.0, pairs: PairRule = PairRule(), target_reach: float | None = None) -> BackTest:
    """Rolling-origin back-test over sorted pilot ``budgets``.

    ``fit_at(allocation, origin, x_target) -> (forecast, x_fit_max, x_fit_min)`` or None: the
    point forecast from runs at budgets <= origin; ``observed_at(allocation, budget) -> (score,
    ln C, logit variance[, (R,) joint replicates of its logit])`` or None: the seed-mean observed
    reading there (with replicates, the noise's correlation across allocations counts:
    :func:`observation_noise`); ``norm_of(allocation)``
    -> |b_k| + c0 (default: c0, i.e. no slope scaling); ``target_ratio``: the target's reach
    over its fitted log-FLOP range (None: every pair counts); ``prior_scale`` and
    ``misfit_reach``: s0 and r_m of the error model (module docstring); ``pairs``: which pairs
    count and from how many the study's scales stand alone (:class:`PairRule`), with
    ``target_reach`` the target's log-FLOP reach past the pilots (for ``PairRule.max_reach``).
    """
    rows, obs_reps = [], {}
    for i, origin in enumerate(budgets[:-1]):
        for b_t in budgets[i + 1:]:
            for a in allocations:
                obs = observed_at(a, b_t)
                if obs is None:
                    continue
                if len(obs) > 3:
                    obs_reps[(b_t, a)] = np.asarray(obs[3], dtype=float)
                fc = fit_at(a, origin, obs[1])
                if fc is None or not fc[1] < obs[1]:
                    continue
                rows.append(dict(origin=origin, budget=b_t, allocation=a, forecast=fc[0], observed=obs[0],
                                 reach=obs[1] - fc[1], error=float(logit(fc[0]) - logit(obs[0])), obs_var=obs[2],
                                 norm=norm_of(a) if norm_of is not None else SLOPE_FLOOR,
                                 ratio=(obs[1] - fc[1]) / max(fc[1] - fc[2], 1e-9)))
    table = pd.DataFrame(rows, columns=["origin", "budget", "allocation", "forecast", "observed", "reach", "error",
                                        "obs_var", "norm", "ratio"])
    if pairs.max_reach is not None and target_reach is not None:
        used = at_reach(table, pairs.max_reach * target_reach)
    else:
        used = at_ratio(table, None if target_ratio is None else 1.5 * target_ratio)
    table["used"] = table.index.isin(used.index)
    s_sh, s_sp, n = error_scale(used, misfit_reach, obs_reps or None) if len(used) else (0.0, 0.0, 0)
    picked = None
    if len(budgets) >= 2 and len(table):
        last = table[(table["origin"] == budgets[-2]) & (table["budget"] == budgets[-1])]
        if len(last) >= 2:
            picked = bool(last.loc[last["forecast"].idxmax(), "allocation"] == last.loc[last["observed"].idxmax(),
                                                                                          "allocation"])
    return BackTest(table=table, s_shared=s_sh, s_specific=s_sp, n_pairs=n, picked_right=picked,
                    prior_scale=prior_scale, misfit_reach=misfit_reach, own_pairs=pairs.own_pairs)


def open_ends(point: float, sd: float, z: float, not_located: bool, rising: bool, ln_reach: float,
              lo: float | None = None, hi: float | None = None) -> tuple[bool, bool, str]:
    """(open above, open below, why): does the data bound this forecast's interval?

    With q = logit(point) and the logit-scale SD ``sd`` of its interval at the target (the
    joint replicates' spread and the back-tested extrapolation noise at this reach), the
    interval's ends lie near expit(q -+ z sd). It is **open above** when the joint model
    could not locate any midpoint inside the pilots (``not_located``) and the forecast still
    rises above the last observation (no sign of saturation yet: the ceiling is the error
    model's, not the data's), or when q + z sd reaches logit(1 - EPS) (the back-tested error
    at this reach spans the top of the scale); **open below** when q - z sd reaches
    logit(EPS). The interval's replicate quantiles ``lo`` / ``hi``, when given, count too (at
    the margin 200 replicates' quantile and the normal one differ: either reaching 1 - EPS or
    EPS opens that end). ``why`` is "" when both ends are bounded by the data.
    """
    q, half = float(logit(point)), z * max(float(sd), 0.0)
    top, bottom = float(logit(1 - EPS)), float(logit(EPS))
    reasons, above, below = [], False, False
    err = f"{half:.1f} logit at {ln_reach:.2f} ln C past the last pilot"
    if not_located and rising:
        above = True
        reasons.append("no sign of saturation yet: the interval is open above (no allocation's curve bends inside "
                       "the pilots, so no midpoint is located and the data do not bound the score above; the upper "
                       f"bound is the back-tested extrapolation error, {err}, not a ceiling the data show)")
    elif q + half >= top or (hi is not None and hi >= 1 - EPS):
        above = True
        reasons.append("the interval is open above: the data do not bound the score there, the back-tested "
                       f"extrapolation error at this reach ({err}) spans the top of the scale")
    if q - half <= bottom or (lo is not None and lo <= EPS):
        below = True
        reasons.append("the interval is open below: the data do not bound the score there, the back-tested "
                       f"extrapolation error at this reach ({err}) spans the bottom of the scale")
    return above, below, "; ".join(reasons)
