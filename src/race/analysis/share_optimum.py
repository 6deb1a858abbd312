"""Where the best update share lies: located inside the range, flat, or not resolved.

One line of allocations (one reward system at one budget, :mod:`race.analysis.update_share`)
is a response: points ``(x_j, score_j)`` with ``x`` the update share p (or p_policy) and
paired replicates ``reps[:, j]`` of the scores (one joint bootstrap over seeds and the same
problems, :func:`race.analysis.joint.draw_replicates`). :func:`locate_best` calls it, and
never calls a difference its interval does not support:

* the pilot best ``b`` is the point with the largest score; point ``j`` is **worse** when the
  ``level`` interval of the paired difference ``score_b - score_j`` lies above 0; the
  **plausible** points are ``b`` and every point that is not worse;
* the **bracket** is the nearest worse point below the smallest plausible x and the nearest
  worse point above the largest: where both exist the response turns inside the range (it
  falls beyond the noise on both sides of every plausibly best point), and under one peak the
  optimum lies strictly between them: **located**. Its estimate is the vertex of the
  quadratic ``c2 x^2 + c1 x + c0`` fitted (least squares) to the points inside the bracket,
  ends included, with the vertex's interval from the same fit on every replicate, where at
  least :data:`MIN_FIT_POINTS` distinct x are there, the fit opens downward, at least
  ``MIN_VALID`` of the replicates have a maximum and the interval stays inside the bracket;
  otherwise the pilot best's x with the bracket as its interval;
* **flat** when every point is plausible and the ``level`` upper bound of the spread
  ``max_j reps[:, j] - min_j reps[:, j]`` is at most ``margin``: no two points differ by more
  than the margin, with the intervals saying so (an equivalence call, not an absence of
  evidence);
* **edge-low** / **edge-high** when the response falls beyond the noise on one side only
  (the best may lie at or beyond the smallest / largest x tried); **unresolved** when neither
  end is below the best beyond the noise and the spread's bound exceeds the margin (the
  intervals are too wide to say flat).

The same points read in p_policy give the call in p_policy: the same worse and plausible
points (the scores do not change), the bracket and the vertex in the other coordinate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .bootstrap import difference

#: Largest spread (score units) a flat response may have at its ``level`` upper bound (0.02: 10 of 500 problems).
FLAT_MARGIN = 0.02
#: Distinct x a local fit inside the bracket needs (three coefficients and one point of misfit).
MIN_FIT_POINTS = 4
#: Share of replicates whose refit must have a maximum for the vertex to stand.
MIN_VALID = 0.9
#: x values closer than this are one level.
SAME_X = 0.005


class Call(str):
    """The call on a response (module docstring): one of the constants below, each a ``str``."""

    __slots__ = ()
    LOCATED: "Call"
    FLAT: "Call"
    EDGE_LOW: "Call"
    EDGE_HIGH: "Call"
    UNRESOLVED: "Call"


Call.LOCATED = Call("located")
Call.FLAT = Call("flat")
Call.EDGE_LOW = Call("edge-low")
Call.EDGE_HIGH = Call("edge-high")
Call.UNRESOLVED = Call("unresolved")
#: Every call, in that order.
CALLS = (Call.LOCATED, Call.FLAT, Call.EDGE_LOW, Call.EDGE_HIGH, Call.UNRESOLVED)


@dataclass
class Located:
    """:func:`locate_best`'s answer in one coordinate (``coord``: "p" or "p_policy")."""

    coord: str
    call: Call
    x: float  # the estimate: the local fit's vertex, else the pilot best's x
    lo: float | None  # its interval (the vertex's) or the bracket
    hi: float | None
    how: str  # "local fit" | "bracket" | "pilot best"
    best: int  # index of the pilot best (input order)
    plausible: list[int]  # indices not below the best beyond the noise (the best included)
    plausible_x: list[float]  # their x
    below: float | None  # x of the nearest worse point below the plausible ones
    above: float | None  # ... above them
    x_min: float
    x_max: float
    spread_hi: float  # level upper bound of the largest paired difference between points
    margin: float
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The call in words, with its interval or what keeps it from one."""
        c, x = self.coord, self.x
        if self.call == Call.LOCATED:
            via = ("the local fit's vertex" if self.how == "local fit" else
                   "the pilot best; interval: the nearest points below the best beyond the noise")
            return f"located inside the range: best {c} {x:.2f} [{self.lo:.2f}, {self.hi:.2f}] ({via})"
        if self.call == Call.FLAT:
            return (f"flat across {c} {self.x_min:.2f}-{self.x_max:.2f}: no two points differ by more than "
                    f"{self.spread_hi:.3f} (95% bound) <= {self.margin:.3f}")
        if self.call == Call.EDGE_LOW:
            return (f"not located: falls beyond the noise above {c} {self.above:.2f} but not below the best; the best "
                    f"{c} is at or below {max(self.plausible_x):.2f} (smallest tried {self.x_min:.2f})")
        if self.call == Call.EDGE_HIGH:
            return (f"not located: falls beyond the noise below {c} {self.below:.2f} but not above the best; the best "
                    f"{c} is at or above {min(self.plausible_x):.2f} (largest tried {self.x_max:.2f})")
        return (f"not resolved: no end of {c} {self.x_min:.2f}-{self.x_max:.2f} is below the best beyond the noise, "
                f"and differences up to {self.spread_hi:.3f} are not ruled out (flat needs <= {self.margin:.3f})")


def _bracket(x: np.ndarray, worse: np.ndarray, plausible: np.ndarray) -> tuple[float | None, float | None]:
    """x of the nearest worse point below the smallest plausible x and above the largest."""
    lo_p, hi_p = x[plausible].min(), x[plausible].max()
    below = x[worse & (x < lo_p - SAME_X)]
    above = x[worse & (x > hi_p + SAME_X)]
    return (float(below.max()) if below.size else None, float(above.min()) if above.size else None)


def vertex_fit(x: np.ndarray, y: np.ndarray, reps: np.ndarray, *, level: float = 0.95
               ) -> tuple[float, float, float, float] | None:
    """The quadratic's vertex through ``(x, y)`` and its ``level`` interval over the replicates
    ``reps`` (R, k) refitted: ``(vertex, lo, hi, share of replicates with a maximum)``, or None
    where the point fit opens upward or fewer than two replicates have a maximum."""
    c = np.polyfit(x, y, 2)
    rc = np.polyfit(x, reps.T, 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(rc[0] < 0, -rc[1] / (2 * rc[0]), np.nan)
    ok = np.isfinite(v)
    if c[0] >= 0 or ok.sum() < 2:
        return None
    q = (1 - level) / 2
    lo, hi = np.quantile(v[ok], [q, 1 - q])
    return float(-c[1] / (2 * c[0])), float(lo), float(hi), float(ok.mean())


def _n_levels(x: np.ndarray) -> int:
    s = np.sort(x)
    return int(1 + np.sum(np.diff(s) > SAME_X)) if s.size else 0


def locate_best(x, score, reps, *, coord: str = "p", level: float = 0.95, margin: float = FLAT_MARGIN) -> Located:
    """The call on one response (module docstring): ``x`` (k,) the points' coordinate,
    ``score`` (k,) their scores, ``reps`` (R, k) paired replicates of the scores."""
    x, y, reps = np.asarray(x, float), np.asarray(score, float), np.asarray(reps, float)
    if x.ndim != 1 or x.shape != y.shape or reps.ndim != 2 or reps.shape[1] != x.size or x.size < 1:
        raise ValueError(f"x {x.shape}, score {y.shape} and reps {reps.shape} must be (k,), (k,), (R, k) with k >= 1")
    ib = int(np.argmax(y))
    worse = np.array([j != ib and difference(y[ib], y[j], reps[:, ib], reps[:, j], level=level).lo > 0
                      for j in range(x.size)])
    plausible = ~worse
    below, above = _bracket(x, worse, plausible)
    spread = reps.max(axis=1) - reps.min(axis=1)
    spread_hi = float(np.quantile(spread, (1 + level) / 2)) if x.size > 1 else 0.0
    base = dict(coord=coord, best=ib, plausible=[int(j) for j in np.flatnonzero(plausible)], below=below,
                above=above, x_min=float(x.min()), x_max=float(x.max()), spread_hi=spread_hi, margin=margin,
                plausible_x=[float(v) for v in x[plausible]])
    if below is not None and above is not None:
        inside = (x >= below - SAME_X) & (x <= above + SAME_X)
        notes: list[str] = []
        fit = vertex_fit(x[inside], y[inside], reps[:, inside], level=level) if _n_levels(x[inside]) >= \
            MIN_FIT_POINTS else None
        if fit is not None and below < fit[1] and fit[2] < above and below < fit[0] < above and fit[3] >= MIN_VALID:
            return Located(call=Call.LOCATED, x=fit[0], lo=fit[1], hi=fit[2], how="local fit", **base)
        if _n_levels(x[inside]) >= MIN_FIT_POINTS:
            notes.append("the local fit inside the bracket is not stable (no maximum, or its vertex's interval "
                         "leaves the bracket): the pilot best stands, the bracket as its interval")
        return Located(call=Call.LOCATED, x=float(x[ib]), lo=below, hi=above, how="bracket", notes=notes, **base)
    if plausible.all() and x.size > 1 and spread_hi <= margin:
        call = Call.FLAT
    elif above is not None:
        call = Call.EDGE_LOW
    elif below is not None:
        call = Call.EDGE_HIGH
    else:
        call = Call.UNRESOLVED
    return Located(call=call, x=float(x[ib]), lo=None, hi=None, how="pilot best", **base)


__all__ = ["CALLS", "Call", "FLAT_MARGIN", "Located", "MIN_FIT_POINTS", "MIN_VALID", "locate_best", "vertex_fit"]
