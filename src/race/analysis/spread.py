"""What widens the forecast's replicates past the back-tested noise, the two knobs of
``ConfidenceRules`` (``race.analysis.decision``) the racing rule sets: a floor on each
forecast's replicate spread in logit (:func:`floor_spread`, ``min_logit_sd``) and the
local trend as a second forecaster (:class:`TrendMix`, ``trend_weight`` / ``trend_scale``).
Both are off by default (the flat study's recommendation); why the racing rule turns them
on, and the values it froze, is in docs/analysis.md ("The interval: ...").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backtest import logit
from .joint import StudyMatrix


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
    idx = sm.runs_of(allocation)
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
    SDs (below 0.21) and 0.3% in the widest (the fifth freeze: docs/analysis.md, "a floor on the
    replicates' spread")."""
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
