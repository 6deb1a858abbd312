"""The validation stage: run the recommendation and its strongest rivals at the target
budget, into the same study store, and measure the realised regret.

The grid runs cells of a grid file; it has no call for "run these RunConfigs into this
study". The adapter here builds, for each allocation to validate, a one-budget grid
spec whose ``base`` is the stored RunConfig of one of that allocation's pilot runs (minus
budget, seed and output directory) and runs it with :func:`race.grid.run_grid` (same
cell function, runner and retry settings as the study's grid), asking it to run these
configs into the study without recording them as the study's grid
(``as_study_spec=False``), each cell named by the allocation it validates (``Cell.name``: the
study's name of it). The validation is recorded in ``<study_dir>/validation.json`` (see
:mod:`race.protocol.study`) before the runs start and updated when they end; the study is read
once before (the :class:`~race.protocol.study.Study` passed in) and once after the runs (its
realised regret and ``ValidationOutcome.study``, what the report then renders).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from race.analysis import Recommendation, ValidationResult, prepare_runs, realised_regret
from race.spec.grid import DEFAULT_CELL_FN, GRID_OWNED
from race.analysis.tables import jsonable

from .study import ReportError, Study, default_target_budget, load_study, read_validations, write_validation


@dataclass
class ValidationOutcome:
    """What ``validate_study`` ran and what it found."""

    study_dir: Path
    target: str
    target_budget: float
    recommendation: Recommendation
    allocations: list[str]
    run_ids: list[str]
    seeds: dict[str, list[int]]
    failed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    result: ValidationResult | None = None
    message: str | None = None
    notes: list[str] = field(default_factory=list)
    study: Study | None = None  # the study read again after the runs (what the regret was measured on)

    @property
    def status(self) -> str:
        return "complete" if self.result is not None and not self.failed and not self.refused else "incomplete"


def choose_allocations(rec: Recommendation, rivals: int, among: Sequence[str] | None = None) -> list[str]:
    """The recommendation, then the ``rivals`` candidates with the highest predicted score
    (``among`` these only, when given: a racing study's allocations on its last rung)."""
    others = [a for a in rec.predictions["allocation"] if a != rec.allocation and (among is None or a in among)]
    return [rec.allocation, *others[: max(0, int(rivals))]]


def template_base(config: dict[str, Any]) -> dict[str, Any]:
    """A stored pilot RunConfig as the ``base`` of a validation grid: without what the
    study's grid set for that cell (``GRID_OWNED``: budget, seed, output directory; and
    ``eval.at_budgets``, the prefix points of a nested grid, which belong to the pilot
    budgets, not to a validation run at the target budget)."""
    base = {k: v for k, v in config.items() if k not in GRID_OWNED}
    if isinstance(base.get("eval"), dict) and "at_budgets" in base["eval"]:
        base["eval"] = {k: v for k, v in base["eval"].items() if k != "at_budgets"}
    return base


def validation_grids(study: Study, allocations: Sequence[str], target_budget: float,
                     seeds: Sequence[int] | None = None, workers: int | None = None) -> list[dict[str, Any]]:
    """One grid-spec dict per allocation: its stored RunConfig at ``target_budget``."""
    grid = study.grid
    prepared = prepare_runs(study.pilot_runs)
    out = []
    for alloc in allocations:
        rows = prepared[prepared["allocation"] == alloc].sort_values(["budget", "run_id"])
        if rows.empty:
            raise ReportError(f"allocation {alloc} has no complete pilot run to copy its settings from")
        template = study.run_configs.get(str(rows["run_id"].iloc[-1]))
        if template is None:
            raise ReportError(f"run {rows['run_id'].iloc[-1]} has no stored run config in the study store")
        use_seeds = sorted({int(s) for s in (seeds if seeds else rows["seed"].unique())})
        runner = grid.runner.model_dump(mode="json") if grid is not None else {}
        if workers is not None:
            runner["workers"] = workers
        out.append({
            "study": grid.study if grid is not None else study.name, "budgets": [float(target_budget)],
            "require_budget_span": False, "base": template_base(template), "seeds": use_seeds, "runner": runner,
            "max_retries": grid.max_retries if grid is not None else 2,
            "min_steps": grid.min_steps if grid is not None else 1,
            "cell_fn": grid.cell_fn if grid is not None else DEFAULT_CELL_FN,
        })
    return out


def validate_study(study: "Study | str | Path", *, target_budget: float | None = None, target: str | None = None,
                   rivals: int = 2, seeds: Sequence[int] | None = None, workers: int | None = None,
                   n_boot: int = 1000, n_boot_fit: int = 200, rng: int = 0,
                   on_event: Callable[[Any], None] | None = None) -> ValidationOutcome:
    """Recommend for ``target_budget`` (default: as the report) on ``target`` (default: the
    study's primary target, its grid's first ``eval.targets`` entry), run the recommendation and
    ``rivals`` rivals there (``seeds``: default each allocation's pilot seeds), store the
    runs in the study and compute the realised regret (also written to validation.json).
    ``study``: the study as read (:class:`~race.protocol.study.Study`), or its directory."""
    from race.grid import GridSpecError, grid_spec_from_dict, run_grid

    study = study if isinstance(study, Study) else load_study(study)
    if study.study_dir is None:
        raise ReportError(f"study {study.name} was given as tables: validation runs go into a study directory")
    sdir = study.study_dir
    if study.race is not None:
        raise ReportError(f"study {study.name} is a racing study: its target run continues the pick's pilot "
                          "(race.protocol.target.validate_race; `race validate` chooses it)")
    target = target or study.primary_target
    pilot_evals = study.evals_of(study.pilot_runs)
    if target not in set(pilot_evals["target"].astype(str)):
        raise ReportError(f"target {target!r} is not evaluated in study {study.name} "
                          f"(targets: {sorted(pilot_evals['target'].astype(str).unique())})")
    tb = float(target_budget) if target_budget is not None else default_target_budget(study, target)
    if not tb > study.largest_pilot_budget():
        raise ReportError(f"target budget {tb:.3g} is not above the largest pilot budget "
                          f"{study.largest_pilot_budget():.3g}: validation runs must be new, larger runs")
    rec = study.recommendation(target, tb, n_boot=n_boot_fit, rng=rng)
    notes = list(rec.notes)
    allocs = choose_allocations(rec, rivals)
    grids = validation_grids(study, allocs, tb, seeds, workers)
    runs = []  # (spec, its cells named by the allocation they validate)
    try:
        for alloc, g in zip(allocs, grids):
            spec = grid_spec_from_dict(g, source=f"validation of {study.name}")
            runs.append((spec, [replace(c, name=alloc) for c in spec.cells()]))
    except GridSpecError as e:
        raise ReportError(f"cannot build the validation runs: {e}") from None
    run_ids = [c.run_id for _, cells in runs for c in cells]
    out = ValidationOutcome(study_dir=sdir, target=target, target_budget=tb, recommendation=rec, allocations=allocs,
                            run_ids=run_ids, seeds={a: list(g["seeds"]) for a, g in zip(allocs, grids)}, notes=notes)
    entry = {"target": target, "target_budget": tb, "allocations": allocs, "run_ids": run_ids, "seeds": out.seeds,
             "recommendation": {k: v for k, v in rec.to_dict().items() if k != "predictions"},
             "started_at": time.time()}
    return run_recorded(study, entry, out, lambda: (run_grid(spec, sdir, cells=cells, on_event=on_event,
                                                             as_study_spec=False) for spec, cells in runs),
                        n_boot=n_boot, rng=rng)


def run_recorded(study: Study, entry: dict[str, Any], out: ValidationOutcome,
                 grids: Callable[[], Iterable[Any]], *, n_boot: int, rng: int, what: str = "validation cell(s)",
                 ) -> ValidationOutcome:
    """Record ``entry`` in validation.json as running, run the grids ``grids()`` yields
    (``race.grid.run_grid`` results, run as they are drawn), read the study again
    (``out.study``), measure the realised regret of ``out.recommendation`` on it and record
    the outcome; returns ``out``, filled in."""
    from race.grid import StudyLockedError

    sdir = out.study_dir
    write_validation(sdir, {**entry, "status": "running"})
    try:
        for res in grids():
            out.failed += res.failed
            out.refused += [f"{c.cell.run_id}: {c.refusal}" for c in res.refused]
    except StudyLockedError as e:
        write_validation(sdir, {**entry, "status": "interrupted", "message": str(e)})
        raise ReportError(f"study {study.name} is being run by another driver ({e}); validate when it has "
                          "finished") from None
    out.study = study.reload()
    out.result, out.message = measure(out.study, out.recommendation, n_boot, rng)
    if out.failed or out.refused:
        out.message = "; ".join(filter(None, [f"{len(out.failed)} {what} failed" if out.failed else None,
                                              f"{len(out.refused)} refused" if out.refused else None, out.message]))
    write_validation(sdir, {**entry, "status": out.status, "failed": out.failed, "refused": out.refused,
                            "message": out.message,
                            "result": jsonable(out.result.to_dict()) if out.result is not None else None})
    # the study read above holds the entry as "running": it carries the outcome just recorded
    out.study = replace(out.study, validations=read_validations(sdir))
    return out


def measure(study: Study, rec: Recommendation, n_boot: int, rng: int) -> tuple[ValidationResult | None, str | None]:
    """The realised regret of ``rec`` on the study's validation runs (or why it was not measured)."""
    vruns = study.validation_runs
    try:
        return realised_regret(rec, study.evals_of(vruns), vruns, n_boot=n_boot, rng=rng), None
    except ValueError as e:
        return None, f"realised regret not measured: {e}"


__all__ = ["ValidationOutcome", "choose_allocations", "measure", "run_recorded", "validate_study", "validation_grids"]
