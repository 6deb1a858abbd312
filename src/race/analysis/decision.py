"""The decision and its label (steps 6-7 of :mod:`race.analysis.recommend`).

``decide``: the default pick is the observed winner at the largest pilot budget; the pick
switches to the least-expected-regret allocation only when the paired lower bound of its
gain (the ``alpha`` quantile of F_r,candidate - F_r,default over the joint replicates) is
above 0. ``label``: "no learning detected", "extrapolation too far", "unstable" or a
"stable regime" the forecast earned (>= 3 seeds, back-test right, P(best) high, gate
passed, no decline).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .backtest import BackTest
from .gate import what_to_change
from .joint import StudyMatrix

NO_LEARNING = "no learning detected"


@dataclass(frozen=True)
class ConfidenceRules:
    """Thresholds of the decision and the label (:mod:`race.analysis.recommend`, steps 6-7) and of the gate.

    Set on the tuning generator (``race.analysis.synthetic.random_world``, seeds 1000+) and
    frozen before any run of the test generator (``benchmarks/decision_quality.py``).

    ``switch_alpha`` 0.3 (a 70% paired lower bound): with the joint model and its back-test
    prior (``JOINT_PRIOR_SCALE`` 1.75), the best of 0.05 / 0.1 / 0.2 / 0.3 on tuning seeds
    1000-1199 (-0.0052 [-0.0115, -0.0000] against the observed winner; 0.05 never switched),
    confirmed on fresh tuning seeds 1200-1799 before it was adopted (-0.0016 [-0.0035,
    -0.0002], 6 switches in 500 learning worlds; ``benchmarks/joint_tuning.py``)."""

    max_extrapolation: float = 10.0
    min_win_prob: float = 0.8
    gate_alpha: float = 0.05
    switch_alpha: float = 0.3
    min_seeds_stable: int = 3


def declining(sm: StudyMatrix, allocation: str) -> tuple[float, float] | None:
    """(previous, largest) equal-FLOP seed-mean scores of ``allocation`` when the score at its
    largest pilot budget is below the one at the budget before (a rise-then-decline sign)."""
    r = sm.runs.assign(end=sm.end)
    by_budget = r[r["allocation"] == allocation].groupby("budget")["end"].mean().sort_index()
    if len(by_budget) >= 2 and by_budget.iloc[-1] < by_budget.iloc[-2]:
        return float(by_budget.iloc[-2]), float(by_budget.iloc[-1])
    return None


def decide(F: np.ndarray, allocations: list[str], default: str, alpha: float) -> tuple[str, str, float]:
    """(pick, why, paired lower bound of the gain) by expected regret with a default (step 6)."""
    d = allocations.index(default)
    c = int(np.argmax(F.mean(axis=0)))
    if c == d:
        return default, (f"the observed winner at the largest pilot budget, {default}, also has the least expected "
                         "regret"), float("nan")
    gain = F[:, c] - F[:, d]
    lo = float(np.quantile(gain, alpha))
    if lo > 0:
        return allocations[c], (f"switched from the observed winner {default} to {allocations[c]}: its forecast gain "
                                f"{gain.mean():+.3f} has a paired {1 - alpha:.0%} lower bound {lo:+.3f} > 0"), lo
    return default, (f"kept the observed winner at the largest pilot budget, {default}: {allocations[c]} forecasts "
                     f"{gain.mean():+.3f} higher but the paired {1 - alpha:.0%} lower bound of that gain is {lo:+.3f} "
                     "(not above 0)"), lo


def label(pred: pd.DataFrame, gate: pd.DataFrame, largest: float, ratio: float, rules: ConfidenceRules,
          min_seeds: int, bt: BackTest, decline: tuple[float, float] | None = None) -> tuple[str, list[str]]:
    """The confidence label and its reasons (module docstring, step 7); ``pred.iloc[0]`` is the pick."""
    top = pred.iloc[0]
    if not gate["passed"].any():
        why = (f"no allocation's gain over its step-0 score is beyond the noise at the largest pilot budgets "
               f"(family-wise {1 - rules.gate_alpha:.0%}; best gain {gate['gain'].max():+.3f}); the standings "
               f"below are observed at {largest:.3g} FLOPs, not forecast. To see learning: {what_to_change(gate)}")
        return NO_LEARNING, [why]
    far, unstable = [], []
    if ratio >= rules.max_extrapolation:
        far.append(f"target budget is {ratio:.1f}x the largest pilot budget {largest:.3g} "
                   f"(limit: below {rules.max_extrapolation:g}x)")
    if min_seeds < rules.min_seeds_stable:
        unstable.append(f"{min_seeds} seeds in some cell: 'stable regime' needs {rules.min_seeds_stable} or more")
    if top["p_best"] < rules.min_win_prob:
        unstable.append(f"win probability {top['p_best']:.2f} is below {rules.min_win_prob:g}")
    if bt.picked_right is None:
        unstable.append("no back-test: the forecast's accuracy cannot be checked inside the study (needs >= 2 "
                        "pilot budgets)")
    elif not bt.picked_right:
        unstable.append("back-test: forecasting the largest pilot budget from the smaller ones picks a different "
                        "allocation than the one observed to win there")
    if decline is not None:
        unstable.append(f"the chosen allocation's score falls from {decline[0]:.3f} to {decline[1]:.3f} between the "
                        "two largest pilot budgets (over-optimisation or noise): a rising forecast is suspect")
    if not bool(gate.loc[gate["allocation"] == top["allocation"], "passed"].any()):
        unstable.append("the chosen allocation itself did not pass the learning gate (forecast flat)")
    if far:
        return "extrapolation too far", far + unstable
    if unstable:
        return "unstable", unstable
    return "stable regime", [f"chosen allocation learned (gate passed), wins in {top['p_best']:.0%} of joint "
                             f"replicates (back-tested extrapolation error included), the back-test from the smaller "
                             f"pilot budgets picked the observed winner at the largest, {min_seeds}+ seeds per cell "
                             f"({rules.min_seeds_stable} or more needed)"]
