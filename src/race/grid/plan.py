"""Dry run: what each cell will cost, which cells are refused, and the totals.

The FLOP prediction comes from ``race.accounting`` through one adapter,
:func:`predict_cell`; everything else here is bookkeeping over its numbers. A cell whose
budget buys fewer than ``min_steps`` optimizer steps is refused: a run that cannot take a
few steps says nothing about its allocation. A cell is also refused when a worker would
fail on it anyway, after the grid had started (``race.grid.preflight``): a data file that is
not there, a model, tokenizer chat template or reward model that cannot be loaded, settings
its engine refuses.

Seconds and device-hours come from ``race.grid.pricing`` on one device of the table
(``race grid plan --device``; default ``cpu``, the plan's original CPU model).

A nested grid (``nested: true``) plans only the largest budget's cells; the plan also
prices the separate runs they stand for (``separate``: the same grid with ``nested:
false``) and says what the prefixes save.

The wall-time estimate schedules the grid's units of work (cells, or gangs with ``gang:
true``: ``race.grid.gangs.gang_units``) on ``workers`` slots in the order the runner hands
them out (:func:`list_schedule`), so a grid whose last long unit runs alone is priced as
such. A gang's wall time is taken as its members' sum: on a 2-core CPU a gang measured
0.96-1.36x its members' solo run-steps per second (docs/design.md, gangs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from race.accounting.devices import plan_device
from race.grid.pricing import CPU_CELL_SECONDS, CPU_STEP_SECONDS, Pricing, pricing, study_runs
from race.spec.cells import Cell
from race.spec.grid import DEFAULT_CELL_FN, GridSpec
from race.spec.run import RunConfig

# Wall-time model of one cell on one CPU worker: steps x per-step overhead + FLOPs / rate.
# Tiny models are overhead-bound (docs/design.md section 4), so both terms matter. Rough
# defaults; plan_grid rescales them by what the study's finished runs actually took.
# Measured on the demo grid (2 workers x 1 thread, 2-core CPU): tiny-xs 0.25-0.3 s per
# step, ~1 s per evaluation point (3 per cell) and ~1 s to load a cell's models. Runs take
# ~1.5x the predicted steps (the prediction is the fewest steps, at the longest
# sequences), hence 0.4 s per predicted step. The rate is the device table's cpu row.
ASSUMED_FLOPS_PER_SECOND = plan_device("cpu").peak("fp32") or 5e10
ASSUMED_SECONDS_PER_STEP = CPU_STEP_SECONDS
ASSUMED_SECONDS_PER_CELL = CPU_CELL_SECONDS


def list_schedule(durations: list[float], workers: int) -> float:
    """Makespan of greedy list scheduling: each unit, in the given order, starts on the
    first worker to come free. Graham's bound: sum / workers <= makespan <= sum / workers
    + max(durations) (the last unit may start when every other worker is about to end)."""
    free = [0.0] * max(1, int(workers))
    for d in durations:
        i = min(range(len(free)), key=free.__getitem__)
        free[i] += float(d)
    return max(free)


def unit_seconds(cells: list[Cell], seconds: dict[str, float], *, gang: bool, gang_size: int, order: str) -> list[float]:
    """Predicted wall seconds of the grid's units of work (module docstring: a gang's is
    its members' sum), in the order the runner hands them out (``runner.order``:
    ``longest_first`` or ``grid``; ``race.grid.runners``)."""
    from race.grid.gangs import gang_units

    secs = [sum(seconds[c.run_id] for c in u) for u in gang_units(cells, gang=gang, gang_size=gang_size)]
    return sorted(secs, reverse=True) if order == "longest_first" else secs


def default_seconds(steps: float, flops: float) -> float:
    """Uncalibrated wall-time guess for a cell of ``steps`` steps spending ``flops``
    FLOPs: a fixed cost (loading models, evaluations) + per-step overhead + FLOPs at a
    CPU-like rate."""
    return ASSUMED_SECONDS_PER_CELL + steps * ASSUMED_SECONDS_PER_STEP + flops / ASSUMED_FLOPS_PER_SECOND

Predictor = Callable[[RunConfig], "dict[str, float] | None"]


def predict_cell(cfg: RunConfig) -> dict[str, float]:
    """Predicted cost of one run: ``steps, step_flops, rollout, learning, feedback, total,
    est_seconds``. Phase numbers are totals over the predicted steps (learning = update +
    old-policy + reference log-probs; feedback = reward).

    The step comes from :func:`race.estimate.run_step_flops` (a Qwen2.5 hub model not yet
    downloaded is read from its preset: ``race.models.refs.plan_shape``): every sequence is taken at
    ``max_prompt_length + max_completion_length`` (the step's upper bound, prompts not
    shared across the group), so ``steps`` is the fewest the budget buys; a judge is taken
    to write ``max_completion_length`` tokens per verdict; the steps bought are
    ``race.accounting.guard.steps_bought``.
    """
    from race.accounting import split_sums, steps_bought
    from race.estimate import run_step_flops
    from race.models.refs import plan_shape

    step = run_step_flops(cfg, plan_shape(cfg.model))
    axes = split_sums(step.as_dict())
    rollout, learning, feedback = (float(v) for v in axes.values())  # SPLIT's order
    total_step = float(step.total)
    steps = steps_bought(cfg.budget_flops, total_step, cfg.max_steps)
    return {
        "steps": steps,
        "step_flops": total_step,
        "rollout": rollout * steps,
        "learning": learning * steps,
        "feedback": feedback * steps,
        "total": total_step * steps,
        "est_seconds": default_seconds(steps, total_step * steps),
    }


@dataclass
class PlannedCell:
    cell: Cell
    prediction: dict[str, float] | None
    refusal: str | None = None
    cannot_run: bool = False  # refused because a worker would fail on it (race.grid.preflight), not by min_steps

    def split_pct(self) -> tuple[float, float, float] | None:
        p = self.prediction
        if not p or not p["total"]:
            return None
        t = p["total"]
        return 100 * p["rollout"] / t, 100 * p["learning"] / t, 100 * p["feedback"] / t


@dataclass
class GridPlan:
    spec: GridSpec
    cells: list[PlannedCell]
    workers: int
    time_scale: float = 1.0  # observed / default wall time of the study's finished runs
    notes: list[str] = field(default_factory=list)
    separate: dict[str, float] | None = None  # nested: budget and est. wall of the separate runs instead
    race: dict[str, Any] | None = None  # protocol: race: the rungs' and the target run's compute (race_plan.plan_race)
    pricing: Pricing = field(default_factory=pricing)  # the device and MFU the seconds are priced at

    @property
    def runnable(self) -> list[PlannedCell]:
        return [c for c in self.cells if c.refusal is None]

    @property
    def refused(self) -> list[PlannedCell]:
        return [c for c in self.cells if c.refusal is not None]

    @property
    def cannot_run(self) -> list[PlannedCell]:
        """The refused cells a worker would fail on (``race grid plan`` exits non-zero on
        them); the others are below ``min_steps``, the grid's own rule."""
        return [c for c in self.cells if c.cannot_run]

    @property
    def total_budget(self) -> float:
        return sum(c.cell.budget for c in self.runnable)

    @property
    def total_predicted_flops(self) -> float | None:
        if any(c.prediction is None for c in self.runnable):
            return None
        return sum(c.prediction["total"] for c in self.runnable)  # type: ignore[index]

    def cell_seconds(self, c: PlannedCell) -> float:
        """Predicted wall seconds of one cell (budget-based where it has no prediction)."""
        return c.prediction["est_seconds"] if c.prediction else self.time_scale * self.pricing.budget_seconds(
            c.cell.budget)

    def seconds_of(self, cell: Cell, pred: dict[str, float] | None) -> float:
        """Predicted wall seconds of any run of this grid (a later rung's, the target's) from
        its prediction, priced and calibrated as the plan's cells are."""
        return self.time_scale * (self.pricing.cell_seconds(pred, cell.config) if pred
                                  else self.pricing.budget_seconds(cell.budget))

    def cell_hours(self, c: PlannedCell) -> float:
        """Device-hours of one cell (its seconds x the devices it holds)."""
        return self.pricing.hours(self.cell_seconds(c))

    @property
    def device_hours(self) -> float:
        """Device-hours of the runnable cells (busy time; idle workers are not counted)."""
        return sum(self.cell_hours(c) for c in self.runnable)

    @property
    def est_wall_s(self) -> float:
        """Predicted wall time: the runnable cells' units (cells or gangs) scheduled on
        ``workers`` slots in the runner's order (:func:`list_schedule`)."""
        spec = self.spec
        secs = {c.cell.run_id: self.cell_seconds(c) for c in self.runnable}
        return list_schedule(unit_seconds([c.cell for c in self.runnable], secs, gang=spec.gang,
                                          gang_size=spec.gang_size, order=spec.runner.order), self.workers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "study": self.spec.study,
            "cells": [
                {"run_id": c.cell.run_id, "allocation": c.cell.allocation, "budget": c.cell.budget,
                 "seed": c.cell.seed, "prediction": c.prediction, "refusal": c.refusal, "cannot_run": c.cannot_run,
                 "est_seconds": self.cell_seconds(c), "device_hours": self.cell_hours(c)}
                for c in self.cells
            ],
            "total_budget": self.total_budget,
            "total_predicted_flops": self.total_predicted_flops,
            "est_wall_s": self.est_wall_s,
            "device_hours": self.device_hours,
            "device": {"name": self.pricing.device.key, "unit": self.pricing.unit, "mfu": self.pricing.mfu,
                       "mfu_source": self.pricing.mfu_source, "gpus_per_cell": self.pricing.gpus_per_cell},
            "workers": self.workers,
            "notes": self.notes,
            "separate": self.separate,
            "race": self.race,
        }


def _time_scale(study_dir: Path | None, predicted: dict[str, float], price: Pricing) -> tuple[float | None, int]:
    """Observed / predicted wall time summed over the study's finished runs (a ratio of
    sums, so the long cells that dominate a grid's wall time dominate the calibration).
    ``predicted``: this plan's uncalibrated estimate per run id; runs outside the plan
    are priced from their actual steps and phase FLOPs (:func:`default_seconds` on the CPU)."""
    if study_dir is None:
        return None, 0
    pairs = []
    for r in study_runs(study_dir):
        if not r.get("wall_s"):
            continue
        guess = predicted.get(r["run_id"])
        if guess is None and (r.get("steps") or r.get("total_flops")):
            guess = (default_seconds(r["steps"] or 0, r["total_flops"] or 0.0) if not price.device.gpu else
                     price.cell_seconds({**r["flops"], "steps": r["steps"] or 0, "total": r["total_flops"] or 0.0},
                                        RunConfig.model_validate(r["config"])))
        if guess:
            pairs.append((r["wall_s"], guess))
    return (sum(o for o, _ in pairs) / sum(g for _, g in pairs), len(pairs)) if pairs else (None, 0)


def cell_refusal(cfg: RunConfig, *, models: bool = True) -> str | None:
    """Why a worker would refuse ``cfg`` before spending anything, or None
    (:func:`race.grid.preflight.cell_check`)."""
    from race.grid.preflight import cell_refusal as refusal

    return refusal(cfg, models=models)


def _plan_cell(cell: Cell, spec: GridSpec, predict: Predictor, price: Pricing
               ) -> tuple[PlannedCell, str | None, list[str]]:
    """One cell planned: its prediction (priced), its refusal (a worker would fail on it:
    ``race.grid.preflight``; or below ``min_steps``), the prediction's failure and the
    preflight's notes."""
    from race.grid.preflight import cell_check

    failure = None
    try:
        pred = predict(cell.config)
    except Exception as e:  # a prediction problem must not hide the plan
        msg = f"{type(e).__name__}: {e}"
        failure, pred = (msg if len(msg) <= 160 else msg[:157] + "..."), None
    if pred is not None:
        pred = {**pred, "est_seconds": price.cell_seconds(pred, cell.config)}
    refusal, notes = cell_check(cell.config, models=spec.cell_fn == DEFAULT_CELL_FN)
    cannot_run = refusal is not None
    if refusal is None and pred is not None and pred["steps"] < spec.min_steps:
        need = spec.min_steps * pred["step_flops"]
        refusal = (f"budget {cell.budget:.3g} buys {int(pred['steps'])} step(s) of {pred['step_flops']:.3g} FLOPs, "
                   f"fewer than min_steps={spec.min_steps}: raise this budget to >= {need:.3g}, make the step "
                   "cheaper (smaller model, group or batch), or lower min_steps")
    return PlannedCell(cell, pred, refusal, cannot_run), failure, notes


def plan_grid(spec: GridSpec, predictor: Predictor | None = None,
              study_dir: str | Path | None = None, cells: "list[Cell] | None" = None,
              price: Pricing | None = None, workers: int | None = None) -> GridPlan:
    """Expand the grid and predict every cell (``cells``: these cells of it instead, e.g. one
    rung of a racing grid). ``predictor`` defaults to :func:`predict_cell`; ``price``: the
    device and MFU the seconds are priced at (default the CPU, ``race.grid.pricing``); with
    ``study_dir`` the wall-time estimate is calibrated on the study's finished runs;
    ``workers``: cells in flight (default the grid's, else ``race.grid.local.default_workers``).
    A racing grid's rungs and target run are priced by ``race.grid.race_plan.plan_race``."""
    price = price or pricing()
    notes: list[str] = []
    predict = predictor or predict_cell
    planned: list[PlannedCell] = []
    failures: dict[str, int] = {}
    said: list[str] = []
    for cell in (spec.cells() if cells is None else cells):
        pc, failure, more = _plan_cell(cell, spec, predict, price)
        planned.append(pc)
        said += [n for n in more if n not in said]
        if failure is not None and not pc.cannot_run:  # a cell that cannot run says why already
            failures[failure] = failures.get(failure, 0) + 1
    notes += said
    scale, n_obs = _time_scale(Path(study_dir) if study_dir else None,
                               {c.cell.run_id: c.prediction["est_seconds"] for c in planned if c.prediction}, price)
    if scale:
        notes.append(f"wall time calibrated on {n_obs} finished run(s) of this study: they took {scale:.3g}x the "
                     f"{'default guess' if not price.device.gpu else 'prediction'}; {price.describe()}")
        for c in planned:
            if c.prediction:
                c.prediction["est_seconds"] *= scale
    else:
        scale = 1.0
        notes.append(f"wall time is a rough guess ({price.describe()}); `race grid plan --study-dir` calibrates it "
                     "on finished runs")
    for msg, n in failures.items():
        notes.append(f"no FLOP prediction for {n} cell(s) ({msg}); min_steps not checked for them")
    if all(c.prediction is None for c in planned) and not failures:
        notes.append("no FLOP prediction: the predictor gave none; min_steps not checked")
    if workers is None:
        from race.grid.local import default_workers

        workers = default_workers(spec.runner)
    plan = GridPlan(spec=spec, cells=planned, workers=workers, time_scale=scale, notes=notes, pricing=price)
    if spec.gang:
        from race.grid.gangs import gang_units

        units = gang_units([c.cell for c in plan.runnable], gang=True, gang_size=spec.gang_size)
        gangs = [len(u) for u in units if len(u) > 1]
        notes.append(f"gang: {len(gangs)} gang(s) of {min(gangs, default=0)}-{max(gangs, default=0)} members and "
                     f"{len(units) - len(gangs)} cell(s) alone, {len(units)} unit(s) on {workers} worker(s); a gang's "
                     "wall time is taken as its members' sum (a 2-core CPU measured 0.96-1.36x; docs/design.md)")
    if spec.nested and not spec.racing:
        _price_nested(plan, predict)
    return plan


def _price_nested(plan: GridPlan, predict: Predictor) -> None:
    """Price the separate runs a nested grid's prefixes stand for (those a flat grid would
    run: not below ``min_steps``) and note the saving; note prefixes that buy fewer than
    ``min_steps`` steps."""
    from race.accounting import steps_bought
    from race.spec.cells import nested_budgets

    spec = plan.spec
    _, prefixes = nested_budgets(spec)
    flat = spec.with_settings(nested=False)
    runnable = {(c.cell.label, c.cell.seed) for c in plan.runnable}
    budget, n_flat = 0.0, 0
    flat_cells: list[Cell] = []
    seconds: dict[str, float] = {}
    for cell in flat.cells():
        if (cell.label, cell.seed) not in runnable:
            continue
        try:
            pred = predict(cell.config)
        except Exception:  # noqa: BLE001 - priced by budget below
            pred = None
        if pred is not None and pred["steps"] < spec.min_steps:
            continue  # the flat grid would refuse this cell: it would not run either
        budget += cell.budget
        n_flat += 1
        flat_cells.append(cell)
        seconds[cell.run_id] = plan.seconds_of(cell, pred)
    secs = list_schedule(unit_seconds(flat_cells, seconds, gang=spec.gang, gang_size=spec.gang_size,
                                      order=spec.runner.order), plan.workers)
    plan.separate = {"total_budget": budget, "est_wall_s": secs}
    if budget:
        plan.notes.append(
            f"nested: {len(plan.runnable)} run(s) at the largest budget, read at their prefixes for the budgets "
            f"{', '.join(f'{x:.3g}' for x in prefixes)} (eval.at_budgets; a constant learning rate makes a prefix "
            f"the shorter run), replace {n_flat} separate runs: {plan.total_budget:.3g} FLOPs budgeted instead of "
            f"{budget:.3g} ({100 * (1 - plan.total_budget / budget):.0f}% less), est. wall {plan.est_wall_s:.0f} s "
            f"instead of {secs:.0f} s")
    short = sorted({c.cell.label for c in plan.runnable if c.prediction and c.prediction.get("step_flops")
                    and steps_bought(prefixes[0], c.prediction["step_flops"]) < spec.min_steps})
    if short:
        plan.notes.append(f"nested: the prefix at {prefixes[0]:.3g} buys fewer than min_steps={spec.min_steps} "
                          f"step(s) for {', '.join(short)}: its reading there says little; raise the smallest budget")
