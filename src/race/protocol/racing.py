"""The racing study (``protocol: race``): rungs toward the target budget, each decided from the store.

    schedule: the stored one, else race_schedule(spec) (rungs sized by the grid and the cap, each
        allocation's first rung raised to its step floor: race.spec.rungs), stored before rung 0;
    for each rung k (the ladder's: GridSpec.ladder(schedule)):
        run its cells (race.spec.ladder: ladder.cells(k, names)) through race.grid.run_grid:
            rung 0: every allocation x every seed, read at the smaller budgets (nested);
            rung k > 0: the allocations that went on, their first race.later_seeds seeds,
                each EXTENDING its run of rung k-1 (its checkpoint resumed with the larger budget);
        decide who goes on: the stored decision of rung k if there is one, else
            race.analysis.racing.rung_decision on the study's tables (read_tables), stored
            (Store.record_rung_decision) before the next rung starts; the store opened once.

A decision names allocations by their names (the tables' ``allocation`` column, fixed when the
grid expanded: ``Cell.name``), and the next rung's cells are chosen by those names.

A decision is a pure function of the stored results, the stored schedule and the seed
(``rung_decision`` reads only the runs at budgets up to the rung's), and each is stored once,
so a driver killed at any point and run again makes the same decisions and runs nothing twice
(the grid driver skips complete cells and resumes interrupted ones). After the last rung only
the pick goes on: ``race validate`` continues its pilot to the target budget
(``race.protocol.target``).

The decision function is a parameter (``decide``, default ``rung_decision``) and so is the
rule (``race.rule`` of the grid file overrides :class:`~race.analysis.racing.RacingRule`'s
fields by name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from race.spec.grid import GridSpec

from .errors import ReportError



@dataclass
class RaceResult:
    """What :func:`run_race` ran and decided."""

    study: str
    study_dir: Path
    decisions: list[dict[str, Any]] = field(default_factory=list)  # RungDecision.as_dict() per rung decided
    cells: int = 0  # cells of every rung run (or found complete)
    rungs: int = 0  # rungs of its schedule
    failed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return bool(self.decisions) and self.decisions[-1].get("next_budget") is None

    @property
    def pick(self) -> str | None:
        return self.decisions[-1].get("leader") if self.finished else None


def racing_rule(overrides: dict[str, Any], later_seeds: int = 1) -> Any:
    """The racing rule with the grid file's ``race.rule`` overrides, each a field of
    :class:`~race.analysis.racing.RacingRule` (else a message naming them); its
    ``later_seeds`` (what its compute cap counts) is the grid's ``race.later_seeds``."""
    from race.analysis.racing import rule_from

    if int(overrides.get("later_seeds", later_seeds)) != int(later_seeds):
        raise ReportError(f"race.rule.later_seeds={overrides['later_seeds']} contradicts race.later_seeds="
                          f"{later_seeds}: set race.later_seeds only (the seeds that go on are the ones the rule "
                          "counts)")
    try:
        return rule_from(overrides, int(later_seeds))
    except (TypeError, ValueError) as e:
        raise ReportError(f"race.rule: {e}") from None


def race_schedule(spec: GridSpec, predictor: Any = None, *, strict: bool = True) -> Any:
    """The schedule a racing grid runs (``race.spec.rungs.RungSchedule``): its listed rungs, or
    (``rungs: auto``) the rungs the rule's geometry and cap size for its allocations; either way
    each allocation's step floor: warmup + ``rule.floor_steps`` optimizer steps at the step FLOPs
    the plan predicts (``race.grid.plan.predict_cell``: an upper bound, so the floor holds), the
    first rung at least one step of the costliest allocation. Raises ReportError saying what to
    change when nothing fits the cap (``strict=False``: the least schedule instead)."""
    from race.grid.plan import predict_cell
    from race.spec.rungs import ScheduleError

    race = spec.race
    if race is None:
        raise ReportError(f"study {spec.study}: protocol is {spec.protocol!r}; a schedule is for protocol: race grids")
    rule = racing_rule(race.rule, race.later_seeds)
    predict = predictor or predict_cell
    step: dict[str, float] = {}
    warm: dict[str, int] = {}
    for c in spec.cells():
        if c.name in step:
            continue
        pred = predict(c.config)
        step[c.name] = float(pred["step_flops"]) if pred else 0.0
        warm[c.name] = int(c.config.warmup_steps)
    mins = {a: (warm[a] + rule.floor_steps) * f for a, f in step.items() if f > 0}
    rungs = race.rung_budgets() if race.explicit else None
    try:
        return rule.schedule(list(step), race.target_budget, first_seeds=len(spec.seeds), rungs=rungs, min_budgets=mins,
                             least_budget=max(step.values(), default=0.0), strict=strict)
    except ScheduleError as e:
        raise ReportError(f"study {spec.study}: {e}") from None


def study_schedule(spec: GridSpec, study_dir: Path) -> Any:
    """The schedule stored with the study, else :func:`race_schedule` stored now (a race resumed
    keeps the schedule it started with, whatever the code's predictions became)."""
    from race.grid import Store
    from race.spec.rungs import schedule_from_dict

    with Store(study_dir) as store:
        stored = store.race_schedule()
        if stored is None:
            stored = store.record_race_schedule(race_schedule(spec).as_dict())
    return schedule_from_dict(stored)


def decide_rung(study_dir: Path, schedule: Any, rung: int, *, decide: Callable[..., Any], rule: Any,
                target: str, seed: int) -> dict[str, Any]:
    """Rung ``rung``'s decision: the stored one, else computed from the stored results and
    stored (the store opened once)."""
    from race.grid import Store, read_tables

    with Store(study_dir) as store:
        stored = store.rung_decision(rung)
        if stored is not None:
            return stored
        tables = read_tables(store)
        decision = decide(tables["runs"], tables["evals"], schedule=schedule, rung=rung, target=target, rule=rule,
                          seed=seed)
        return store.record_rung_decision(rung, schedule.budgets[rung], decision.as_dict())


def run_race(spec: GridSpec, study_dir: str | Path | None = None, *,
             decide: Callable[..., Any] | None = None, seed: int = 0,
             on_event: Callable[[Any], None] | None = None, on_rung: Callable[[dict[str, Any]], None] | None = None,
             runner: str | None = None, workers: int | None = None, threads_per_worker: int | None = None,
             ray_address: str | None = None, retry_failed: bool = False, poll_s: float = 0.5) -> RaceResult:
    """Run (or resume) a racing study into ``study_dir`` (default ``studies/<study>``), rung
    by rung (module docstring). ``decide``: the decision function (default
    ``race.analysis.racing.rung_decision``); ``on_rung``: called with each rung's decision."""
    from race.grid import run_grid
    from race.grid.runners import default_study_dir

    if not isinstance(spec, GridSpec):
        raise TypeError(f"run_race takes a GridSpec, got {type(spec).__name__}: read a grid file with "
                        "race.grid.load_grid_spec (a dict with grid_spec_from_dict)")
    if not spec.racing or spec.race is None:
        raise ReportError(f"study {spec.study}: protocol is {spec.protocol!r}; run_race runs protocol: race grids")
    if decide is None:
        from race.analysis.racing import rung_decision as decide
    rule = racing_rule(spec.race.rule, spec.race.later_seeds)
    target = spec.primary_target()
    sdir = (Path(study_dir) if study_dir is not None else default_study_dir(spec)).resolve()
    schedule = study_schedule(spec, sdir)
    ladder = spec.ladder(schedule)
    out = RaceResult(study=spec.study, study_dir=sdir, rungs=ladder.rungs)
    names: list[str] | None = None
    for rung in range(ladder.rungs):
        cells = ladder.cells(rung, names)
        res = run_grid(spec, sdir, cells=cells, runner=runner, workers=workers, threads_per_worker=threads_per_worker,
                       ray_address=ray_address, retry_failed=retry_failed, on_event=on_event, poll_s=poll_s)
        out.cells += len(cells)
        out.failed += res.failed
        out.notes += [n for n in res.notes if n not in out.notes]
        if res.refused:
            out.notes.append(f"rung {rung}: {len(res.refused)} cell(s) refused by the plan ("
                             f"{res.refused[0].refusal}); their allocations do not reach this rung")
        decision = decide_rung(sdir, schedule, rung, decide=decide, rule=rule, target=target, seed=seed)
        out.decisions.append(decision)
        if on_rung is not None:
            on_rung(decision)
        try:
            names = ladder.check(decision["go_on"])
        except ValueError as e:
            raise ReportError(f"rung {rung}'s decision names allocations the study does not hold: {e}") from None
    return out


__all__ = ["RaceResult", "decide_rung", "race_schedule", "racing_rule", "run_race", "study_schedule"]
