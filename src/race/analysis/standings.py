"""What is read from (R, k) replicates, forecast or observed: the standings.

The observed standings at a budget (:func:`standings`: seed-mean scores at equal FLOPs and
their joint replicates), how an interval is read from replicates (:data:`INTERVALS`:
equal-tailed or shortest) and the predictions table (:func:`summarise`: score, interval,
P(best), P(near best), expected regret) that the recommendation shows for the forecast at
the target (:mod:`race.analysis.forecast`) or the observed standings.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .bootstrap import win_probabilities
from .joint import Replicates, StudyMatrix


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
