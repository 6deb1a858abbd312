"""The racing protocol's decisions: who goes on at each rung, and the pick after the last.

A racing study runs its pilots in *rungs* toward the target budget T (for example T/32,
T/8, T/3): the first rung runs every allocation with 2-3 seeds (nested: read at a few
smaller budgets too), each later rung extends the allocations that go on (by resuming
their runs at a constant learning rate, so a rung's runs are prefixes of the next rung's).
After each rung :func:`rung_decision` says which allocations go on; after the last one
:func:`race_pick` is the recommendation, and its allocation's pilot is continued to T.

Both are pure functions of the study's tables (``race.grid.load_tables``) and ``seed``: a
killed study resumed from its store makes the same decisions. The decision at rung k reads
only the runs at budgets <= the rung's budget (later rungs' runs, when the store already
holds them, are ignored) and only the allocations with a complete run at the rung's budget
(the ones that went on to it); the driver calls it once the rung's runs are complete.

The rule (:class:`RacingRule`): the analysis of :func:`race.analysis.recommend.recommend`
on those runs forecasts every allocation at T with its ``level`` interval (joint
replicates, back-tested extrapolation error); the leader is the pick there. An allocation
goes on when the upper end of its interval at T is at least the leader's lower end: it may
still beat the leader at T. After the last rung only the pick goes on (its pilot becomes
the target run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from race.accounting.guard import is_budget

from .joint import draw_replicates, study_matrix
from .recommend import Recommendation, recommend, standings
from .tables import allocation_key, jsonable, prepare_runs, without_controls

RTOL = 1e-9  # budgets closer than this (relative) are the same rung


@dataclass(frozen=True)
class RacingRule:
    """Who goes on at each rung (module docstring).

    ``level``: the interval level of the forecasts at T (and of the observed standings);
    an allocation goes on when its upper end at T reaches the leader's lower end.
    ``n_boot``: joint bootstrap replicates. ``method``: the forecast method of
    :func:`race.analysis.recommend.recommend`.

    Provisional values (0.95, 200, joint): the defaults of ``recommend``, not yet tuned; the
    values frozen on the tuning generator before the test generator runs are recorded here
    when the racing benchmark has run."""

    level: float = 0.95
    n_boot: int = 200
    method: str = "joint"

    def __post_init__(self) -> None:
        if not 0.5 < self.level < 1:
            raise ValueError(f"RacingRule.level must be in (0.5, 1), got {self.level!r}")
        if int(self.n_boot) < 20:
            raise ValueError(f"RacingRule.n_boot must be >= 20 replicates, got {self.n_boot!r}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class RungDecision:
    """Who goes on after one rung, and why (JSON-able through :meth:`as_dict`)."""

    rung: int  # index of the rung just finished (0 = the first)
    budget: float  # that rung's budget in FLOPs
    next_budget: float | None  # the next rung's budget (None after the last rung)
    target_budget: float  # T
    go_on: tuple[str, ...]  # allocation keys that continue, leader first
    stopped: dict[str, str]  # allocation key -> one-line reason it stops here
    leader: str | None
    rows: list[dict] = field(default_factory=list)  # per allocation: observed, forecast, P(best), gate, decision
    rule: dict = field(default_factory=dict)  # RacingRule.as_dict()

    def as_dict(self) -> dict:
        return jsonable({k: getattr(self, k) for k in self.__dataclass_fields__})


def _check(target_budget: float, rung_budgets: Sequence[float], rung: int | None = None) -> list[float]:
    if not is_budget(target_budget):
        raise ValueError(f"target_budget must be a positive number of FLOPs, got {target_budget!r}")
    budgets = [float(b) for b in rung_budgets]
    if not budgets or not all(is_budget(b) for b in budgets) or any(b >= c for b, c in zip(budgets, budgets[1:])):
        raise ValueError(f"rung_budgets must be positive and increasing, got {list(rung_budgets)!r}")
    if budgets[-1] > target_budget * (1 + RTOL):
        raise ValueError(f"the last rung's budget {budgets[-1]:.3g} is beyond the target budget {target_budget:.3g}")
    if rung is not None and rung not in range(len(budgets)):
        raise ValueError(f"rung must be in 0..{len(budgets) - 1} (the rungs' indices), got {rung!r}")
    return budgets


def rung_tables(runs: pd.DataFrame, evals: pd.DataFrame, budget: float, condition: str | None = None,
                ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """(runs, evals) the decision at a rung of ``budget`` reads, and the allocations that reached it.

    Kept: complete runs at budgets <= ``budget`` of the allocations with a complete run at
    ``budget`` (random-reward controls of any budget <= ``budget`` too, for the gate).
    The dict maps the allocation key of the restricted tables (what ``recommend`` names)
    to the key on the whole study (:func:`race.analysis.tables.allocation_key`)."""
    prepared = prepare_runs(runs)
    keep_budget = prepared["budget"].to_numpy(float) <= budget * (1 + RTOL)
    cand = without_controls(prepared[keep_budget])
    if condition is not None:
        cand = cand[cand["reward_system"] == condition]
    at = np.isclose(cand["budget"].to_numpy(float), budget, rtol=RTOL, atol=0.0)
    alive = set(cand.loc[at, "allocation"])
    ctrl = prepared[keep_budget & ~prepared.index.isin(without_controls(prepared).index)]
    kept = prepared.loc[sorted(set(cand.index[cand["allocation"].isin(alive)]) | set(ctrl.index))]
    sub = runs[runs["run_id"].isin(set(kept["run_id"]))]
    local = dict(zip(sub["run_id"], allocation_key(sub))) if len(sub) else {}
    names = {local[r]: a for r, a in zip(kept["run_id"], kept["allocation"]) if r in local}
    return sub, evals[evals["run_id"].isin(set(sub["run_id"]))], names


def _observed(evals: pd.DataFrame, runs: pd.DataFrame, target: str, budget: float, allocs: list[str],
              n_boot: int, level: float, seed: int) -> dict[str, tuple[float, float, float]]:
    """Observed seed-mean score at equal FLOPs at ``budget`` with its ``level`` interval (seeds and problems)."""
    sm = study_matrix(evals, runs, target)
    reps = draw_replicates(sm, n_boot, np.random.default_rng([seed, 7]))
    names, pts, rep = standings(sm, reps, allocs, budget)
    q = (1 - level) / 2
    return {a: (float(p), float(np.quantile(rep[:, i], q)), float(np.quantile(rep[:, i], 1 - q)))
            for i, (a, p) in enumerate(zip(names, pts))}


def _analyse(runs: pd.DataFrame, evals: pd.DataFrame, budget: float, target_budget: float, target: str,
             condition: str | None, rule: RacingRule, seed: int,
             ) -> tuple[Recommendation, dict[str, str], pd.DataFrame, pd.DataFrame]:
    sub_runs, sub_evals, names = rung_tables(runs, evals, budget, condition)
    if not names:
        raise ValueError(f"no complete run of any allocation at the rung budget {budget:.3g} "
                         f"(condition {condition!r}): the rung has not run yet")
    rec = recommend(sub_evals, sub_runs, target, target_budget, reward_system=condition, method=rule.method,
                    n_boot=rule.n_boot, rng=seed, level=rule.level)
    return rec, names, sub_runs, sub_evals


def rung_decision(runs: pd.DataFrame, evals: pd.DataFrame, *, target_budget: float, rung_budgets: Sequence[float],
                  rung: int, target: str = "greedy", condition: str | None = None,
                  rule: RacingRule = RacingRule(), seed: int = 0) -> RungDecision:
    """Who goes on after rung ``rung`` (module docstring); a pure function of the tables and ``seed``."""
    budgets = _check(target_budget, rung_budgets, rung)
    budget = budgets[rung]
    rec, names, sub_runs, sub_evals = _analyse(runs, evals, budget, target_budget, target, condition, rule, seed)
    pred = rec.predictions
    allocs = [str(a) for a in pred["allocation"]]
    obs = _observed(sub_evals, sub_runs, target, budget, allocs, rule.n_boot, rule.level, seed)
    leader = rec.allocation
    last = rung == len(budgets) - 1
    lead_lo = float(pred.loc[pred["allocation"] == leader, "lo"].iloc[0])
    rows, go_on, stopped = [], [], {}
    for _, p in pred.iterrows():
        a = str(p["allocation"])
        o = obs.get(a, (float("nan"),) * 3)
        if a == leader:
            on, why = True, ("the pick: its pilot continues to the target" if last else "the leader")
        elif last:
            on, why = False, f"the last rung: only the pick {names[leader]} goes on to the target"
        elif float(p["hi"]) >= lead_lo:
            on, why = True, (f"its upper end at T {float(p['hi']):.3f} reaches the leader's lower end "
                             f"{lead_lo:.3f}: it may still win")
        else:
            on, why = False, (f"its upper end at T {float(p['hi']):.3f} is below the leader's lower end "
                              f"{lead_lo:.3f}")
        key = names.get(a, a)
        rows.append({"allocation": key, "observed": o[0], "observed_lo": o[1], "observed_hi": o[2],
                     "forecast": float(p["score"]), "forecast_lo": float(p["lo"]), "forecast_hi": float(p["hi"]),
                     "p_best": float(p["p_best"]), "gate_passed": bool(p["gate_passed"]) if pd.notna(p["gate_passed"]) else None,
                     "decision": "go on" if on else "stop", "reason": why})
        if on:
            go_on.append(key)
        else:
            stopped[key] = why
    return RungDecision(rung=rung, budget=budget, next_budget=None if last else budgets[rung + 1],
                        target_budget=float(target_budget), go_on=tuple(go_on), stopped=stopped,
                        leader=names.get(leader, leader), rows=rows, rule=rule.as_dict())


def race_pick(runs: pd.DataFrame, evals: pd.DataFrame, *, target_budget: float, rung_budgets: Sequence[float],
              target: str = "greedy", condition: str | None = None, rule: RacingRule = RacingRule(),
              seed: int = 0) -> Recommendation:
    """The recommendation after the last rung: the analysis of the allocations that reached it,
    on the runs at budgets <= the last rung's (module docstring)."""
    budgets = _check(target_budget, rung_budgets)
    rec, names, _, _ = _analyse(runs, evals, budgets[-1], target_budget, target, condition, rule, seed)
    rec.allocation = names.get(rec.allocation, rec.allocation)
    if rec.default_allocation is not None:
        rec.default_allocation = names.get(rec.default_allocation, rec.default_allocation)
    if rec.runner_up is not None:
        rec.runner_up = names.get(rec.runner_up, rec.runner_up)
    rec.predictions = rec.predictions.assign(allocation=[names.get(a, a) for a in rec.predictions["allocation"]])
    return rec
