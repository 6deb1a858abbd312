"""A study as the protocol reads it (and the report renders it): one value, read once.

:class:`Study` holds what every stage reads: the tables (``race.grid.read_tables``), split
into pilot runs and validation runs, the study's grid as a parsed ``GridSpec`` (with its
racing settings and ladder), the racing decisions stored per rung, the validations, the
stored run configs, and the primary target. :func:`load_study` opens the study's store once
to read all of it; the CLI, the racing driver's callers, the target run, the validation and
the report take the value instead of reading the store again (a stage that ran new cells
reads the study once more afterwards: :meth:`Study.reload`).

A study comes from a study directory or from tables passed in directly (``{"runs": ...,
"evals": ..., "train"?: ..., "ledger"?: ...}`` in the analysis schema; no grid then).
Validation runs are the runs ``race validate`` ran at a target budget; it records them in
``<study_dir>/validation.json`` (:data:`VALIDATION_FILE`):

```json
{"validations": [{"target": "greedy", "target_budget": 3e13, "allocations": ["..."],
                  "run_ids": ["..."], "seeds": [0, 1], "status": "complete",
                  "recommendation": {...}, "result": {...}, "updated_at": 1760000000.0}]}
```

Runs named there (or, for tables without that file, runs whose budget equals an explicit
target budget above every other budget) are kept out of the pilot analysis and used only
to measure realised regret.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import pandas as pd

from race.analysis import Recommendation, recommend

from .errors import ReportError

if TYPE_CHECKING:
    from race.spec.grid import GridSpec
    from race.spec.ladder import Ladder
    from race.spec.race import RaceSettings
    from race.spec.rungs import RungSchedule

VALIDATION_FILE = "validation.json"
BUDGET_RTOL = 0.05
DEFAULT_TARGET_RATIO = 4.0


def _close(a: float, b: float, rtol: float = BUDGET_RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b))


@dataclass
class Study:
    """One study (module docstring). ``runs``/``evals`` hold every run; ``pilot_*`` and
    ``validation_*`` the two parts (validation tables may be empty)."""

    name: str
    source: str
    study_dir: Path | None
    runs: pd.DataFrame
    evals: pd.DataFrame
    train: pd.DataFrame | None
    ledger: pd.DataFrame | None
    validations: list[dict[str, Any]] = field(default_factory=list)
    validation_ids: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    #: The study's grid as its store recorded it, parsed (None: tables passed in, or no grid stored).
    grid: "GridSpec | None" = None
    #: A racing study's stored decisions, one per rung decided (``RungDecision.as_dict()``).
    rung_decisions: list[dict[str, Any]] = field(default_factory=list)
    #: A racing study's schedule (``race.spec.rungs.RungSchedule``), stored when its race started.
    schedule: "RungSchedule | None" = None
    #: Run id -> its stored RunConfig (what the validation copies an allocation's settings from).
    run_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The target the report and validation optimise unless told otherwise: the grid's cells'
    #: first evaluation target (``GridSpec.primary_target``), else greedy.
    primary_target: str = "greedy"
    #: Count the reward models' training FLOPs in the report card's total (the grid's
    #: ``report.count_rm_training``; ``build_report(count_rm_training=...)`` overrides it).
    count_rm_training: bool = False
    #: An imported study's record (``race import``: its sources, caveats, where its FLOPs came
    #: from; ``race.protocol.imports``), else None. Its caveats are among the ``notes``.
    imported: dict[str, Any] | None = None
    target_budget: float | None = None  # the explicit target budget it was read with (load_study)

    @property
    def race(self) -> "RaceSettings | None":
        """A racing study's ``race:`` settings (its grid has ``protocol: race``), else None."""
        return self.grid.race if self.grid is not None and self.grid.racing else None

    @property
    def ladder(self) -> "Ladder":
        """A racing study's ladder (``race.spec.ladder``: the cells of every rung and of the target
        run) under its stored schedule."""
        if self.grid is None or self.race is None:
            raise ReportError(f"study {self.name} is not a racing study (its grid has no protocol: race)")
        if self.schedule is None and not self.race.explicit:
            raise ReportError(f"the race of study {self.name} has not started: it has no schedule yet (run it: "
                              "`race grid run GRID_FILE --study-dir DIR`)")
        return self.grid.ladder(self.schedule)

    def recommendation(self, target: str | None = None, target_budget: float | None = None, *, n_boot: int = 200,
                       rng: int = 0) -> Recommendation:
        """The study's recommendation for ``target_budget`` (default :func:`default_target_budget`):
        the one entry the report and the validation stages read. A flat study's is
        :func:`race.analysis.recommend` on its pilot runs; a racing study's is the race's pick:
        the forecast of its last rung decided so far (``race.analysis.racing.rung_decision``
        with the stored schedule and rule, seeded with ``rng`` as the race's driver), whose
        P(best) and expected regret are over every allocation the study ran."""
        target = target or self.primary_target
        tb = float(target_budget) if target_budget is not None else default_target_budget(self, target)
        runs, evals = self.pilot_runs, self.evals_of(self.pilot_runs)
        if self.race is None:
            return recommend(evals, runs, target, tb, n_boot=n_boot, rng=rng)
        from dataclasses import replace

        from race.analysis.racing import rung_decision

        from .racing import racing_rule

        if self.schedule is None:
            raise ReportError(f"the race of study {self.name} has no schedule yet: run it first")
        sched = self.schedule if abs(tb - self.schedule.target_budget) <= 1e-9 * tb else replace(self.schedule,
                                                                                                   target_budget=tb)
        done = [int(d["rung"]) for d in self.rung_decisions]
        if not done:
            raise ReportError(f"no rung of the race of study {self.name} has been decided yet: run the race first")
        rule = racing_rule(self.race.rule, self.race.later_seeds)
        decision = rung_decision(runs, evals, schedule=sched, rung=max(done), target=target, rule=rule, seed=rng,
                                 forecast=True)
        assert decision.recommendation is not None
        return decision.recommendation

    @property
    def pilot_runs(self) -> pd.DataFrame:
        return self.runs[~self.runs["run_id"].isin(self.validation_ids)].reset_index(drop=True)

    @property
    def validation_runs(self) -> pd.DataFrame:
        return self.runs[self.runs["run_id"].isin(self.validation_ids)].reset_index(drop=True)

    @property
    def pilot_complete(self) -> pd.DataFrame:
        r = self.pilot_runs
        return r[r["status"].astype(str) == "complete"].reset_index(drop=True)

    def evals_of(self, runs: pd.DataFrame) -> pd.DataFrame:
        return self.evals[self.evals["run_id"].isin(set(runs["run_id"]))].reset_index(drop=True)

    def largest_pilot_budget(self) -> float:
        return float(self.pilot_complete["budget"].max())

    def validation_for(self, target_budget: float, target: str | None = None) -> dict[str, Any] | None:
        """The latest recorded validation at ``target_budget`` (and ``target``, if given)."""
        hits = [v for v in self.validations if _close(float(v.get("target_budget", 0.0)), target_budget)
                and (target is None or v.get("target") == target)]
        return hits[-1] if hits else None

    def reload(self) -> "Study":
        """The study read again from its directory (after a stage stored new runs)."""
        if self.study_dir is None:
            raise ReportError(f"study {self.name} was given as tables: there is no directory to read again")
        return load_study(self.study_dir, target_budget=self.target_budget)


def read_validations(study_dir: str | Path) -> list[dict[str, Any]]:
    """Entries of ``<study_dir>/validation.json`` (empty when there is none)."""
    path = Path(study_dir) / VALIDATION_FILE
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ReportError(f"{path} is not valid JSON ({e}); fix or delete it") from None
    entries = data.get("validations", []) if isinstance(data, dict) else []
    return [e for e in entries if isinstance(e, dict)]


def write_validation(study_dir: str | Path, entry: dict[str, Any]) -> Path:
    """Add (or replace: same target and target budget) one validation entry, atomically."""
    path = Path(study_dir) / VALIDATION_FILE
    entries = [e for e in read_validations(study_dir)
               if not (e.get("target") == entry.get("target")
                       and _close(float(e.get("target_budget", 0.0)), float(entry["target_budget"])))]
    entries.append({**entry, "updated_at": time.time()})
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"validations": entries}, indent=2, default=_json_default, allow_nan=False))
    os.replace(tmp, path)
    return path


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def _clean_runs(runs: pd.DataFrame) -> pd.DataFrame:
    runs = runs.copy()
    if "status" not in runs.columns:
        runs["status"] = "complete"
    runs["run_id"] = runs["run_id"].astype(str)
    return runs


def _stored_grid(raw: dict[str, Any] | None, study_dir: Path, notes: list[str]) -> "GridSpec | None":
    """The stored grid spec, parsed; None (with a note) when there is none or it no longer
    parses; a racing grid that does not parse is an error (its race cannot be read)."""
    from race.grid import GridSpecError, grid_spec_from_dict

    if not raw:
        return None
    try:
        return grid_spec_from_dict(raw, source=f"the grid stored in {study_dir}")
    except GridSpecError as e:
        if raw.get("protocol") == "race":
            raise ReportError(f"cannot read the study's racing grid: {e}") from None
        notes.append(f"the grid stored with the study does not parse ({str(e).splitlines()[0]}); its settings "
                     "(primary target, report settings) are not used")
        return None


def _read_dir(study_dir: Path) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(the tables, what else the store holds, notes) of a study directory: its store opened once."""
    from race.grid import Store, StoreError, read_tables
    from race.spec.rungs import schedule_from_dict

    if not study_dir.is_dir():
        raise ReportError(f"no such study directory: {study_dir}")
    notes: list[str] = []
    try:
        with Store(study_dir, create=False) as store:
            tables = read_tables(store)
            raw, decisions, configs = store.study_spec(), store.rung_decisions(), store.run_specs()
            schedule = store.race_schedule()
    except StoreError as e:
        raise ReportError(str(e)) from None
    imported = raw.get("imported") if isinstance(raw, dict) and isinstance(raw.get("imported"), dict) else None
    grid = None if imported is not None else _stored_grid(raw, study_dir, notes)
    if imported is not None:  # race import: no grid; its caveats go with the study
        notes += import_caveats(raw)
    racing = grid is not None and grid.racing
    return tables, {"grid": grid, "rung_decisions": decisions if racing else [],
                    "schedule": schedule_from_dict(schedule) if racing and schedule else None,
                    "run_configs": configs, "validations": read_validations(study_dir), "imported": imported,
                    "primary_target": import_primary_target(raw) if imported is not None else "greedy"}, notes


def import_caveats(spec: dict[str, Any]) -> list[str]:
    """The caveats an imported study's stored spec carries (``race import``:
    ``race.protocol.imports``); ``[]`` for a study RACE ran."""
    imported = spec.get("imported") if isinstance(spec, dict) else None
    return [str(c) for c in imported.get("caveats", [])] if isinstance(imported, dict) else []


def import_primary_target(spec: dict[str, Any]) -> str:
    """An imported study's primary target (its stored ``eval.targets[0]``), else greedy."""
    targets = (spec.get("eval") or {}).get("targets") if isinstance(spec, dict) else None
    return str(targets[0]) if targets else "greedy"


def load_study(source: "str | Path | Mapping[str, pd.DataFrame]", *,
               target_budget: float | None = None) -> Study:
    """Read a study directory (its store opened once) or wrap a dict of tables (module docstring)."""
    study_dir: Path | None = None
    notes: list[str] = []
    if isinstance(source, Mapping):
        tables = dict(source)
        if "runs" not in tables or "evals" not in tables:
            raise ReportError("tables must hold at least 'runs' and 'evals' DataFrames")
        extra: dict[str, Any] = {"validations": list(tables.get("validations") or [])}
        origin = "tables"
    else:
        study_dir = Path(source)
        tables, extra, notes = _read_dir(study_dir)
        origin = str(study_dir)
    runs = _clean_runs(tables["runs"])
    if runs.empty:
        raise ReportError(f"study {origin} has no runs")
    train, ledger = tables.get("train"), tables.get("ledger")
    name = str(runs["study"].dropna().iloc[0]) if "study" in runs.columns and runs["study"].notna().any() else (
        study_dir.name if study_dir is not None else "study")
    data = Study(name=name, source=origin, study_dir=study_dir, runs=runs, evals=tables["evals"].copy(),
                 train=train if isinstance(train, pd.DataFrame) and not train.empty else None,
                 ledger=ledger if isinstance(ledger, pd.DataFrame) and not ledger.empty else None,
                 notes=notes, target_budget=target_budget, **extra)
    if data.grid is not None:
        data.primary_target = data.grid.primary_target()
        data.count_rm_training = bool(data.grid.report.count_rm_training)
    data.validation_ids = _validation_ids(data, target_budget)
    if data.pilot_complete.empty:
        counts = runs["status"].astype(str).value_counts().to_dict()
        raise ReportError(f"study {data.name} ({origin}) has no complete pilot runs (status counts: {counts}); "
                          "run the grid first (`race grid run`)")
    return data


def _validation_ids(data: Study, target_budget: float | None) -> set[str]:
    """The run ids of the study's validation runs (module docstring)."""
    runs, validations = data.runs, data.validations
    ids = {str(r) for v in validations for r in v.get("run_ids", [])}
    budgets = runs["budget"].astype(float)
    for v in validations:
        tb = float(v.get("target_budget", 0.0))
        ids |= set(runs.loc[[_close(b, tb) for b in budgets], "run_id"])
    if target_budget is not None and not ids:
        at_target = np.array([_close(b, target_budget) for b in budgets])
        if at_target.any() and (~at_target).any() and target_budget > budgets[~at_target].max():
            ids |= set(runs.loc[at_target, "run_id"])
            data.notes.append(f"{int(at_target.sum())} run(s) at the target budget {target_budget:.3g} are treated "
                              "as validation runs")
    return ids


def default_target_budget(study: Study, target: str | None = None) -> float:
    """The latest validated target budget if any, else a racing study's target budget, else
    :data:`DEFAULT_TARGET_RATIO` (4x) the largest pilot budget: inside the recommendation's
    extrapolation limit (below 10x), so the default report makes a forecast it can label."""
    for v in reversed(study.validations):
        if target is None or v.get("target") == target:
            tb = float(v.get("target_budget", 0.0))
            if tb > 0 and math.isfinite(tb):
                return tb
    if study.race is not None:
        return float(study.race.target_budget)
    return DEFAULT_TARGET_RATIO * study.largest_pilot_budget()


def reward_model_cards(runs: pd.DataFrame) -> dict[str, dict[str, Any] | None]:
    """Reward spec -> the card of the reward model behind it (``race.rewards.rm_card``:
    its quality, inference and training FLOPs from its ``info.json``; ``None`` for a rule),
    for each distinct reward of ``runs``, read from its typed columns (``reward_system``,
    ``reward_model``: ``race.analysis.tables.with_reward_columns``)."""
    from race.analysis.tables import with_reward_columns
    from race.rewards.rm_card import rm_card

    typed = with_reward_columns(runs)
    typed = typed.assign(reward=typed["reward"].astype(str)).drop_duplicates("reward").sort_values("reward")
    return {r.reward: rm_card(str(r.reward_system), r.reward_model if isinstance(r.reward_model, str) else None)
            for r in typed.itertuples()}


__all__ = ["Study", "ReportError", "load_study", "read_validations", "write_validation",
           "reward_model_cards", "default_target_budget", "VALIDATION_FILE"]
