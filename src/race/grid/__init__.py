"""The pilot grid (the RACE protocol): a study of cheap GRPO runs over allocations at
several FLOP budgets, run locally or on Ray, stored in SQLite, resumable.

    (the grid file itself, GridSpec and its cells live in race.spec: grid.py, cells.py)
    plan.py        dry run: predicted FLOPs per cell (via race.accounting), refusals, totals
    store.py       SQLite store (WAL, versioned schema, one transaction per finished run)
    lock.py        one driver per study, one process per run directory
    cell.py        worker side: run a cell function, read its run directory
    local.py       process-pool runner;  ray_runner.py: Ray runner
    runners.py     the driver: run_grid
    tables.py      study_status, load_tables (pandas), export_study
"""

from race.grid.lock import StudyLock, StudyLockedError
from race.grid.plan import GridPlan, PlannedCell, plan_grid, predict_cell
from race.grid.runners import GridEvent, GridProgress, GridResult, run_grid
from race.grid.store import SCHEMA_VERSION, Store, StoreError
from race.spec.cells import Cell
from race.spec.errors import GridSpecError
from race.spec.grid import DEFAULT_CELL_FN, GridSpec, RunnerSettings, expand_grid, grid_spec_from_dict, load_grid_spec
from race.grid.tables import StudyStatus, export_study, load_tables, read_tables, study_status

__all__ = [
    "Cell", "expand_grid", "StudyLock", "StudyLockedError", "GridPlan", "PlannedCell", "plan_grid", "predict_cell",
    "GridEvent", "GridProgress", "GridResult", "run_grid", "DEFAULT_CELL_FN", "GridSpec", "GridSpecError",
    "RunnerSettings", "grid_spec_from_dict", "load_grid_spec", "SCHEMA_VERSION", "Store", "StoreError",
    "StudyStatus", "export_study", "load_tables", "read_tables", "study_status",
]
