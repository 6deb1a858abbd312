"""How close to the target must the pilots run for a forecast interval of a given width?

The chosen allocation's interval is, on the logit scale, about q +- z s with q the point
forecast's logit and

    s(d)^2 = s_rep^2 + (S f)^2 (r_m^2 + d^2)

(:mod:`race.analysis.backtest`): s_rep the joint replicates' spread, S the pooled
back-tested error scale, f the slope factor, r_m the misfit reach and d the log-FLOP reach
from the largest pilot to the target. On the score scale the width is

    W(s) = expit(q + z s) - expit(q - z s),

increasing in s. :func:`reach_for_width` inverts it: the largest d with W(s(d)) <= goal,
i.e. d* = sqrt((s*^2 - s_rep^2) / (S f)^2 - r_m^2) with W(s*) = goal. Pilots whose largest
budget is within exp(d*) of the target would give an interval of about that width, *at
the error scale and replicate spread this study measured* (an estimate, not a promise:
longer pilots also move the forecast and the back-tests). When even d = 0 leaves the
interval wider than the goal (the replicates' spread or the misfit alone is too large),
no pilot distance reaches it (the forecast's floor is the misfit of the fitted curve at the
last pilot, r_m, and the replicates' spread). :func:`pilot_advice` also lists the estimated
width W(s(ln r)) with the largest pilot r = 1.5, 2 and 4x below the target
(``benchmarks/reach_calibration.py --advice`` sets these estimates beside the widths measured
with the pilots moved there).
"""

from __future__ import annotations

import math

from scipy.special import expit

WIDTH_GOAL = 0.25  # the width the report asks about (score scale, 95% interval)
ADVICE_RATIOS = (1.5, 2.0, 4.0)  # pilot distances below the target whose estimated widths the report lists


def width_at(q: float, s: float, z: float) -> float:
    """W = expit(q + z s) - expit(q - z s): the score-scale width of q +- z s (logit scale)."""
    return float(expit(q + z * s) - expit(q - z * s))


def sd_for_width(q: float, goal: float, z: float) -> float:
    """s* with W(q, s*, z) = ``goal`` (bisection; W increases in s from 0 towards 1)."""
    if not 0 < goal < 1:
        raise ValueError(f"the width goal must be between 0 and 1 (a score-scale width), got {goal!r}")
    lo, hi = 0.0, 1.0
    while width_at(q, hi, z) < goal:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if width_at(q, mid, z) < goal else (lo, mid)
    return 0.5 * (lo + hi)


def reach_for_width(q: float, rep_sd: float, scale: float, factor: float, misfit_reach: float,
                    goal: float, z: float) -> float | None:
    """d*: the largest log-FLOP reach at which the interval is at most ``goal`` wide (module
    docstring); None when even a pilot at the target (d = 0) leaves it wider."""
    s_star = sd_for_width(q, goal, z)
    k = (scale * factor) ** 2
    room = s_star**2 - rep_sd**2
    if k <= 0:
        return math.inf if room >= 0 else None
    d2 = room / k - misfit_reach**2
    return math.sqrt(d2) if d2 >= 0 else None


def width_with_pilots(q: float, rep_sd: float, scale: float, factor: float, misfit_reach: float, ratio: float,
                      z: float) -> float:
    """W(s(ln ``ratio``)): the interval's width with the largest pilot ``ratio`` x below the target."""
    s = math.sqrt(rep_sd**2 + (scale * factor) ** 2 * (misfit_reach**2 + math.log(ratio) ** 2))
    return width_at(q, s, z)


def pilot_advice(q: float, rep_sd: float, scale: float, factor: float, misfit_reach: float, target_budget: float,
                 largest_pilot: float, goal: float = WIDTH_GOAL, z: float = 1.959964,
                 ratios: tuple[float, ...] = ADVICE_RATIOS) -> dict:
    """What the report says about narrowing the chosen allocation's interval to ``goal``:
    ``status`` "met" (the pilots are already close enough), "move" (run the largest pilot at
    ``pilot_budget`` = target / ``ratio``, ``times_largest`` x today's largest) or "not by
    pilots" (no pilot distance narrows it that far: at d = 0 the misfit and the replicates'
    spread alone are wider); ``widths``: the estimated width with the largest pilot at each
    of ``ratios`` below the target that is closer than today's."""
    d = reach_for_width(q, rep_sd, scale, factor, misfit_reach, goal, z)
    now = target_budget / largest_pilot
    out = {"goal": goal, "status": "not by pilots", "ratio": None, "pilot_budget": None, "times_largest": None,
           "widths": {f"{r:g}": width_with_pilots(q, rep_sd, scale, factor, misfit_reach, r, z)
                      for r in ratios if r < now}}
    if d is None:
        return out
    ratio = math.exp(min(d, 700.0))
    if ratio >= now:
        return {**out, "status": "met", "ratio": ratio}
    budget = target_budget / ratio
    return {**out, "status": "move", "ratio": ratio, "pilot_budget": budget, "times_largest": budget / largest_pilot}


def advice_text(advice: dict, fmt_flops) -> str:
    """One sentence for the report (``fmt_flops`` formats a FLOP count)."""
    g = f"{advice['goal']:.2g}"
    widths = advice.get("widths") or {}
    listed = (" Estimated width with the largest pilot " + " / ".join(f"{r}x" for r in widths) + " below the target: "
              + " / ".join(f"{w:.2f}" for w in widths.values()) + "." if widths else "")
    caveat = " (at the error scale this study's back-tests measured; an estimate: longer pilots also move the forecast)"
    if advice["status"] == "met":
        return f"the pilots already run close enough to the target for an interval about {g} wide"
    if advice["status"] == "not by pilots":
        return (f"no pilot distance short of the target narrows the forecast's interval to {g}: the fitted curve's "
                f"misfit at the last pilot and the replicates' spread alone are wider{caveat}.{listed}")
    return (f"to narrow the interval to about {g}, run the largest pilot within {advice['ratio']:.2g}x of the target "
            f"({fmt_flops(advice['pilot_budget'])}, {advice['times_largest']:.2g}x today's largest){caveat}.{listed}")
