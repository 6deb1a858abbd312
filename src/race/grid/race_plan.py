"""What a racing study (``protocol: race``) will cost, before anything runs.

The first rung runs every allocation with every seed; each later rung extends the first
``race.later_seeds`` seeds' runs of the allocations that go on, costing only the FLOPs
between the two rungs' budgets (the shorter run is a prefix of the longer one); after the
last rung the pick's continued run is extended to the target budget T and becomes the target
run, so the last rung's budget is compute the target run reuses. Who goes on is decided as
the study runs (``race.protocol.racing``), so the plan gives two ends:

- ``all``: every allocation goes on at every rung (the most the study can spend);
- ``least``: only the leader goes on at each rung (the racing rule always keeps it);
- ``cap`` (where the caller passes the rule's ``max_unreused``): the most the rule's compute
  cap lets the pilots budget: ``max_unreused`` T not reused by the target run plus the part
  it reuses (never more than ``all``).

Both in budgeted FLOPs and in predicted spend (each cell's predicted steps x step FLOPs,
``race.grid.plan.predict_cell``), absolute and in units of T, with the part the target run
reuses, and an estimated wall time and device-hours per rung and in all (each rung a barrier:
its cells scheduled on the workers, then the decision, then the next rung), priced on the
plan's device (``race.grid.pricing``).
"""

from __future__ import annotations

from typing import Any

from pathlib import Path

from race.grid.plan import GridPlan, Predictor, default_seconds, list_schedule, plan_grid, predict_cell
from race.grid.pricing import Pricing
from race.spec.cells import Cell
from race.spec.grid import GridSpec


def _prediction(predict: Predictor, cell: Cell) -> dict[str, float] | None:
    try:
        pred = predict(cell.config)
    except Exception:  # noqa: BLE001 - priced by budget below
        return None
    if pred is not None and "est_seconds" not in pred:
        pred = {**pred, "est_seconds": default_seconds(pred["steps"], pred["total"])}
    return pred


def price_race(plan: GridPlan, predict: Predictor, max_unreused: float | None = None) -> dict[str, Any]:
    """The racing study's compute at both ends (module docstring), as a JSON-able dict; also
    adds a note per end to ``plan.notes``."""
    spec = plan.spec
    race = spec.race
    assert race is not None
    T = race.target_budget
    rungs = race.rung_budgets()
    first = [pc.cell for pc in plan.runnable]
    labels = sorted({c.label for c in first})
    names = {c.name for c in first}
    scale = plan.time_scale
    ladder = spec.ladder()  # the cells of every rung and of the target run (race.spec.ladder)
    # per (label, seed) the cell of every rung and of the target, with budget and predicted spend/seconds
    ladders: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for k in range(len(rungs)):
        for c in (first if k == 0 else ladder.cells(k, names)):
            p = _prediction(predict, c)
            ladders.setdefault((c.label, c.seed), []).append((c.budget, p["total"] if p else c.budget,
                                                              plan.seconds_of(c, p)))
    for label in labels:
        c0 = next(c for c in first if c.label == label and c.seed in spec.seeds[: race.later_seeds])
        c = next(t for t in ladder.target_cells([c0.name], T) if t.seed == c0.seed)
        p = _prediction(predict, c)
        ladders[(label, c0.seed)].append((T, p["total"] if p else T, plan.seconds_of(c, p)))

    def steps_of(ladder: list[tuple[float, float, float]], upto: int) -> list[tuple[float, float, float]]:
        """The cost of each rung's run of one trajectory up to index ``upto``: the first run
        whole, each later one only beyond the run it extends (plus a cell's fixed cost)."""
        out, prev = [], (0.0, 0.0, 0.0)
        for b, f, s in ladder[: upto + 1]:
            fixed = 0.0 if prev == (0.0, 0.0, 0.0) else plan.pricing.cell_s * scale
            out.append((b - prev[0], f - prev[1], s - prev[2] + fixed))
            prev = (b, f, s)
        return out

    continued = set(spec.seeds[: race.later_seeds])
    ends: dict[str, Any] = {}
    for end in ("all", "least"):
        per_rung = []
        for k in range(len(rungs)):
            units, b_k, f_k = [], 0.0, 0.0
            for (label, seed), ladder in ladders.items():
                if k > 0 and (seed not in continued or (end == "least" and label != labels[0])):
                    continue
                b, f, s = steps_of(ladder, k)[k]
                b_k, f_k = b_k + b, f_k + f
                units.append(s)
            per_rung.append({"rung": k, "budget": rungs[k], "cells": len(units), "pilot_budget": b_k,
                             "pilot_flops": f_k, "est_wall_s": list_schedule(sorted(units, reverse=True), plan.workers),
                             "device_hours": sum(plan.pricing.hours(u) for u in units)})
        budget, spend = sum(r["pilot_budget"] for r in per_rung), sum(r["pilot_flops"] for r in per_rung)
        ends[end] = {"pilot_budget": budget, "pilot_flops": spend, "pilot_budget_T": budget / T,
                     "pilot_flops_T": spend / T, "est_wall_s": sum(r["est_wall_s"] for r in per_rung),
                     "device_hours": sum(r["device_hours"] for r in per_rung), "rungs": per_rung}
    reused_budget = rungs[-1] * len(continued)
    reused_flops = sum(ladders[(labels[0], s)][len(rungs) - 1][1] for s in continued) if labels else 0.0
    target = [steps_of(ladders[(labels[0], s)], len(rungs))[-1] for s in sorted(continued)] if labels else []
    out = {"target_budget": T, "rungs": rungs, "reads": [b for b in spec.budgets if b < rungs[0]],
           "allocations": len(labels), "first_rung_seeds": list(spec.seeds), "later_seeds": race.later_seeds,
           "reused_budget": reused_budget, "reused_budget_T": reused_budget / T, "reused_flops": reused_flops,
           "target_extension_flops": sum(f for _, f, _ in target),
           "target_extension_wall_s": max((s for _, _, s in target), default=0.0),
           "target_extension_device_hours": max((plan.pricing.hours(s) for _, _, s in target), default=0.0),
           "unit": plan.pricing.unit, **{e: v for e, v in ends.items()}}
    if max_unreused is not None:
        cap = min(max_unreused * T + reused_budget, ends["all"]["pilot_budget"])
        out["cap"] = {"max_unreused_T": max_unreused, "pilot_budget": cap, "pilot_budget_T": cap / T}
        plan.notes.append(f"race (the racing rule's compute cap, {max_unreused:g} T not reused by the target run): "
                          f"pilots budget at most {cap:.3g} FLOPs = {cap / T:.2f} T")
    for end, what in (("all", "every allocation goes on at every rung"), ("least", "only the leader goes on")):
        e = ends[end]
        plan.notes.append(
            f"race ({what}): pilots budget {e['pilot_budget']:.3g} FLOPs = {e['pilot_budget_T']:.2f} T (predicted "
            f"spend {e['pilot_flops']:.3g} = {e['pilot_flops_T']:.2f} T), of which the target run reuses "
            f"{reused_budget:.3g} = {reused_budget / T:.2f} T (the pick's continued run at the last rung); est. wall "
            f"{e['est_wall_s']:.0f} s on {plan.workers} worker(s) ({e['device_hours']:.3g} {plan.pricing.unit}-hours), "
            f"then the target run's extension {out['target_extension_wall_s']:.0f} s")
    return out


def plan_race(spec: GridSpec, predictor: Predictor | None = None,
              study_dir: str | Path | None = None, max_unreused: float | None = None,
              price: "Pricing | None" = None, workers: int | None = None) -> GridPlan:
    """:func:`race.grid.plan.plan_grid` of the first rung's cells, with ``race`` set to the
    racing study's compute (:func:`price_race`; ``max_unreused``: the racing rule's cap) for a
    ``protocol: race`` grid; ``price`` and ``workers`` as for ``plan_grid``."""
    plan = plan_grid(spec, predictor=predictor, study_dir=study_dir, price=price, workers=workers)
    if spec.racing:
        plan.race = price_race(plan, predictor or predict_cell, max_unreused)
    return plan


__all__ = ["plan_race", "price_race"]
