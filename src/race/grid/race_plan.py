"""What a racing study (``protocol: race``) will cost, before anything runs.

The racing study runs its schedule (``race.spec.rungs.RungSchedule``: the rungs, how many
allocations are ranked onto each, every allocation's first rung raised to its step floor):
the first rung runs every allocation with every seed; each later rung extends the first
``race.later_seeds`` seeds' runs of the allocations that go on, costing only the FLOPs
between the two budgets (the shorter run is a prefix of the longer one); after the last rung
the pick's continued run is extended to the target budget T and becomes the target run, so
the last rung's budget is compute the target run reuses. Who goes on is decided as the
study runs (``race.protocol.racing``), so the plan gives three ends:

- ``schedule``: the schedule's worst case, ``keep[j]`` allocations on rung j, the ones whose
  extensions cost most (the most the race spends: its unreused part is within the cap);
- ``least``: only the leader goes on (the costliest allocation, one seed);
- ``all``: every allocation at every rung (keep-all: what racing saves).

Per rung and in all: cells, budgeted FLOPs and predicted spend (each cell's predicted steps x
step FLOPs, ``race.grid.plan.predict_cell``), the evaluations' FLOPs (each read and the run's
end: every evaluated row decoded at the maximum lengths, priced like a rollout sequence; the
step-0 evaluation once per base model, shared), and the wall time and device-hours on the
plan's device (``race.grid.pricing``; each rung a barrier: its cells on the workers, then the
decision). Compute is given in units of T as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from race.accounting.guard import steps_bought
from race.grid.plan import GridPlan, Predictor, default_seconds, list_schedule, plan_grid, predict_cell
from race.grid.pricing import Pricing
from race.spec.cells import Cell
from race.spec.grid import GridSpec
from race.spec.rungs import RungSchedule

ENDS = ("schedule", "least", "all")


def _prediction(predict: Predictor, cell: Cell) -> dict[str, float] | None:
    try:
        pred = predict(cell.config)
    except Exception:  # noqa: BLE001 - priced by budget below
        return None
    if pred is not None and "est_seconds" not in pred:
        pred = {**pred, "est_seconds": default_seconds(pred["steps"], pred["total"])}
    return pred


def eval_flops(cell: Cell, pred: dict[str, float] | None, *, step0: bool = False, after: float = 0.0) -> float:
    """FLOPs of a run's evaluations (module docstring): its reads (``eval.at_budgets``) above
    ``after`` (an extension's parent evaluated the ones below) and its end, plus step 0 when
    ``step0``; each evaluated row (greedy and hard problems, ``pass_k`` samples per pass
    problem) at a rollout sequence's predicted FLOPs."""
    cfg = cell.config
    ev, steps = cfg.eval, (pred or {}).get("steps") or 0
    n_seq = cfg.prompts_per_step * cfg.num_generations
    if not pred or not steps or not n_seq:
        return 0.0
    rows = (ev.n_problems if "greedy" in ev.targets else 0) + (ev.n_hard_problems if "hard" in ev.targets else 0)
    rows += ev.n_pass_problems * ev.pass_k if {"pass@k", "pass@1"} & set(ev.targets) else 0
    reads = sum(1 for b in ev.at_budgets if b > after * (1 + 1e-9))
    points = reads + (ev.num_points if ev.every_flops is None else max(1, steps_bought(cfg.budget_flops, ev.every_flops)))
    return (points + (1 if step0 else 0)) * rows * float(pred.get("rollout") or 0.0) / steps / n_seq


def _trajectories(plan: GridPlan, predict: Predictor, schedule: RungSchedule) -> dict[tuple[str, int], list[dict]]:
    """Per (allocation, seed) the cost of each rung's cell beyond the one it extends (and of the
    target run, last): budget, predicted FLOPs, evaluation FLOPs, seconds."""
    spec, T = plan.spec, schedule.target_budget
    ladder = spec.ladder(schedule)
    models_seen: set[str] = set()
    out: dict[tuple[str, int], list[dict]] = {}
    for k in range(ladder.rungs):
        for c in ladder.cells(k):
            prev = out.get((c.name, c.seed), [])
            if prev and c.budget <= prev[-1]["at"] * (1 + 1e-9):  # the floor spans this rung: the same run
                out[(c.name, c.seed)].append({**prev[-1], "budget": 0.0, "flops": 0.0, "eval": 0.0, "seconds": 0.0})
                continue
            out.setdefault((c.name, c.seed), []).append(_cost(plan, predict, c, prev, models_seen))
    for name in ladder.names:
        for c in ladder.target_cells([name], T):
            out[(name, c.seed)].append(_cost(plan, predict, c, out[(name, c.seed)], models_seen))
    return out


def _cost(plan: GridPlan, predict: Predictor, c: Cell, prev: list[dict], models_seen: set[str]) -> dict:
    p = _prediction(predict, c)
    first = not prev
    shared = first and c.config.model not in models_seen
    models_seen.add(c.config.model)
    flops = p["total"] if p else c.budget
    before = sum(x["flops"] for x in prev)
    return {"at": c.budget, "budget": c.budget - sum(x["budget"] for x in prev), "flops": flops - before,
            "eval": eval_flops(c, p, step0=shared, after=prev[-1]["at"] if prev else 0.0),
            "seconds": plan.seconds_of(c, p) - sum(x["seconds"] for x in prev) + (0.0 if first else
                                                                                  plan.pricing.cell_s * plan.time_scale)}


def _end(plan: GridPlan, traj: dict[tuple[str, int], list[dict]], schedule: RungSchedule, end: str,
         continued: set[int]) -> dict[str, Any]:
    """One end's cost per rung and in all (module docstring)."""
    rungs = len(schedule.budgets)
    per_rung = []
    for k in range(rungs):
        units = [(key, steps[k]) for key, steps in traj.items() if k == 0 or key[1] in continued]
        if k > 0 and end != "all":
            n = schedule.keep[k] if end == "schedule" else 1
            by_name: dict[str, float] = {}
            for (name, _), u in units:
                by_name[name] = by_name.get(name, 0.0) + u["budget"]
            top = set(sorted(by_name, key=lambda a: (-by_name[a], a))[:n])
            units = [(key, u) for key, u in units if key[0] in top]
        live = [u for _, u in units if u["budget"] > 0]
        per_rung.append({"rung": k, "budget": schedule.budgets[k], "cells": len(live),
                         "pilot_budget": sum(u["budget"] for u in live), "pilot_flops": sum(u["flops"] for u in live),
                         "eval_flops": sum(u["eval"] for u in live),
                         "est_wall_s": list_schedule(sorted((u["seconds"] for u in live), reverse=True), plan.workers),
                         "device_hours": sum(plan.pricing.hours(u["seconds"]) for u in live)})
    T = schedule.target_budget
    tot = {k: sum(r[k] for r in per_rung) for k in ("pilot_budget", "pilot_flops", "eval_flops", "est_wall_s",
                                                     "device_hours")}
    return {**tot, "pilot_budget_T": tot["pilot_budget"] / T, "pilot_flops_T": tot["pilot_flops"] / T,
            "eval_flops_T": tot["eval_flops"] / T, "rungs": per_rung}


def price_race(plan: GridPlan, predict: Predictor, schedule: RungSchedule) -> dict[str, Any]:
    """The racing study's compute at the three ends (module docstring), as a JSON-able dict;
    also adds a note per end to ``plan.notes``."""
    spec = plan.spec
    race = spec.race
    assert race is not None
    T = schedule.target_budget
    traj = _trajectories(plan, predict, schedule)
    continued = set(spec.seeds[: race.later_seeds])
    ends = {end: _end(plan, traj, schedule, end, continued) for end in ENDS}
    worst = schedule.cost()
    names = spec.ladder(schedule).names
    target = [steps[-1] for (name, seed), steps in traj.items() if seed in continued]
    out = {"target_budget": T, "rungs": list(schedule.budgets), "keep": list(schedule.keep),
           "first_rungs": {a: schedule.budget_of(a, 0) for a in names},
           "floors": {a: schedule.min_budgets.get(a) for a in names},
           "reads": [b for b in spec.budgets if b < schedule.budgets[0]], "allocations": len(names),
           "first_rung_seeds": list(spec.seeds), "later_seeds": race.later_seeds,
           "reused_budget": worst["reused"], "reused_budget_T": worst["reused_T"],
           "unreused_T": worst["unreused_T"], "cap": schedule.cap, "fits": schedule.fits(),
           "target_extension_flops": max((u["flops"] for u in target), default=0.0),
           "target_extension_wall_s": max((u["seconds"] for u in target), default=0.0),
           "target_extension_device_hours": max((plan.pricing.hours(u["seconds"]) for u in target), default=0.0),
           "unit": plan.pricing.unit, **ends}
    for end, what in (("schedule", "the schedule's worst case"), ("least", "only the leader goes on"),
                      ("all", "every allocation at every rung")):
        e = ends[end]
        plan.notes.append(
            f"race ({what}): pilots budget {e['pilot_budget']:.3g} FLOPs = {e['pilot_budget_T']:.2f} T (predicted "
            f"spend {e['pilot_flops']:.3g} = {e['pilot_flops_T']:.2f} T; evaluations {e['eval_flops']:.3g} = "
            f"{e['eval_flops_T']:.2f} T), of which the target run reuses {worst['reused']:.3g} = "
            f"{worst['reused_T']:.2f} T; est. wall {e['est_wall_s']:.0f} s on {plan.workers} worker(s) "
            f"({e['device_hours']:.3g} {plan.pricing.unit}-hours), then the target run's extension "
            f"{out['target_extension_wall_s']:.0f} s")
    return out


def plan_race(spec: GridSpec, schedule: RungSchedule, predictor: Predictor | None = None,
              study_dir: str | Path | None = None, price: "Pricing | None" = None,
              workers: int | None = None) -> GridPlan:
    """:func:`race.grid.plan.plan_grid` of the first rung's cells under ``schedule`` (the study's:
    ``race.protocol.racing.race_schedule``), with ``race`` set to the racing study's compute
    (:func:`price_race`); ``price`` and ``workers`` as for ``plan_grid``."""
    plan = plan_grid(spec, predictor=predictor, study_dir=study_dir, cells=spec.ladder(schedule).cells(0), price=price,
                     workers=workers)
    plan.race = price_race(plan, predictor or predict_cell, schedule)
    return plan


__all__ = ["ENDS", "eval_flops", "plan_race", "price_race"]
