"""The grid driver: plan, lock, schedule cells on a runner, store results.

Workers (local processes or Ray tasks) run cells and return their results; this driver
alone writes the study store. It skips cells already complete, restarts cells a dead
driver left ``running`` (their run directories keep checkpoints, so they resume),
retries a failing cell up to ``max_retries`` times, then marks it ``failed`` with its
error and goes on with the rest.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from race.spec.cells import Cell
from race.grid.lock import StudyLock
from race.grid.plan import GridPlan, PlannedCell, Predictor, plan_grid
from race.spec.grid import GridSpec, RunnerSettings, as_grid_spec
from race.grid.store import Store, StoreError
from race.schema import FINISHED


class Executor(Protocol):
    capacity: int
    description: str

    def submit(self, spec: dict[str, Any], run_dir: str) -> Any: ...
    def submit_gang(self, specs: list[dict[str, Any]], run_dirs: list[str], gang_dir: str) -> Any: ...
    def wait(self, handles: list[Any], timeout: float) -> list[tuple[Any, dict[str, Any]]]: ...
    def close(self, cancel: bool = False) -> None: ...


def make_executor(settings: RunnerSettings, cell_fn: str) -> Executor:
    if settings.kind == "ray":
        from race.grid.ray_runner import RayExecutor

        return RayExecutor(settings, cell_fn)
    from race.grid.local import LocalExecutor

    return LocalExecutor(settings, cell_fn)


@dataclass
class GridProgress:
    total: int
    complete: int = 0
    failed: int = 0
    running: int = 0
    refused: int = 0
    flops_done: float = 0.0  # counted FLOPs of finished cells
    flops_planned: float = 0.0  # sum of the budgets of runnable cells
    elapsed_s: float = 0.0
    eta_s: float | None = None
    runner: str = ""

    @property
    def pending(self) -> int:
        return self.total - self.complete - self.failed - self.running


@dataclass
class GridEvent:
    kind: str  # start | started | complete | retry | failed | tick | finish
    progress: GridProgress
    run_id: str | None = None
    label: str | None = None
    message: str | None = None


@dataclass
class GridResult:
    study: str
    study_dir: Path
    total: int
    complete: int
    failed: list[str]
    refused: list[PlannedCell]
    skipped_complete: int
    restarted: list[str]
    ran: int
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


def default_study_dir(spec: GridSpec) -> Path:
    return Path("studies") / spec.study


class _Driver:
    def __init__(self, spec: GridSpec, plan: GridPlan, store: Store, study_dir: Path,
                 on_event: Callable[[GridEvent], None] | None, poll_s: float, cells: list[Cell]):
        self.spec, self.plan, self.store, self.study_dir = spec, plan, store, study_dir
        self.on_event = on_event or (lambda ev: None)
        self.poll_s = poll_s
        self.t0 = time.monotonic()
        self.session_flops = 0.0
        self.cells = {c.run_id: c for c in cells}
        self.predicted = {pc.cell.run_id: float(pc.prediction["est_seconds"]) for pc in plan.runnable
                          if pc.prediction and pc.cell.run_id in self.cells}
        self.observed: list[tuple[float, float]] = []  # (predicted, observed) wall of cells done this session
        self.started: dict[str, float] = {}
        self.status: dict[str, str] = {}  # run id -> its status in the store, read when run() starts, kept current
        self.capacity = 1
        self.progress = GridProgress(total=len(self.cells), refused=len(plan.refused),
                                     flops_planned=sum(c.budget for c in self.cells.values()))

    def _cell_spec(self, cell: Cell) -> dict[str, Any]:
        """What a worker runs: the cell's spec, its step-0 evaluation shared through
        ``<study>/eval-cache`` unless the grid names another ``eval_cache_dir``."""
        spec = cell.spec_dict()
        if not spec.get("eval_cache_dir"):
            spec["eval_cache_dir"] = str(self.study_dir / "eval-cache")
        return spec

    def ordered(self, units: list[list[Cell]]) -> list[list[Cell]]:
        """Units (cells, or gangs with ``gang: true``) in the order they are handed out:
        longest predicted wall time first (a gang's: its members' sum; ``runner.order =
        longest_first``; ties keep the grid's order), else the grid's."""
        if self.spec.runner.order == "grid" or not all(c.run_id in self.predicted for u in units for c in u):
            return list(units)
        return sorted(units, key=lambda u: -sum(self.predicted[c.run_id] for c in u))  # stable: ties in grid order

    def _eta(self, remaining: list[str], capacity: int) -> float | None:
        """Seconds left: predicted wall time of the cells not done, rescaled by how long
        this session's finished cells took against their prediction, over the workers;
        FLOP-rate based when there are no predictions."""
        p = self.progress
        if self.observed and all(rid in self.predicted for rid in remaining):
            scale = sum(o for _, o in self.observed) / max(1e-9, sum(pr for pr, _ in self.observed))
            now = time.monotonic()
            left = sum(max(0.0, self.predicted[rid] * scale - (now - self.started.get(rid, now))) for rid in remaining)
            return left / max(1, capacity)
        if self.session_flops > 0:
            left_flops = sum(self.cells[rid].budget for rid in remaining)
            return left_flops / (self.session_flops / p.elapsed_s)
        return None

    def _emit(self, kind: str, cell: Cell | None = None, message: str | None = None) -> None:
        p = self.progress
        p.elapsed_s = time.monotonic() - self.t0
        remaining = [rid for rid in self.cells if self.status.get(rid) not in FINISHED + ("failed",)]
        p.eta_s = self._eta(remaining, self.capacity)
        self.on_event(GridEvent(kind, p, cell.run_id if cell else None, cell.label if cell else None, message))

    def run(self, make: Callable[[], Executor], retry_failed: bool) -> tuple[int, list[str]]:
        """Schedule every cell still to do; the executor is started only if there is one."""
        rows = {r["run_id"]: r for r in self.store.runs()}
        self.status = {rid: rows[rid]["status"] for rid in self.cells}
        todo_status = ("pending", "failed") if retry_failed else ("pending",)
        from race.grid.gangs import gang_units

        units = gang_units(list(self.cells.values()), gang=self.spec.gang, gang_size=self.spec.gang_size)
        queue = deque(self.ordered([u for u in units if any(self.status[c.run_id] in todo_status for c in u)]))
        p = self.progress
        p.complete = sum(1 for s in self.status.values() if s in FINISHED)
        p.failed = sum(1 for s in self.status.values() if s == "failed" and not retry_failed)
        p.flops_done = sum(rows[rid]["total_flops"] or 0.0 for rid in self.cells if self.status[rid] in FINISHED)
        executor = make() if queue else None
        self.capacity = executor.capacity if executor else 1
        p.runner = executor.description if executor else "nothing to run"
        self._emit("start")
        clean = False
        try:
            ran = self._loop(executor, queue) if executor else 0
            clean = True
        finally:
            if executor is not None:
                executor.close(cancel=not clean)
        self._emit("finish")
        return ran, [rid for rid, s in self.status.items() if s == "failed"]

    def _seed(self, cell: Cell) -> None:
        """A cell that extends a shorter run of its trajectory (racing: ``Cell.extends``)
        starts from that run's last checkpoint, ledger and metrics
        (``race.engines.run_io.seed_extension``), unless its directory already holds a
        checkpoint (a seeded or partly run extension resumes) or its finished run."""
        if not cell.extends:
            return
        from race.engines.run_io import last_checkpoint, seed_extension

        rd = self.study_dir / "runs" / cell.run_id
        if not (rd / "run.json").exists() and last_checkpoint(rd) is None:
            seed_extension(self.study_dir / "runs" / cell.extends, rd)

    def _submit(self, executor: Executor, unit: list[Cell]) -> Any:
        if len(unit) == 1:
            cell = unit[0]
            self._seed(cell)
            return executor.submit(self._cell_spec(cell), str(self.study_dir / "runs" / cell.run_id))
        from race.grid.gangs import gang_id

        return executor.submit_gang([self._cell_spec(c) for c in unit],
                                    [str(self.study_dir / "runs" / c.run_id) for c in unit],
                                    str(self.study_dir / "gangs" / gang_id(unit)))

    def _loop(self, executor: Executor, queue: "deque[list[Cell]]") -> int:
        tries: Counter[str] = Counter()
        inflight: dict[Any, list[Cell]] = {}
        ran = 0
        while queue or inflight:
            while queue and len(inflight) < executor.capacity:
                unit = queue.popleft()
                inflight[self._start(executor, unit)] = unit
            for handle, outcome in executor.wait(list(inflight), timeout=self.poll_s):
                unit = inflight.pop(handle)
                ran += len(unit)
                failed = self._collect(unit, outcome)
                if failed:
                    self._fail_or_retry(unit, failed, tries, queue)
            self._emit("tick")
        return ran

    def _start(self, executor: Executor, unit: list[Cell]) -> Any:
        """Submit a unit (one cell, or a gang's cells), its cells marked running; its handle."""
        for cell in unit:
            self.store.mark_running(cell.run_id)
        handle = self._submit(executor, unit)
        for cell in unit:
            self.started[cell.run_id] = time.monotonic()
            self.status[cell.run_id] = "running"
            self.progress.running += 1
            self._emit("started", cell)
        return handle

    def _collect(self, unit: list[Cell], outcome: dict) -> list[tuple[Cell, str]]:
        """Store a finished unit's results (a gang's per member) and count them; the cells
        that failed, or whose results could not be stored, with their errors."""
        p = self.progress
        outcomes = [outcome] if len(unit) == 1 else (outcome["members"] if outcome.get("ok") else
                                                       [outcome] * len(unit))
        failed = []
        for cell, oc in zip(unit, outcomes):
            p.running -= 1
            if oc.get("ok"):
                try:
                    status = self.store.ingest(cell.run_id, oc["result"])
                except (KeyError, ValueError, TypeError) as e:
                    oc = {"ok": False, "error": f"cell results could not be stored: {type(e).__name__}: {e}"}
                else:
                    flops = float(oc["result"]["run"].get("total_flops") or 0.0)
                    self.session_flops += flops
                    if cell.run_id in self.predicted and len(unit) == 1:
                        self.observed.append((self.predicted[cell.run_id],
                                              time.monotonic() - self.started[cell.run_id]))
                    p.flops_done += flops
                    p.complete += 1
                    self.status[cell.run_id] = status
                    self._emit("complete", cell, None if status == "complete" else status)
                    continue
            failed.append((cell, str(oc.get("error") or "unknown error")))
        if not failed and len(unit) > 1 and all(c.run_id in self.predicted for c in unit):  # a gang: one wall
            self.observed.append((sum(self.predicted[c.run_id] for c in unit),
                                  time.monotonic() - self.started[unit[0].run_id]))
        return failed

    def _fail_or_retry(self, unit: list[Cell], failed: list[tuple[Cell, str]], tries: Counter[str],
                       queue: "deque[list[Cell]]") -> None:
        """A unit with failed cells goes back on the queue until ``max_retries`` tries of it
        failed (a gang retries whole: its members resume from its checkpoint); then its
        failed cells are marked failed."""
        key = ",".join(c.run_id for c in unit)
        tries[key] += 1
        retry = tries[key] <= self.spec.max_retries
        for cell, error in failed:
            if retry:
                self.store.mark_pending(cell.run_id, error)
                self.status[cell.run_id] = "pending"
                self._emit("retry", cell, f"attempt {tries[key]} failed: {_last_line(error)}")
            else:
                self.store.mark_failed(cell.run_id, error)
                self.status[cell.run_id] = "failed"
                self.progress.failed += 1
                self._emit("failed", cell, _last_line(error))
        if retry:
            queue.append(unit)  # a gang retries whole (its members resume from its checkpoint)


def _last_line(error: str) -> str:
    first = error.strip().splitlines()[0] if error.strip() else error
    return first[:300]


def _selected(spec: GridSpec, runnable: list[Cell], only: "list[str] | set[str] | None") -> list[Cell]:
    """The runnable cells this session runs: all of them, or those ``only`` names (with a
    gang, the whole gangs of the cells named); a name that is no runnable cell is refused."""
    if only is None:
        return list(runnable)
    unknown = set(only) - {c.run_id for c in runnable}
    if unknown:
        raise ValueError(f"only= names run ids that are not runnable cells of this grid: {sorted(unknown)}")
    selected = [c for c in runnable if c.run_id in set(only)]
    if spec.gang:  # a gang runs whole: the gangs of the cells named (race.grid.gangs)
        from race.grid.gangs import gang_units

        named = {c.run_id for c in selected}
        selected = [c for u in gang_units(runnable, gang=True, gang_size=spec.gang_size)
                    if any(c.run_id in named for c in u) for c in u]
    return selected


def run_grid(spec: "GridSpec | dict | str | Path", study_dir: str | Path | None = None, *,
             runner: str | None = None, workers: int | None = None, threads_per_worker: int | None = None,
             ray_address: str | None = None, retry_failed: bool = False,
             on_event: Callable[[GridEvent], None] | None = None, predictor: Predictor | None = None,
             only: "list[str] | set[str] | None" = None, poll_s: float = 0.5,
             as_study_spec: bool = True, cells: "list[Cell] | None" = None) -> GridResult:
    """Run (or resume) a grid into ``study_dir`` (default ``studies/<study>``).

    ``spec``: a ``GridSpec``, a grid-spec dict or a grid file: the library's one entry that
    takes all three (``as_grid_spec``); every function below it takes the ``GridSpec``.
    Keyword settings override the grid file's ``runner``. Cells already complete are
    skipped; cells failed in an earlier session are skipped unless ``retry_failed``.
    ``only`` restricts the session to those run ids (the whole grid is still registered).
    ``as_study_spec=False`` runs the cells into an existing study without recording this
    spec as the study's grid (e.g. validation runs at a larger budget: "run these
    configs into this study"). ``cells``: run these cells of the grid instead of
    ``spec.cells()`` (a racing rung's, ``race.protocol.racing``); only they are registered.
    A cell that extends another (``Cell.extends``) starts from that run's checkpoint.
    Raises :class:`~race.grid.lock.StudyLockedError` when another driver runs the study.
    """
    spec = as_grid_spec(spec).with_runner(kind=runner, workers=workers, threads_per_worker=threads_per_worker,
                                          ray_address=ray_address)
    sdir = Path(study_dir) if study_dir is not None else default_study_dir(spec)
    sdir = sdir.resolve()
    plan = plan_grid(spec, predictor=predictor, study_dir=sdir, cells=cells)
    notes = list(plan.notes)
    selected = _selected(spec, [pc.cell for pc in plan.runnable], only)
    with StudyLock(sdir), Store(sdir) as store:
        if as_study_spec or store.study_name() is None:
            store.register_study(spec.study, spec.model_dump_json())
        elif store.study_name() != spec.study:
            raise StoreError(f"{sdir} holds study {store.study_name()!r}, not {spec.study!r}")
        store.add_cells(spec.study, [pc.cell for pc in plan.runnable])
        chosen = {c.run_id for c in selected}
        restarted = [rid for rid in store.reset_running() if rid in chosen]
        if restarted:
            notes.append(f"restarting {len(restarted)} cell(s) left running by a previous driver (they resume "
                         "from their checkpoints)")
        statuses = {r["run_id"]: r["status"] for r in store.runs()}
        skipped = sum(1 for c in selected if statuses[c.run_id] in FINISHED)
        old_failed = sum(1 for c in selected if statuses[c.run_id] == "failed")
        if old_failed and not retry_failed:
            notes.append(f"{old_failed} cell(s) failed in an earlier session; pass retry_failed (--retry-failed) "
                         "to run them again")
        driver = _Driver(spec, plan, store, sdir, on_event, poll_s, selected)
        t0 = time.monotonic()
        ran, failed = driver.run(lambda: make_executor(spec.runner, spec.cell_fn), retry_failed)
    return GridResult(study=spec.study, study_dir=sdir, total=len(selected),
                      complete=sum(1 for c in selected if driver.status[c.run_id] in FINISHED),
                      failed=failed, refused=plan.refused, skipped_complete=skipped, restarted=restarted,
                      ran=ran, elapsed_s=time.monotonic() - t0,
                      notes=notes)
