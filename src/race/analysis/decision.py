"""The decision and its label (steps 6-7 of :mod:`race.analysis.recommend`).

``decide``: the default pick is the observed winner at the largest pilot budget; the pick
switches to the least-expected-regret allocation only when the paired lower bound of its
gain (the ``alpha`` quantile of F_r,candidate - F_r,default over the joint replicates) is
above 0. ``label``: "no learning detected", "extrapolation too far", "unstable" or a
"stable regime" the forecast earned (>= 3 seeds, back-test right, P(best) at least the
label's promised accuracy, gate passed, no decline, a lead held at the two largest pilot
budgets beyond the paired noise: :func:`lead_not_held`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd

from .backtest import BackTest
from .gate import what_to_change
from .joint import StudyMatrix
from .spread import check_min_logit_sd
from .standings import INTERVALS

class Label(str, Enum):
    """The recommendation's confidence label: its value is the text shown (``str()`` and
    f-strings give it; it compares equal to that text), ``tone`` the report's colour."""

    STABLE = "stable regime"
    UNSTABLE = "unstable"
    TOO_FAR = "extrapolation too far"
    NO_LEARNING = "no learning detected"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def tone(self) -> str:
        """How the report colours the label: good, caution or bad."""
        return {Label.STABLE: "good", Label.UNSTABLE: "caution"}.get(self, "bad")


NO_LEARNING = Label.NO_LEARNING


@dataclass(frozen=True)
class ConfidenceRules:
    """Thresholds of the decision and the label (:mod:`race.analysis.recommend`, steps 6-7) and of the gate.

    Set on the tuning generator (``race.analysis.synthetic.random_world``, seeds 1000+) and
    frozen before any run of the test generator (``benchmarks/decision_quality.py``); how each
    was set, with the runs that set it, is in docs/analysis.md (sections 5 and 7).

    ``switch_alpha`` 0.3: the pick leaves the observed winner only when the 70% paired lower
    bound of the candidate's gain over it is above 0 (``benchmarks/joint_tuning.py``).
    ``min_win_prob`` 0.9 is the label's promise, not a tuned level: "stable regime" claims
    the pick is right in >= 90% of such calls, and P(best) is calibrated, so only calls whose
    own P(best) is >= 0.9 can keep it (docs/analysis.md section 7, run 6).
    ``lead_alpha`` 0.05: the one-sided 95% paired lower bound of the pick's observed lead
    over the runner-up at the largest pilot budget must be above 0 (:func:`lead_not_held`).
    ``own_pairs``: with this many back-test pairs at the target's reach ratio or more, the
    extrapolation error is the study's own, without the prior (:meth:`BackTest.pooled`); never
    by default (the flat and nested grids have 1-3 pairs); ``pair_reach``: which pairs count
    (:class:`race.analysis.backtest.PairRule`, by ratio by default); ``trend_weight`` and
    ``trend_scale``: the local trend as a second forecaster in the replicates
    (:class:`race.analysis.spread.TrendMix`; off by default); ``interval``: how the
    intervals are read from the replicates (``race.analysis.standings.INTERVALS``: equal-tailed
    by default); ``min_logit_sd``: a floor on each forecast's replicate SD in logit
    (``race.analysis.spread.floor_spread``; 0, none, by default); the racing protocol sets
    all six (``race.analysis.racing.RacingRule``)."""

    max_extrapolation: float = 10.0
    min_win_prob: float = 0.9
    gate_alpha: float = 0.05
    switch_alpha: float = 0.3
    min_seeds_stable: int = 3
    lead_alpha: float = 0.05
    own_pairs: float = float("inf")  # back-test pairs from which the study's own error scale is used without the prior
    pair_reach: float | None = None  # back-test pairs by reach (x the target's), not by ratio (race.analysis.backtest.PairRule)
    trend_weight: float = 0.0  # replicates drawn around the local trend (race.analysis.spread.TrendMix); 0: none
    trend_scale: float = 1.0  # their spread, x the curve model's
    interval: str = "equal-tailed"  # how lo/hi are read from the replicates (race.analysis.standings.INTERVALS)
    min_logit_sd: float = 0.0  # floor on each forecast's replicate SD in logit (race.analysis.spread.floor_spread); 0: none

    def __post_init__(self) -> None:
        if self.interval not in INTERVALS:
            raise ValueError(f"ConfidenceRules.interval must be one of {INTERVALS}, got {self.interval!r}")
        check_min_logit_sd(self.min_logit_sd, "ConfidenceRules")


def declining(sm: StudyMatrix, allocation: str) -> tuple[float, float] | None:
    """(previous, largest) equal-FLOP seed-mean scores of ``allocation`` when the score at its
    largest pilot budget is below the one at the budget before (a rise-then-decline sign)."""
    r = sm.runs.assign(end=sm.end)
    by_budget = r[r["allocation"] == allocation].groupby("budget")["end"].mean().sort_index()
    if len(by_budget) >= 2 and by_budget.iloc[-1] < by_budget.iloc[-2]:
        return float(by_budget.iloc[-2]), float(by_budget.iloc[-1])
    return None


def lead_not_held(pick: str, at_budgets: list[tuple[list[str], np.ndarray, np.ndarray]],
                  alpha: float) -> str | None:
    """Why the pick's observed lead does not make a regime (None when it does).

    ``at_budgets``: the observed equal-FLOP standings at the pilot budgets in increasing order,
    each (allocations present, seed-mean scores, (R, k) joint replicates of them: seeds and
    problems resampled, one problem draw shared by every allocation). A regime is an ordering
    that held while the budget grew and is beyond the noise: the pick must be the observed
    winner at each of the two largest pilot budgets, and its paired lead over the runner-up
    at the largest, d_r = O_r,pick - O_r,runner-up, must have its ``alpha`` quantile over the
    replicates above 0 (a one-sided 1 - ``alpha`` lower bound)."""
    if len(at_budgets) < 2:
        return "the lead is seen at one pilot budget only: a regime needs the two largest"
    for when, (names, pts, _) in zip(("second-largest", "largest"), at_budgets[-2:]):
        if pick not in names:
            return f"the chosen allocation has no runs at the {when} pilot budget: its lead there is not seen"
        winner = names[int(np.argmax(pts))]
        if winner != pick:
            return (f"the chosen allocation is not the observed winner at the {when} pilot budget ({winner} scores "
                    f"{float(np.max(pts)):.3f} there against {float(pts[names.index(pick)]):.3f}): the lead did not "
                    "hold while the budget grew")
    names, pts, reps = at_budgets[-1]
    if len(names) < 2:
        return None
    i = names.index(pick)
    j = max((k for k in range(len(names)) if k != i), key=lambda k: pts[k])
    lo = float(np.quantile(reps[:, i] - reps[:, j], alpha))
    if not lo > 0:
        return (f"the lead over the runner-up {names[j]} at the largest pilot budget, {pts[i] - pts[j]:+.3f}, is "
                f"within the paired noise (its {1 - alpha:.0%} lower bound over seeds and problems is {lo:+.3f})")
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
          min_seeds: int, bt: BackTest, decline: tuple[float, float] | None = None,
          lead: str | None = None) -> tuple[Label, list[str]]:
    """The confidence label and its reasons (module docstring, step 7); ``pred.iloc[0]`` is the pick;
    ``lead``: why the pick's lead does not make a regime (:func:`lead_not_held`), None when it does."""
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
        unstable.append(f"{min_seeds} seeds in some cell: '{Label.STABLE}' needs {rules.min_seeds_stable} or more")
    if top["p_best"] < rules.min_win_prob:
        unstable.append(f"win probability {top['p_best']:.2f} is below {rules.min_win_prob:g} ('{Label.STABLE}' promises "
                        f"the pick is right in {rules.min_win_prob:.0%} of such calls; P(best) is calibrated)")
    if bt.picked_right is None:
        unstable.append("no back-test: the forecast's accuracy cannot be checked inside the study (needs >= 2 "
                        "pilot budgets)")
    elif not bt.picked_right:
        unstable.append("back-test: forecasting the largest pilot budget from the smaller ones picks a different "
                        "allocation than the one observed to win there")
    if decline is not None:
        unstable.append(f"the chosen allocation's score falls from {decline[0]:.3f} to {decline[1]:.3f} between the "
                        "two largest pilot budgets (over-optimisation or noise): a rising forecast is suspect")
    if lead is not None:
        unstable.append(lead)
    if not bool(gate.loc[gate["allocation"] == top["allocation"], "passed"].any()):
        unstable.append("the chosen allocation itself did not pass the learning gate (forecast by its recent level or "
                        "its trend)")
    if far:
        return Label.TOO_FAR, far + unstable
    if unstable:
        return Label.UNSTABLE, unstable
    return Label.STABLE, [f"chosen allocation learned (gate passed), wins in {top['p_best']:.0%} of joint "
                             f"replicates (back-tested extrapolation error included), it led at the two largest pilot "
                             f"budgets beyond the paired noise, the back-test from the smaller "
                             f"pilot budgets picked the observed winner at the largest, {min_seeds}+ seeds per cell "
                             f"({rules.min_seeds_stable} or more needed)"]
