"""The racing protocol's decisions: who goes on at each rung, and the pick after the last.

A racing study runs its pilots in *rungs* toward the target budget T (a
:class:`race.spec.rungs.RungSchedule`: rung budgets and how many allocations are ranked onto
each, sized by the grid and the compute cap). Rung 0 runs every allocation with 1-3 seeds;
each later rung extends the runs of the allocations that go on (resumed at a constant
learning rate, so a rung's runs are prefixes of the next rung's). After each rung
:func:`rung_decision` says which allocations go on; after the last one its
``recommendation`` is the pick, and the pick's pilot is continued to T.

The decision at rung j, a pure function of the study's tables and ``seed`` (a study resumed
from its store decides the same), reads only runs at budgets <= the rung's:

1. **Alive**: the allocations with a complete run at the rung's budget.
2. **Step floor**: an alive allocation whose runs there have taken fewer than its warmup +
   ``floor_steps`` optimizer steps has not been measured: it goes on whatever it scored.
3. **Rank** the measured ones (``RacingRule.rank``): ``observed``, the seed-mean score at equal
   FLOPs at the rung; ``trend``, that score plus its recent slope in ln C carried to the next
   rung; ``forecast``, P(it beats the forecast leader at T) over the joint replicates.
4. **Keep** the schedule's ``keep[j+1]`` best measured ones (``geometry="schedule"``), or as
   many as the compute cap leaves room for with the leader alone after them
   (``geometry="cap"``, the design of the earlier freezes).
5. **Forecast** (when asked; the decisions above never read it): the analysis of
   :func:`race.analysis.recommend.recommend` on EVERY allocation's runs up to the rung (the
   ones stopped earlier at their last readings), so P(best), expected regret and P(beats the
   leader) are over all allocations the study ran, never over the survivors alone; a cut
   against the forecast's own odds (P(beats the leader) >= 0.5) says so in its reason.
6. **Pick** (last rung): among the measured allocations alive there, the observed leader
   (``pick="observed"``) or the recommendation's choice (``pick="forecast"``: the observed
   leader unless another's forecast gain has a paired lower bound above 0).

The rule's frozen values and how they were chosen: docs/analysis.md section 12.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

import numpy as np
import pandas as pd

from race.spec.rungs import RungSchedule, choose_schedule, keep_counts

from .curves import final_scores
from .decision import ConfidenceRules
from .forecast import INTERVALS, TrendMix, check_min_logit_sd
from .recommend import Recommendation, recommend
from .tables import jsonable, prepare_runs, without_controls

RTOL = 1e-9  # budgets closer than this (relative) are the same rung
#: the fixed racing design of the earlier freezes (rungs as fractions of T, first-rung seeds): the
#: benchmark's "forecast-gated race" baseline (``RacingRule(geometry="cap", rank="forecast")``)
RACE_RUNGS = (1 / 64, 1 / 8, 1 / 3)
RACE_FIRST_SEEDS = 2
#: the first-rung seeds of the design frozen with :class:`RacingRule` (reach beats seeds: docs/analysis.md section 12)
FIRST_SEEDS = 1
RANKS = ("observed", "trend", "forecast")
PICKS = ("observed", "forecast")
GEOMETRIES = ("schedule", "cap")


@dataclass(frozen=True)
class RacingRule:
    """A racing design: how the rungs are sized, who goes on, and the pick (module docstring).

    Geometry: ``eta`` (the keep ratio between rungs), ``keep_last`` (allocations on the last
    rung), ``last`` (the last rung as a fraction of T) and ``max_unreused`` (the cap on pilot
    compute the target run does not reuse, in units of T) size the schedule
    (:func:`race.spec.rungs.choose_schedule`); ``geometry="cap"`` instead keeps as many as the
    cap leaves room for at each rung. ``floor_steps``: optimizer steps past warmup before an
    allocation may be stopped. ``rank``, ``p_keep`` (``forecast`` rank only: an allocation
    below this P(beats the leader) stops even with room), ``pick``: steps 3-6. ``later_seeds``:
    seeds each later rung continues. Forecast settings (the pick's interval and the odds):
    ``own_pairs``, ``pair_reach``, ``level``, ``n_boot``, ``method``, ``trend_weight``,
    ``trend_scale``, ``interval``, ``min_logit_sd`` (:class:`race.analysis.decision.ConfidenceRules`).

    Frozen (a sixth time; this time the design, not only the interval) on the tuning generator
    alone (``race.analysis.synthetic.random_world`` at K = 12 and 24, seeds 100000-100099),
    with :data:`FIRST_SEEDS` seeds on the first rung: rank ``observed``, pick ``forecast``,
    geometry ``schedule`` with eta 3 and keep_last 2, floor_steps 5, the cap 0.9 T; the
    interval settings as the fifth freeze left them. How it was chosen and what it meets:
    docs/analysis.md section 12."""

    rank: str = "observed"
    pick: str = "forecast"
    geometry: str = "schedule"
    eta: float = 3.0
    keep_last: int = 2
    last: float = 1 / 3
    floor_steps: int = 5
    p_keep: float = 0.0
    max_unreused: float | None = 0.9
    later_seeds: int = 1
    own_pairs: float = 3.0
    pair_reach: float | None = 2.0
    level: float = 0.95
    n_boot: int = 200
    method: str = "joint"
    trend_weight: float = 0.5
    trend_scale: float = 1.4
    interval: str = "shortest"
    min_logit_sd: float = 0.24

    def __post_init__(self) -> None:
        for name, allowed in (("rank", RANKS), ("pick", PICKS), ("geometry", GEOMETRIES), ("interval", INTERVALS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"RacingRule.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0.5 < self.level < 1:
            raise ValueError(f"RacingRule.level must be in (0.5, 1), got {self.level!r}")
        if int(self.n_boot) < 20:
            raise ValueError(f"RacingRule.n_boot must be >= 20 replicates, got {self.n_boot!r}")
        if not 0 <= self.p_keep < 1:
            raise ValueError(f"RacingRule.p_keep must be in [0, 1), got {self.p_keep!r}")
        if self.max_unreused is not None and not self.max_unreused >= 0:
            raise ValueError(f"RacingRule.max_unreused must be >= 0 (units of the target budget) or None, "
                             f"got {self.max_unreused!r}")
        if not self.eta > 1 or int(self.keep_last) < 1 or not 0 < self.last < 1:
            raise ValueError(f"RacingRule needs eta > 1, keep_last >= 1 and last in (0, 1), got {self.eta!r}, "
                             f"{self.keep_last!r}, {self.last!r}")
        if int(self.floor_steps) < 0 or int(self.later_seeds) < 1:
            raise ValueError(f"RacingRule needs floor_steps >= 0 and later_seeds >= 1, got {self.floor_steps!r}, "
                             f"{self.later_seeds!r}")
        try:
            TrendMix(self.trend_weight, self.trend_scale)
        except ValueError as e:
            raise ValueError(f"RacingRule: {e}") from None
        check_min_logit_sd(self.min_logit_sd, "RacingRule")

    def as_dict(self) -> dict:
        return jsonable(asdict(self))

    def confidence_rules(self) -> ConfidenceRules:
        return ConfidenceRules(own_pairs=float(self.own_pairs), pair_reach=self.pair_reach,
                               trend_weight=float(self.trend_weight), trend_scale=float(self.trend_scale),
                               interval=str(self.interval), min_logit_sd=float(self.min_logit_sd))

    def schedule(self, names: Sequence[str], target_budget: float, *, first_seeds: int,
                 rungs: Sequence[float] | None = None, min_budgets: Mapping[str, float] | None = None,
                 least_budget: float = 0.0, strict: bool = True) -> RungSchedule:
        """The study's schedule: ``rungs`` (budgets in FLOPs) as given, else chosen for these
        allocations and the cap (:func:`race.spec.rungs.choose_schedule`; ``strict=False``: the
        least schedule where none fits). With given rungs the keep counts are geometric from
        every allocation to ``keep_last``."""
        cap = self.max_unreused
        if rungs is None:
            return choose_schedule(list(names), target_budget, cap=cap, first_seeds=first_seeds,
                                   later_seeds=self.later_seeds, last=self.last, eta=self.eta, keep_last=self.keep_last,
                                   min_budgets=min_budgets, least_budget=least_budget, strict=strict)
        keep = keep_counts(len(names), self.keep_last, self.eta)
        n = len(rungs)
        keep = tuple(keep[min(round(j * (len(keep) - 1) / max(n - 1, 1)), len(keep) - 1)] for j in range(n))
        return RungSchedule(float(target_budget), tuple(float(b) for b in rungs), keep, first_seeds, self.later_seeds,
                            dict(min_budgets or {}), cap)


def rule_from(overrides: Mapping[str, Any], later_seeds: int = 1) -> RacingRule:
    """A :class:`RacingRule` with these field overrides (a grid file's ``race.rule``); unknown
    names raise ValueError listing the fields."""
    names = {f.name for f in fields(RacingRule)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"race.rule: unknown setting(s) {unknown}; the racing rule's settings are {sorted(names)}")
    return RacingRule(**{**overrides, "later_seeds": int(later_seeds)})


@dataclass
class RungDecision:
    """Who goes on after one rung, and why (JSON-able through :meth:`as_dict`)."""

    rung: int  # index of the rung just finished (0 = the first)
    budget: float  # that rung's budget in FLOPs
    next_budget: float | None  # the next rung's budget (None after the last rung)
    target_budget: float  # T
    go_on: tuple[str, ...]  # allocations that continue, leader first
    stopped: dict[str, str]  # allocation -> one-line reason it stops here
    leader: str | None
    rows: list[dict] = field(default_factory=list)  # per alive allocation: observed, forecast, odds, steps, decision
    rule: dict = field(default_factory=dict)  # RacingRule.as_dict()
    exempt: tuple[str, ...] = ()  # alive allocations the step floor kept (not measured yet)
    schedule: dict = field(default_factory=dict)  # RungSchedule.as_dict()
    recommendation: Recommendation | None = field(default=None, repr=False)  # the forecast (the pick at the last rung)

    def as_dict(self) -> dict:
        return jsonable({k: getattr(self, k) for k in self.__dataclass_fields__ if k != "recommendation"})


def readings(runs: pd.DataFrame, evals: pd.DataFrame, budget: "float | Callable[[str], float]",
             condition: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, evals) a decision at a rung reads: every complete run at a budget <= ``budget`` (a
    number, or per allocation: ``budget(allocation)``; random-reward controls up to the largest,
    for the learning gate), prepared (``allocation`` named on the whole study), with canonical run
    ids ``<allocation>#s<seed>#b<budget>``: a reading is named by what it is, not by how the store
    named it (a rung's run becomes a prefix of the run that extends it), so a study resumed from
    its store decides exactly as before."""
    prepared = prepare_runs(runs)
    limit = budget if callable(budget) else (lambda a, b=float(budget): b)
    control = ~prepared.index.isin(without_controls(prepared).index)
    cap = np.array([limit(a) for a in prepared["allocation"]], dtype=float)
    if control.any():
        cap[control] = max(limit(a) for a in set(prepared.loc[~control, "allocation"])) if (~control).any() else 0.0
    keep = prepared["budget"].to_numpy(float) <= cap * (1 + RTOL)
    if condition is not None:
        keep &= (prepared["reward_system"] == condition).to_numpy() | control
    sub = prepared[keep]
    canon = {r: f"{a}#s{s}#b{float(b):.9e}" for r, a, s, b in zip(sub["run_id"], sub["allocation"], sub["seed"],
                                                                   sub["budget"])}
    if len(set(canon.values())) < len(canon):  # two readings of one (allocation, seed, budget): keep them apart
        canon = {r: f"{c}#{r}" for r, c in canon.items()}
    sub = sub.assign(run_id=sub["run_id"].map(canon), prefix_of=None).sort_values("run_id", kind="mergesort")
    ev = evals[evals["run_id"].isin(set(canon))]
    ev = ev.assign(run_id=ev["run_id"].map(canon)).sort_values(["run_id", "target", "step", "flops"], kind="mergesort")
    return sub.reset_index(drop=True), ev.reset_index(drop=True)


def at_own(runs: pd.DataFrame, budget_of: Callable[[str], float]) -> pd.DataFrame:
    """The rows of ``runs`` at each allocation's own budget ``budget_of(allocation)``."""
    own = np.array([budget_of(a) for a in runs["allocation"]], dtype=float)
    return runs[np.isclose(runs["budget"].to_numpy(float), own, rtol=RTOL, atol=0.0)]


def alive_at(runs: pd.DataFrame, budget_of: Callable[[str], float]) -> list[str]:
    """Candidate allocations (no random-reward controls) with a complete run at their own budget."""
    return sorted(set(at_own(without_controls(runs), budget_of)["allocation"]))


def observed_scores(runs: pd.DataFrame, evals: pd.DataFrame, target: str, budget: "float | Callable[[str], float]",
                    allocations: Sequence[str]) -> dict[str, float]:
    """Seed-mean score of each allocation at equal counted FLOPs among the runs of its budget
    (``final_scores(at="equal")``); ``budget``: one for all, or per allocation."""
    budget_of = budget if callable(budget) else (lambda a, b=float(budget): b)
    ends = final_scores(evals, at_own(runs, budget_of), target, at="equal")
    means = ends.groupby("allocation")["score"].mean()
    return {a: float(means[a]) for a in allocations if a in means.index}


def trend_scores(runs: pd.DataFrame, evals: pd.DataFrame, target: str, budget_of: Callable[[str], float],
                 next_of: Callable[[str], float], allocations: Sequence[str],
                 observed: Mapping[str, float]) -> dict[str, float]:
    """``observed`` plus each allocation's recent slope in ln C carried to its next rung: the
    seed mean of each run's least-squares slope of score on ln FLOPs over its evaluated points
    after step 0 in the last factor-``next / own`` stretch before its own budget (0 with fewer
    than 2 such points)."""
    at = at_own(runs, budget_of)
    ev = evals[(evals["target"] == target) & evals["run_id"].isin(set(at["run_id"])) & (evals["flops"] > 0)]
    slopes: dict[str, list[float]] = {}
    for rid, alloc in zip(at["run_id"], at["allocation"]):
        b, n = budget_of(alloc), max(next_of(alloc), budget_of(alloc) * (1 + 1e-9))
        g = ev[(ev["run_id"] == rid) & (ev["flops"] >= b * b / n)]
        x, y = np.log(g["flops"].to_numpy(float)), g["score"].to_numpy(float)
        slopes.setdefault(alloc, []).append(float(np.polyfit(x, y, 1)[0]) if len(x) >= 2 and np.ptp(x) > 0 else 0.0)
    return {a: observed[a] + float(np.log(max(next_of(a), budget_of(a)) / budget_of(a))) * float(np.mean(slopes.get(a, [0.0])))
            for a in allocations if a in observed}


def floor_status(runs: pd.DataFrame, budget_of: Callable[[str], float], allocations: Sequence[str],
                 floor_steps: int) -> dict[str, tuple[int | None, int | None]]:
    """Per allocation (steps its runs at its own budget took, the least, or None; steps it needs:
    its warmup + ``floor_steps``, None when the steps are unknown)."""
    at = at_own(runs, budget_of)
    out = {}
    for a in allocations:
        g = at[at["allocation"] == a]
        steps = pd.to_numeric(g["steps"], errors="coerce") if "steps" in g.columns else pd.Series(dtype=float)
        warm = pd.to_numeric(g["warmup_steps"], errors="coerce") if "warmup_steps" in g.columns else None
        have = int(steps.min()) if len(steps) and steps.notna().all() else None
        need = int(floor_steps + (int(warm.max()) if warm is not None and warm.notna().any() else 0))
        out[a] = (have, need if have is not None else None)
    return out


def _exempt(status: Mapping[str, tuple[int | None, int | None]], schedule: RungSchedule) -> list[str]:
    """Alive allocations not measured yet: fewer steps than their floor, or (steps unknown) a floor
    the schedule places beyond the last rung."""
    never = set(schedule.unmeasured())
    return [a for a, (have, need) in status.items()
            if (have is not None and need is not None and have < need) or (have is None and a in never)]


def spent_flops(runs: pd.DataFrame, budget: float) -> float:
    """Pilot FLOPs spent up to a rung of ``budget``: per (allocation, seed) trajectory the largest
    budget its runs reached there (a continued run costs its final budget once)."""
    r = prepare_runs(runs)
    r = r[r["budget"].to_numpy(float) <= budget * (1 + RTOL)]
    return float(r.groupby(["allocation", "seed"], dropna=False)["budget"].max().sum())


def _cap_room(readings: pd.DataFrame, schedule: RungSchedule, rung: int) -> int:
    """``geometry="cap"``: how many besides the leader may go on so that the leader alone can then
    finish the last rung within the cap (the earlier freezes' rule); ``readings``: the rung's."""
    b, T = schedule.budgets, schedule.target_budget
    if schedule.cap is None:
        return 10**9
    spent = float(readings.groupby(["allocation", "seed"], dropna=False)["budget"].max().sum())
    s_l, nxt = schedule.later_seeds, b[rung + 1]
    free = schedule.cap * T - spent - s_l * (b[-1] - nxt) + b[-1]
    return max(int(np.floor(free / (s_l * (nxt - b[rung])) * (1 + 1e-9))) - 1, 0)


def _forecast(runs: pd.DataFrame, evals: pd.DataFrame, target: str, rule: RacingRule, seed: int,
              target_budget: float, condition: str | None, pick_from: Sequence[str], default: str) -> Recommendation:
    return recommend(evals, runs, target, target_budget, reward_system=condition, method=rule.method,
                     n_boot=rule.n_boot, rng=seed, level=rule.level, rules=rule.confidence_rules(),
                     pick_from=set(pick_from), default=default)


def rung_decision(runs: pd.DataFrame, evals: pd.DataFrame, *, schedule: RungSchedule, rung: int,
                  target: str = "greedy", condition: str | None = None, rule: RacingRule = RacingRule(),
                  seed: int = 0, forecast: bool = True) -> RungDecision:
    """Who goes on after rung ``rung`` of ``schedule`` (module docstring); a pure function of the
    tables and ``seed``. ``forecast=False`` skips step 5 where the rule does not need it (the
    decisions do not change: a benchmark's shortcut); ``rank="forecast"``, and the last rung
    under ``pick="forecast"``, always forecast."""
    if rung not in range(len(schedule.budgets)):
        raise ValueError(f"rung must be in 0..{len(schedule.budgets) - 1} (the rungs' indices), got {rung!r}")
    budget, last = schedule.budgets[rung], rung == len(schedule.budgets) - 1
    T = schedule.target_budget

    def own(a: str) -> float:
        return schedule.budget_of(a, rung)

    sub_runs, sub_evals = readings(runs, evals, own, condition)
    alive = alive_at(sub_runs, own)
    if not alive:
        raise ValueError(f"no complete run of any allocation at the rung budget {budget:.3g} (condition "
                         f"{condition!r}): the rung has not run yet")
    status = floor_status(sub_runs, own, alive, rule.floor_steps)
    exempt = _exempt(status, schedule)
    measured = [a for a in alive if a not in exempt] or list(alive)
    obs = observed_scores(sub_runs, sub_evals, target, own, alive)
    rec = None
    observed_leader = min(measured, key=lambda a: (-obs.get(a, -1.0), a))
    if forecast or (last and rule.pick == "forecast") or rule.rank == "forecast":
        # the forecast chooses among the measured ones, except where the rule picks by observed score:
        # then its recommendation is that pick's (odds and interval over every allocation either way)
        pick_from = [observed_leader] if last and rule.pick == "observed" else measured
        rec = _forecast(sub_runs, sub_evals, target, rule, seed, T, condition, pick_from, observed_leader)
    score = dict(obs)
    if rule.rank == "trend" and not last:
        score = trend_scores(sub_runs, sub_evals, target, own, lambda a: schedule.budget_of(a, rung + 1), alive, obs)
    beats: dict[str, float] = {}
    if rec is not None and rec.replicates is not None:
        names = [str(a) for a in rec.predictions["allocation"]]
        lead_f = names.index(rec.allocation)
        F = rec.replicates
        beats = {a: float(np.mean(F[:, i] > F[:, lead_f])) for i, a in enumerate(names)}
    if rule.rank == "forecast":
        order = sorted(measured, key=lambda a: (-beats.get(a, 0.0), -score.get(a, -1.0), a))
        order.remove(rec.allocation) if rec.allocation in order else None
        order = [rec.allocation, *order] if rec.allocation in measured else order
    else:
        order = sorted(measured, key=lambda a: (-score.get(a, -1.0), a))
    if last:
        leader = rec.allocation if rule.pick == "forecast" else observed_leader
    else:
        leader = order[0]
    if last:
        keep_n, why_cap = 0, ""
    elif rule.geometry == "cap":
        keep_n = 1 + _cap_room(sub_runs, schedule, rung)
        why_cap = f"the compute cap ({schedule.cap:g} T not reused) leaves room for {keep_n - 1} besides the leader"
    else:
        keep_n = schedule.keep[rung + 1]
        why_cap = f"the schedule ranks {keep_n} onto the next rung (sized by the cap, {schedule.cap} T)"
    ranked = [leader] + [a for a in order if a != leader]
    if rule.rank == "forecast" and rule.p_keep > 0:
        ranked = [a for a in ranked if a == leader or beats.get(a, 1.0) >= rule.p_keep]
    goes = set(ranked[:keep_n]) | (set(exempt) if not last else set())
    rows, stopped = [], {}
    pred = rec.predictions.set_index("allocation") if rec is not None else None
    for a in alive:
        have, need = status[a]
        pb = beats.get(a)
        if a == leader:
            why = "the pick: its pilot continues to the target" if last else "the leader"
        elif last:
            why = f"the last rung: only the pick {leader} goes on to the target"
        elif a in exempt:
            why = (f"{have} of {need} steps (warmup + {rule.floor_steps}): not measured yet, the step floor keeps it"
                   if have is not None else "below its step floor's budget: not measured yet, the step floor keeps it")
        elif a in goes:
            why = f"ranked {ranked.index(a) + 1} of {len(ranked)} by {rule.rank}: {why_cap}"
        else:
            pos = f"ranked {ranked.index(a) + 1} of {len(ranked)}" if a in ranked else "below p_keep"
            why = f"{pos} by {rule.rank}: {why_cap}"
            if pb is not None and pb >= 0.5:
                why += f"; stopped against the forecast's odds: P(beats the leader at T) {pb:.2f}"
        row = {"allocation": a, "budget": own(a), "observed": obs.get(a, float("nan")),
               "rank_score": score.get(a, float("nan")),
               "steps": have, "steps_needed": need, "measured": a not in exempt, "p_beats_leader": pb,
               "decision": "go on" if (a in goes or a == leader) and not (last and a != leader) else "stop",
               "reason": why}
        if pred is not None and a in pred.index:
            p = pred.loc[a]
            row.update(forecast=float(p["score"]), forecast_lo=float(p["lo"]), forecast_hi=float(p["hi"]),
                       p_best=float(p["p_best"]),
                       gate_passed=bool(p["gate_passed"]) if pd.notna(p.get("gate_passed")) else None)
        rows.append(row)
        if row["decision"] == "stop":
            stopped[a] = why
    go_on = [leader] + sorted((a for a in alive if a != leader and a not in stopped),
                              key=lambda a: (a not in ranked, ranked.index(a) if a in ranked else 0, a))
    if last:
        go_on = [leader]
        if rec is not None:
            how = ("the observed leader among the measured allocations there" if leader == observed_leader else
                   f"switched from the observed leader {observed_leader} by the forecast's expected regret")
            rec.provenance = (f"the race's pick at its last rung ({budget:.3g} FLOPs, T/{T / budget:.3g}): {how}; its "
                              f"P(best) and expected regret are over all {len(rec.predictions)} allocations the study "
                              "ran, those stopped earlier at their last readings")
    return RungDecision(rung=rung, budget=budget, next_budget=None if last else schedule.budgets[rung + 1],
                        target_budget=float(T), go_on=tuple(go_on), stopped=stopped, leader=leader, rows=rows,
                        rule=rule.as_dict(), exempt=tuple(exempt), schedule=schedule.as_dict(), recommendation=rec)


__all__ = ["FIRST_SEEDS", "GEOMETRIES", "PICKS", "RACE_FIRST_SEEDS", "RACE_RUNGS", "RANKS", "RacingRule", "RungDecision",
           "alive_at", "floor_status", "observed_scores", "readings", "rule_from", "rung_decision", "spent_flops",
           "trend_scores"]
