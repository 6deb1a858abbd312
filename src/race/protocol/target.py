"""The target run of a racing study: the chosen pilot, continued to the target budget.

After the last rung the racing pick (``Study.recommendation``: the last rung's decision, the one the
race stored for its last rung) is the allocation to run at the target budget T. Its pilot,
the run its first ``race.later_seeds`` seeds extended rung by rung (the allocation's
continued run, not the seed that happened to score best), is extended once more, to T: the
target run starts where the pilot stopped, so the pilot's FLOPs are the target run's first
part, charged once (the store marks the pilot ``prefix_of`` the target run). Beside it:

- ``rivals``: the strongest rivals that reached the last rung (by the pick's forecast over
  every allocation), continued from their pilots
  the same way (what the realised regret is measured against);
- ``seeds``: more seeds where the user asks for them. A seed the first rung ran continues its
  first-rung run (at a constant learning rate that is the fresh run of that seed, step for
  step: tests/engines/test_extend.py); a seed the study never ran starts from scratch.

Recorded in ``validation.json`` like a flat study's validation (``race.protocol.validate``),
with ``protocol: race`` and, per target run, the pilot it continued (``continued``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import ReportError
from .study import Study, load_study


def validate_race(study: "Study | str | Path", *, target_budget: float | None = None, target: str | None = None,
                  rivals: int = 1, seeds: Sequence[int] | None = None, workers: int | None = None,
                  n_boot: int = 1000, rng: int = 0, on_event: Callable[[Any], None] | None = None) -> Any:
    """Run a racing study's target run (module docstring) and measure the realised regret;
    returns a ``race.protocol.validate.ValidationOutcome``. ``study``: the study as read
    (:class:`~race.protocol.study.Study`), or its directory."""
    from race.grid import run_grid

    from .validate import ValidationOutcome, choose_allocations, run_recorded

    study = study if isinstance(study, Study) else load_study(study)
    race, sdir = study.race, study.study_dir
    if race is None or study.grid is None or sdir is None:
        raise ReportError(f"study {study.name} is not a racing study read from its directory: its target run "
                          "continues the pick's pilot (validate_study validates a flat study)")
    spec, ladder, decisions = study.grid, study.ladder, study.rung_decisions
    if len(decisions) < ladder.rungs:
        raise ReportError(f"the race of study {spec.study} has decided {len(decisions)} of its {ladder.rungs} "
                          "rungs: finish it first (`race grid run GRID_FILE --study-dir DIR`, it resumes)")
    target = target or study.primary_target
    tb = float(target_budget) if target_budget is not None else race.target_budget
    last = ladder.budgets()[-1]
    if not tb > last:
        raise ReportError(f"target budget {tb:.3g} is not above the last rung's {last:.3g}: the "
                          "target run continues the pick's pilot to a larger budget")
    rec = study.recommendation(target, tb, rng=rng)
    # the rivals raced to the last rung: their pilots are there to continue (the study's odds cover the rest)
    allocs = choose_allocations(rec, rivals, [r["allocation"] for r in decisions[-1].get("rows", [])])
    try:
        cells = ladder.target_cells(allocs, tb, seeds)
    except ValueError as e:
        raise ReportError(f"cannot build the target runs: {e}") from None
    out = ValidationOutcome(study_dir=sdir, target=target, target_budget=tb, recommendation=rec, allocations=allocs,
                            run_ids=[c.run_id for c in cells], seeds={}, notes=list(rec.notes))
    for c in cells:
        out.seeds.setdefault(c.name, []).append(c.seed)
    if decisions[-1].get("leader") != rec.allocation and abs(tb - race.target_budget) <= 1e-9 * tb:
        out.notes.append(f"the race's last decision named {decisions[-1].get('leader')}, the pick here is "
                         f"{rec.allocation} (another seed or rule): the target run follows the pick")
    entry = {"protocol": "race", "target": target, "target_budget": tb, "allocations": allocs,
             "run_ids": out.run_ids, "seeds": out.seeds, "continued": {c.run_id: c.extends for c in cells},
             "recommendation": {k: v for k, v in rec.to_dict().items() if k != "predictions"},
             "started_at": time.time()}
    return run_recorded(study, entry, out, lambda: [run_grid(spec, sdir, cells=cells, workers=workers,
                                                             on_event=on_event, as_study_spec=False)],
                        n_boot=n_boot, rng=rng, what="target run(s)")


def run_validation(study: "Study | str | Path", *, rivals: int = 2, n_boot_fit: int = 200, **kw: Any) -> Any:
    """``race validate``: a racing study's target run (:func:`validate_race`), else the flat
    protocol's validation (``race.protocol.validate.validate_study``); ``rivals`` and the
    other keywords go to either (``n_boot_fit`` to the flat one's recommendation only).
    ``study``: the study as read, or its directory (read once here)."""
    from .validate import validate_study

    study = study if isinstance(study, Study) else load_study(study)
    if study.imported is not None:
        raise ReportError(f"study {study.name} was imported (race import): RACE cannot re-run its runs, so it cannot "
                          "validate it; train the recommended allocation at the target budget where the runs were "
                          "trained")
    if study.race is not None:
        return validate_race(study, rivals=rivals, **kw)
    return validate_study(study, rivals=rivals, n_boot_fit=n_boot_fit, **kw)


__all__ = ["run_validation", "validate_race"]
