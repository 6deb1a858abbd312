"""Pilot designs run on complete trajectories: the racing rule and the literature's baselines.

Every design here reads one *source* of trajectories: per allocation and seed one run at a
constant learning rate whose prefixes are the shorter runs (so any pilot a design could run
is a prefix of it, and the truth at the target is beside it). Two sources implement
:class:`Source`: a known world (``race.analysis.synthetic_race.WorldSource``) and a real
study whose every allocation ran to T (``race.protocol.replay.StudySource``). A design asks
the source for the tables a study's store would hold once run (allocation, seed) has
reached rung ``reached[(allocation, seed)]`` of the budgets it names, and decides with the
code a racing grid runs (:func:`race.analysis.racing.rung_decision`).

The designs (:data:`DESIGNS`), each at (at most) the default design's pilot compute:

- ``flat``: every allocation x seed at 3 budgets 4-16x below T (the source's flat grid), the
  observed winner at the largest: the naive rule the others are paired against;
- ``keep-all``: every allocation, one seed, to the budget the cap buys, ``cap T / (K - 1)``
  (at most the last rung), the observed leader there;
- ``top-k``: the default schedule's first rung, then the ``k`` best by observed score straight
  to the last rung (Egele et al., arXiv 2307.15422), ``k`` as many as the cap allows;
- ``halving``: successive halving by observed score over the default schedule's rungs;
- ``brackets``: a Hyperband-style pair on shared trajectories: bracket A halves from its first
  rung to one finalist, bracket B runs every allocation from A's middle rung (it never cuts the
  largest model before it) to one finalist; the better finalist at the last rung;
- ``race (last round)``: the earlier freezes' forecast-gated race (rungs T/64, T/8, T/3, 2
  seeds first, the cap rule, ``rank="forecast"``);
- ``default``: the racing rule as frozen (:class:`race.analysis.racing.RacingRule`), its pick
  with an interval and P(best) over every allocation.

The baselines run as the literature runs them: no step floor beyond the allocation's warmup.

Compute in units of T: ``pilot`` (every pilot FLOP; a continued run counts its final budget
once), ``reused`` (the pick's continued run), ``unreused = pilot - reused``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
import pandas as pd

from race.spec.rungs import geometric_rungs, keep_counts

from .racing import FIRST_SEEDS, RACE_FIRST_SEEDS, RACE_RUNGS, RacingRule, observed_scores, rung_decision
from .recommend import Recommendation
from .tables import prepare_runs


class Source(Protocol):
    """Complete trajectories a design reads (module docstring)."""

    target_budget: float
    names: list[str]  # allocations, in a fixed order
    seeds: list[int]  # seeds every allocation ran
    target: str  # the evaluation target the designs read (e.g. greedy)

    def tables(self, reached: dict[tuple[int, int], int], budgets: "list[float] | dict[int, list[float]]",
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(runs, evals) once run (allocation index, seed) has reached rung ``reached[...]`` of
        ``budgets`` (one ladder for all, or one per allocation index)."""

    def snap(self, budgets: list[float]) -> list[float]:
        """Budgets this source can read (a real study: its evaluated budgets), one per rung."""

    def snap_up(self, budget: float) -> float:
        """The least budget this source can read at or above ``budget`` (a step floor's)."""

    def min_budgets(self, floor_steps: int) -> dict[str, float]:
        """Per allocation the budget of its warmup + ``floor_steps`` steps (empty when unknown)."""

    def least_budget(self) -> float:
        """One step of the costliest allocation (0 when unknown)."""

    def flat(self) -> tuple[pd.DataFrame, pd.DataFrame, list[float]]:
        """(runs, evals, budgets) of the flat grid on this source."""


@dataclass
class DesignResult:
    """What a design picked and spent (compute in units of T)."""

    pick: str
    pilot: float
    reused: float
    alive_last: list[str]
    alive_n: list[int] = field(default_factory=list)
    recommendation: Recommendation | None = field(default=None, repr=False)
    schedule: dict = field(default_factory=dict)
    decisions: list[dict] = field(default_factory=list, repr=False)

    @property
    def unreused(self) -> float:
        return self.pilot - self.reused

    def as_dict(self) -> dict:
        out = {"pick": self.pick, "pilot": self.pilot, "reused": self.reused, "alive_last": list(self.alive_last),
               "alive_n": list(self.alive_n), "fits": bool(self.schedule.get("fits", True)),
               "first_seeds": self.schedule.get("first_seeds")}
        rec = self.recommendation
        if rec is not None:  # the pick's own row (an observed pick may differ from the forecast's choice)
            row = rec.predictions.set_index("allocation")
            if self.pick in row.index:
                r = row.loc[self.pick]
                out.update(lo=float(r["lo"]), hi=float(r["hi"]), p_best=float(r["p_best"]),
                           p_near_best=float(r["p_near_best"]), point=float(r["score"]),
                           confidence=str(rec.confidence), forecast_pick=rec.allocation)
        return out


def schedule_for(source: Source, rule: RacingRule, first_seeds: int, rungs: list[float] | None = None):
    """The rule's schedule on ``source`` (rungs snapped to what the source can read)."""
    mins = source.min_budgets(rule.floor_steps)  # floor 0 (the baselines): judged once past warmup
    sched = rule.schedule(source.names, source.target_budget, first_seeds=first_seeds, rungs=rungs,
                          min_budgets=mins, least_budget=source.least_budget(), strict=False)
    snapped = source.snap(list(sched.budgets))
    snapped_mins = {a: source.snap_up(m) for a, m in sched.min_budgets.items()}
    if snapped != list(sched.budgets) or snapped_mins != dict(sched.min_budgets):
        from race.spec.rungs import RungSchedule

        # rungs that fall on one read merge (the most cut of them), the first rung keeping every allocation;
        # a floor moves up to the read that holds it
        budgets = sorted(set(snapped))
        keep = [min(k for b, k in zip(snapped, sched.keep) if b == u) for u in budgets]
        keep[0] = sched.keep[0]
        sched = RungSchedule(sched.target_budget, tuple(budgets), tuple(keep), sched.first_seeds, sched.later_seeds,
                             snapped_mins, sched.cap)
    return sched


def fitting_schedule(source: Source, rule: RacingRule, first_seeds: int, rungs: list[float] | None = None):
    """:func:`schedule_for`, with one first-rung seed where ``first_seeds`` do not fit the cap and the
    rungs are the rule's own (as the plan advises); the schedule says its ``first_seeds``."""
    sched = schedule_for(source, rule, first_seeds, rungs)
    if not sched.fits() and first_seeds > 1 and rungs is None:
        sched = schedule_for(source, rule, 1, rungs)
    return sched


def race(source: Source, rule: RacingRule, first_seeds: int, rungs: list[float] | None = None, seed: int = 0,
         forecast: bool | None = None) -> DesignResult:
    """The racing code on ``source``: :func:`race.analysis.racing.rung_decision` after each rung;
    ``forecast``: at every rung (True), at the last only (None), where the rule needs it (False)."""
    sched = fitting_schedule(source, rule, first_seeds, rungs)
    first_seeds = sched.first_seeds
    budgets = list(sched.budgets)
    K = len(source.names)
    ladders = {k: sched.ladder(a) for k, a in enumerate(source.names)}
    seeds0 = list(source.seeds[:first_seeds])
    later = seeds0[: rule.later_seeds]
    reached = {(k, s): 0 for k in range(K) for s in seeds0}
    alive, history, decisions, rec, pick = list(range(K)), [list(range(K))], [], None, None
    for j in range(len(budgets)):
        runs, evals = source.tables(reached, ladders)
        last = j == len(budgets) - 1
        d = rung_decision(runs, evals, schedule=sched, rung=j, target=source.target, rule=rule, seed=seed,
                          forecast=bool(forecast) or (forecast is None and last))
        decisions.append(d.as_dict())
        if last:
            rec, pick = d.recommendation, d.leader
            break
        alive = sorted(source.names.index(a) for a in d.go_on)
        history.append(list(alive))
        for k in alive:
            for s in later:
                reached[(k, s)] = j + 1
    pilot = sum(ladders[k][j] for (k, _), j in reached.items())
    T = source.target_budget
    return DesignResult(pick=str(pick), pilot=pilot / T, reused=len(later) * budgets[-1] / T,
                        alive_last=[source.names[k] for k in history[-1]], alive_n=[len(a) for a in history],
                        recommendation=rec, schedule={**sched.as_dict(), "fits": sched.fits()}, decisions=decisions)


def _ranked(prepared: pd.DataFrame, evals: pd.DataFrame, target: str, budget: float, among: list[str]) -> list[str]:
    """``among`` by observed score at ``budget``, best first (ties by name)."""
    sc = observed_scores(prepared, evals, target, budget, among)
    return sorted(sc, key=lambda a: (-sc[a], a))


def _leader(source: Source, reached: dict, budgets: list[float], budget: float, among: list[str]) -> list[str]:
    runs, evals = source.tables(reached, budgets)
    return _ranked(prepare_runs(runs), evals, source.target, budget, among)


def flat(source: Source, rule: RacingRule, first_seeds: int) -> DesignResult:
    runs, evals, budgets = source.flat()
    prepared = prepare_runs(runs)
    b = max(budgets)
    pick = _ranked(prepared, evals, source.target, b, source.names)[0]
    n_seeds = prepared.groupby("allocation")["seed"].nunique().max()
    T = source.target_budget
    return DesignResult(pick=pick, pilot=len(source.names) * n_seeds * sum(budgets) / T, reused=b / T,
                        alive_last=list(source.names))


def keep_all(source: Source, rule: RacingRule, first_seeds: int) -> DesignResult:
    K, T = len(source.names), source.target_budget
    frac = min(rule.max_unreused / max(K - 1, 1), rule.last) if rule.max_unreused is not None else rule.last
    b = source.snap([max(frac * T, source.least_budget() * 1.0001)])[0]
    reached = {(k, source.seeds[0]): 0 for k in range(K)}
    pick = _leader(source, reached, [b], b, source.names)[0]
    return DesignResult(pick=pick, pilot=K * b / T, reused=b / T, alive_last=list(source.names), alive_n=[K])


def top_k(source: Source, rule: RacingRule, first_seeds: int) -> DesignResult:
    sched = schedule_for(source, rule, first_seeds)
    K, T, s0 = len(source.names), source.target_budget, sched.first_seeds
    b0, bl = sched.budgets[0], sched.budgets[-1]
    cap = (rule.max_unreused if rule.max_unreused is not None else 10.0) * T
    k = max(1, min(K, int(np.floor((cap + bl - K * s0 * b0) / (bl - b0) + 1e-9)))) if K > 1 and bl > b0 else K
    r = RacingRule(**{**rule.as_dict(), "rank": "observed", "pick": "observed", "keep_last": k, "eta": 1e9,
                      "floor_steps": 0})
    out = race(source, r, first_seeds, [b0, bl] if bl > b0 else [bl], forecast=False)
    out.schedule = {**out.schedule, "k": k}
    return out


def halving(source: Source, rule: RacingRule, first_seeds: int) -> DesignResult:
    r = RacingRule(**{**rule.as_dict(), "rank": "observed", "pick": "observed", "floor_steps": 0})
    return race(source, r, first_seeds, None, forecast=False)


def race_last_round(source: Source, rule: RacingRule, first_seeds: int) -> DesignResult:
    r = RacingRule(**{**rule.as_dict(), "geometry": "cap", "rank": "forecast", "pick": "forecast", "floor_steps": 0})
    T = source.target_budget
    return race(source, r, min(RACE_FIRST_SEEDS, len(source.seeds)), [f * T for f in RACE_RUNGS])


def default(source: Source, rule: RacingRule, first_seeds: int) -> DesignResult:
    return race(source, rule, first_seeds)


def brackets(source: Source, rule: RacingRule, first_seeds: int) -> DesignResult:
    """Bracket A halves from a0 to one finalist over the rule's geometry; bracket B runs every
    allocation from A's middle rung to one finalist; the better finalist at the last rung by
    observed score. One seed, shared trajectories; a0 the largest whose worst case fits the cap."""
    names, K, T = source.names, len(source.names), source.target_budget
    bl = source.snap([rule.last * T])[0]
    cap = (rule.max_unreused if rule.max_unreused is not None else 10.0) * T
    keep_a = keep_counts(K, 1, rule.eta)
    if len(keep_a) < 3:
        keep_a = (K, (K + 1) // 2, 1) if K > 2 else (K, 1)

    def unreused(a0: float) -> float:  # worst case: everyone to the middle rung, A's survivors beyond, B's finalist
        r = geometric_rungs(a0, bl, len(keep_a))
        mid = max(1, len(r) // 2)
        beyond = sum(keep_a[j] * (r[j] - r[j - 1]) for j in range(mid + 1, len(r)))
        return K * r[mid] + beyond + (bl - r[mid]) - bl

    lo = max(source.least_budget(), bl * 1e-4)
    grid = [lo * (bl / lo) ** (i / 400) for i in range(400)]
    fit = [a0 for a0 in grid if unreused(a0) <= cap * (1 + 1e-9)]
    budgets = sorted(set(source.snap(list(geometric_rungs(fit[-1] if fit else lo, bl, len(keep_a))))))
    keep = list(keep_a[-len(budgets):]) if len(budgets) < len(keep_a) else list(keep_a)
    s = source.seeds[0]
    if len(budgets) < 2:  # the study's reads leave one rung: every allocation there, the best picked
        reached = {(k, s): 0 for k in range(K)}
        pick = _leader(source, reached, budgets, budgets[0], names)[0]
        return DesignResult(pick=pick, pilot=K * budgets[0] / T, reused=budgets[0] / T, alive_last=list(names),
                            schedule={"budgets": budgets, "keep": [K]})
    mid = max(1, len(budgets) // 2)
    reached, alive = {(k, s): 0 for k in range(K)}, list(names)
    for j in range(len(budgets) - 1):
        alive = _leader(source, reached, budgets, budgets[j], alive)[: keep[j + 1]]
        for a in alive:
            reached[(names.index(a), s)] = j + 1
    for k in range(K):  # bracket B: every allocation to A's middle rung
        reached[(k, s)] = max(reached[(k, s)], mid)
    final_b = _leader(source, reached, budgets, budgets[mid], names)[0]
    reached[(names.index(final_b), s)] = len(budgets) - 1
    finalists = sorted(set(alive) | {final_b})
    pick = _leader(source, reached, budgets, budgets[-1], finalists)[0]
    pilot = sum(budgets[j] for j in reached.values())
    return DesignResult(pick=pick, pilot=pilot / T, reused=budgets[-1] / T, alive_last=finalists,
                        schedule={"budgets": budgets, "keep": keep, "middle": budgets[mid]})


#: name -> design(source, rule, first_seeds): the literature's baselines and the racing rule
DESIGNS: dict[str, Callable[[Source, RacingRule, int], DesignResult]] = {
    "flat": flat, "keep-all": keep_all, "top-k": top_k, "halving": halving, "brackets": brackets,
    "race (last round)": race_last_round, "default": default,
}


def run_designs(source: Source, rule: RacingRule | None = None, first_seeds: int = FIRST_SEEDS,
                names: list[str] | None = None) -> dict[str, DesignResult]:
    """Every design of :data:`DESIGNS` (or those named) on ``source``."""
    rule = rule or RacingRule()
    unknown = sorted(set(names or []) - set(DESIGNS))
    if unknown:
        raise ValueError(f"unknown design(s) {unknown}; choose from {sorted(DESIGNS)}")
    return {n: DESIGNS[n](source, rule, min(first_seeds, len(source.seeds))) for n in (names or DESIGNS)}


__all__ = ["DESIGNS", "DesignResult", "Source", "brackets", "default", "fitting_schedule", "flat", "halving", "keep_all",
           "race",
           "race_last_round", "run_designs", "schedule_for", "top_k"]
