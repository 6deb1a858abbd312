"""The target run of a racing study: the chosen pilot, continued to the target budget.

After the last rung the racing pick (``race.analysis.racing.race_pick``, the decision the
race stored for its last rung) is the allocation to run at the target budget T. Its pilot,
the run its first ``race.later_seeds`` seeds extended rung by rung (the allocation's
continued run, not the seed that happened to score best), is extended once more, to T: the
target run starts where the pilot stopped, so the pilot's FLOPs are the target run's first
part, charged once (the store marks the pilot ``prefix_of`` the target run). Beside it:

- ``rivals``: the strongest rivals that reached the last rung, continued from their pilots
  the same way (what the realised regret is measured against);
- ``seeds``: more seeds where the user asks for them. A seed the first rung ran continues its
  first-rung run (at a constant learning rate that is the fresh run of that seed, step for
  step: tests/engines/test_extend.py); a seed the study never ran starts from scratch.

Recorded in ``validation.json`` like a flat study's validation (``race.protocol.validate``),
with ``protocol: race`` and, per target run, the pilot it continued (``continued``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from race.spec.cells import Cell, race_cell, rung_cells

from .errors import ReportError
from .racing import key_labels, race_recommendation
from .study import load_study


def _stored_spec(study_dir: Path) -> tuple[Any, list[dict[str, Any]]]:
    """(the study's racing GridSpec, its stored rung decisions)."""
    from race.grid import GridSpecError, Store, grid_spec_from_dict

    with Store(study_dir, create=False) as store:
        name = store.study_name()
        raw = next((json.loads(r["spec_json"]) for r in store.rows("studies") if r["name"] == name), None)
        decisions = store.rung_decisions()
    try:
        spec = grid_spec_from_dict(raw or {}, source=f"the grid stored in {study_dir}")
    except GridSpecError as e:
        raise ReportError(f"cannot read the study's racing grid: {e}") from None
    return spec, decisions


def target_cells(spec: Any, labels: Sequence[str], target_budget: float, seeds: Sequence[int] | None = None,
                 ) -> list[Cell]:
    """The target runs at ``target_budget`` of the allocations ``labels`` (their grid labels):
    each continued seed's run extends its last-rung run; each seed of ``seeds`` beyond them
    extends its first-rung run when the study ran one, else starts fresh (module docstring)."""
    race = spec.race
    last = len(race.rungs) - 1
    continued = list(spec.seeds[: race.later_seeds])
    out = []
    for label in labels:
        first = {c.seed: c for c in rung_cells(spec, 0, {label})}
        if not first:
            raise ReportError(f"allocation {label} is not a cell of this racing grid")
        ladder = {c.seed: c for c in rung_cells(spec, last, {label})}
        alloc = next(iter(first.values())).allocation
        for seed in [*continued, *[s for s in (seeds or []) if s not in continued]]:
            parent = ladder.get(seed) if seed in continued else first.get(seed)
            out.append(race_cell(spec, alloc, target_budget, seed, extends=parent.run_id if parent else None,
                                 index=10_000 * (last + 2) + len(out)))
    return out


def validate_race(study_dir: str | Path, *, target_budget: float | None = None, target: str | None = None,
                  rivals: int = 1, seeds: Sequence[int] | None = None, workers: int | None = None,
                  n_boot: int = 1000, rng: int = 0, on_event: Callable[[Any], None] | None = None) -> Any:
    """Run a racing study's target run (module docstring) and measure the realised regret;
    returns a ``race.protocol.validate.ValidationOutcome``."""
    from race.grid import run_grid

    from .validate import ValidationOutcome, choose_allocations, run_recorded

    sdir = Path(study_dir)
    spec, decisions = _stored_spec(sdir)
    race = spec.race
    if len(decisions) < len(race.rungs):
        raise ReportError(f"the race of study {spec.study} has decided {len(decisions)} of its {len(race.rungs)} "
                          "rungs: finish it first (`race grid run GRID_FILE --study-dir DIR`, it resumes)")
    study = load_study(sdir)
    target = target or study.primary_target
    tb = float(target_budget) if target_budget is not None else race.target_budget
    if not tb > race.rung_budgets()[-1]:
        raise ReportError(f"target budget {tb:.3g} is not above the last rung's {race.rung_budgets()[-1]:.3g}: the "
                          "target run continues the pick's pilot to a larger budget")
    rec = race_recommendation(study.evals_of(study.pilot_runs), study.pilot_runs, target, tb, study.race or {},
                              seed=rng)
    allocs = choose_allocations(rec, rivals)
    names = key_labels(study.pilot_runs)
    cells = target_cells(spec, [names[a] for a in allocs], tb, seeds)
    label_key = {v: k for k, v in names.items()}
    out = ValidationOutcome(study_dir=sdir, target=target, target_budget=tb, recommendation=rec, allocations=allocs,
                            run_ids=[c.run_id for c in cells], seeds={}, notes=list(rec.notes))
    for c in cells:
        out.seeds.setdefault(label_key[c.label], []).append(c.seed)
    if decisions[-1].get("leader") != rec.allocation and abs(tb - race.target_budget) <= 1e-9 * tb:
        out.notes.append(f"the race's last decision named {decisions[-1].get('leader')}, the pick here is "
                         f"{rec.allocation} (another seed or rule): the target run follows the pick")
    entry = {"protocol": "race", "target": target, "target_budget": tb, "allocations": allocs,
             "run_ids": out.run_ids, "seeds": out.seeds, "continued": {c.run_id: c.extends for c in cells},
             "recommendation": {k: v for k, v in rec.to_dict().items() if k != "predictions"},
             "started_at": time.time()}
    return run_recorded(sdir, spec.study, entry, out, lambda: [run_grid(spec, sdir, cells=cells, workers=workers,
                                                                         on_event=on_event, as_study_spec=False)],
                        n_boot=n_boot, rng=rng, what="target run(s)")


def run_validation(study_dir: str | Path, *, rivals: int = 2, n_boot_fit: int = 200, **kw: Any) -> Any:
    """``race validate``: a racing study's target run (:func:`validate_race`), else the flat
    protocol's validation (``race.protocol.validate.validate_study``); ``rivals`` and the
    other keywords go to either (``n_boot_fit`` to the flat one's recommendation only)."""
    from .validate import validate_study

    study = load_study(study_dir)
    if study.imported is not None:
        raise ReportError(f"study {study.name} was imported (race import): RACE cannot re-run its runs, so it cannot "
                          "validate it; train the recommended allocation at the target budget where the runs were "
                          "trained")
    if study.race is not None:
        return validate_race(study_dir, rivals=rivals, **kw)
    return validate_study(study_dir, rivals=rivals, n_boot_fit=n_boot_fit, **kw)


__all__ = ["run_validation", "target_cells", "validate_race"]
