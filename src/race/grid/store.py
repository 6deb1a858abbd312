"""The study store: one SQLite file per study (``<study_dir>/study.sqlite``), WAL mode.

Only the grid driver writes it; workers hand their results back to the driver. A run's
rows (ledger, evals, train metrics) and its ``complete`` status are written in one
transaction, so a crash at any point leaves either the whole run or none of it, and
re-ingesting a run replaces its rows instead of adding to them.

A run that stood in for smaller budgets (``eval.at_budgets``, a nested grid) also gets, in
the same transaction, one row per budget point: a complete run at that budget whose
``prefix_of`` names the run it is a prefix of and ``prefix_step`` the step it ends at, with
the rows of that run up to that step (:func:`prefix_id`). Such a row was not run on its
own: it has no wall time and no run directory.

Schema changes go through :data:`MIGRATIONS` (version -> statements, frozen:
:mod:`race.grid.migrations`); the
``schema_version`` table records where a file stands and :func:`migrate` brings it up,
each version in one transaction with foreign keys checked at its end (a version may
rebuild a table: SQLite's create-copy-drop-rename, which needs enforcement off while the
old table is dropped).
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from race.grid.migrations import MIGRATIONS, SCHEMA_VERSION
from race.schema import STATUSES

STORE_FILE = "study.sqlite"


def prefix_id(run_id: str, index: int) -> str:
    """The id of the ``index``-th (ascending budget) prefix row of run ``run_id``."""
    return f"{run_id}.p{index}"


def is_read_prefix(run_id: str, of: str) -> bool:
    """Whether ``run_id`` is a prefix row the store wrote for run ``of`` (:func:`prefix_id`),
    not a cell that ran and was then extended by ``of`` (both say ``prefix_of``)."""
    return run_id.startswith(f"{of}.p") and run_id[len(of) + 2:].isdigit()


def _insert_rows(c: sqlite3.Connection, run_id: str, ledger: list[dict[str, Any]], evals: list[dict[str, Any]],
                 train: list[dict[str, Any]]) -> None:
    """Insert a run's rows (as :meth:`Store.ingest` normalises them) under ``run_id``."""
    c.executemany("INSERT INTO ledger VALUES (?,?,?,?,?,?,?,?)",
                  [(run_id, r["step"], r["phase"], r["component"], r["flops"], r["tokens"], r["seconds"], r["counted"])
                   for r in ledger])
    c.executemany("INSERT INTO evals VALUES (?,?,?,?,?,?,?)",
                  [(run_id, e["step"], e["flops"], e["target"], e["score"], e["n"], e["per_problem_json"])
                   for e in evals])
    c.executemany("INSERT INTO train_metrics VALUES (?,?,?,?)",
                  [(run_id, t["step"], t["flops"], json.dumps(t["metrics"], sort_keys=True)) for t in train])


class StoreError(RuntimeError):
    """The study store cannot be used as asked; the message says why and what to do."""


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; return the version found before."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    current = row[0] or 0
    if current > SCHEMA_VERSION:
        raise StoreError(f"study store has schema version {current}, but this RACE knows up to "
                         f"{SCHEMA_VERSION}: upgrade RACE to read it")
    if current == SCHEMA_VERSION:
        return current
    enforce = conn.execute("PRAGMA foreign_keys").fetchone()[0]
    conn.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction: set before BEGIN
    try:
        for version in range(current + 1, SCHEMA_VERSION + 1):
            conn.execute("BEGIN IMMEDIATE")
            try:
                if (conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0) >= version:
                    conn.execute("COMMIT")  # another process migrated this version meanwhile
                    continue
                for stmt in MIGRATIONS[version]:
                    conn.execute(stmt)
                broken = conn.execute("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise StoreError(f"migrating the study store to schema {version} would leave {len(broken)} "
                                     f"rows without their run (first: {tuple(broken[0])}); the file is left at "
                                     f"schema {version - 1}: check it with `sqlite3 ... 'PRAGMA foreign_key_check'`")
                conn.execute("INSERT INTO schema_version(version) VALUES (?)", (version,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
    finally:
        conn.execute(f"PRAGMA foreign_keys = {'ON' if enforce else 'OFF'}")
    return current


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


class Store:
    """A study's SQLite store. Use as a context manager or call :meth:`close`."""

    def __init__(self, study_dir: str | Path, create: bool = True):
        self.study_dir = Path(study_dir)
        self.path = self.study_dir / STORE_FILE
        if not self.path.exists() and not create:
            raise StoreError(f"no study store at {self.path}: run `race grid run` first, or check the study directory")
        self.study_dir.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA busy_timeout = 60000")
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute("PRAGMA foreign_keys = ON")
        migrate(self.conn)

    # -- plumbing ----------------------------------------------------------------------
    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def integrity_check(self) -> str:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]

    def schema_version(self) -> int:
        return self.conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]

    # -- study and cells ---------------------------------------------------------------
    def study_name(self) -> str | None:
        row = self.conn.execute("SELECT name FROM studies").fetchone()
        return row[0] if row else None

    def study_spec(self) -> dict[str, Any] | None:
        """The study's grid spec as :meth:`register_study` recorded it (a dict), else None."""
        row = self.conn.execute("SELECT spec_json FROM studies").fetchone()  # one study per store
        spec = json.loads(row[0]) if row else None
        return spec if isinstance(spec, dict) else None

    def run_specs(self) -> dict[str, dict[str, Any]]:
        """Run id -> the run's stored RunConfig (``Cell.spec_dict()``, as the grid registered it)."""
        return {r[0]: json.loads(r[1]) for r in self.conn.execute("SELECT run_id, spec_json FROM runs")}

    def register_study(self, name: str, spec_json: str) -> None:
        """Record the study; refuse a directory that holds a different study."""
        existing = self.study_name()
        if existing is not None and existing != name:
            raise StoreError(f"{self.study_dir} holds study {existing!r}, but the grid file names {name!r}: "
                             "pass another --study-dir, or rename the study in the grid file")
        now = time.time()
        with self.transaction() as c:
            c.execute("INSERT INTO studies(name, spec_json, created_at, updated_at) VALUES (?,?,?,?) "
                      "ON CONFLICT(name) DO UPDATE SET spec_json=excluded.spec_json, updated_at=excluded.updated_at",
                      (name, spec_json, now, now))

    def add_cells(self, study: str, cells: Iterable[Any]) -> int:
        """Insert cells as ``pending`` (cells already present keep their state and name),
        each with its allocation's name (``Cell.name``: the ``allocation`` column). Returns
        how many were new."""
        rows = []
        for cell in cells:
            cfg = cell.config
            rows.append((cell.run_id, study, cell.index, json.dumps(cell.spec_dict(), sort_keys=True),
                         json.dumps(cell.allocation, sort_keys=True), cell.label, cfg.engine, cfg.model,
                         cfg.num_generations, cfg.prompts_per_step, cfg.num_iterations, cfg.learning_rate,
                         str(cfg.reward), cfg.lora.r if cfg.lora else None, cfg.budget_flops, cfg.seed,
                         getattr(cell, "extends", None), getattr(cell, "name", None) or None))
        return self._add_rows(rows)

    def add_external_runs(self, study: str, runs: Iterable[dict[str, Any]]) -> int:
        """Register runs trained outside RACE (``race import``, ``race.protocol.imports``) as
        ``pending`` cells in the columns a grid cell fills; :meth:`ingest` then writes each
        one's rows. A run is a mapping: ``run_id``, ``position``, ``spec``, ``allocation`` (keys
        beyond ``race.schema.OWN_COLUMN_AXES`` become ``axis_*`` columns), ``label``, ``engine``,
        ``budget``, ``seed``, the allocation columns and ``lora_r``. Returns how many were new."""
        rows = [(r["run_id"], study, int(r["position"]), json.dumps(r["spec"], sort_keys=True),
                 json.dumps(r["allocation"], sort_keys=True), r["label"], r.get("engine"), r["model"],
                 int(r["num_generations"]), int(r["prompts_per_step"]), int(r["num_iterations"]),
                 float(r["learning_rate"]), str(r["reward"]), r.get("lora_r"), float(r["budget"]), int(r["seed"]),
                 None, r.get("name")) for r in runs]
        return self._add_rows(rows)

    def _add_rows(self, rows: list[tuple[Any, ...]]) -> int:
        with self.transaction() as c:
            known = {r[0] for r in c.execute("SELECT run_id FROM runs")}
            c.executemany(
                "INSERT OR IGNORE INTO runs(run_id, study, position, spec_json, allocation_json, label, engine, model, "
                "num_generations, prompts_per_step, num_iterations, learning_rate, reward, lora_r, budget, seed, "
                "extends, allocation) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            # keep positions in line with the current grid file's order
            c.executemany("UPDATE runs SET position=? WHERE run_id=?", [(r[2], r[0]) for r in rows])
        return sum(1 for r in rows if r[0] not in known)

    def reset_running(self) -> list[str]:
        """Cells left ``running`` by a driver that died go back to ``pending``."""
        with self.transaction() as c:
            ids = [r[0] for r in c.execute("SELECT run_id FROM runs WHERE status='running'")]
            c.execute("UPDATE runs SET status='pending' WHERE status='running'")
        return ids

    def mark_running(self, run_id: str) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET status='running', attempts=attempts+1, started_at=?, error=NULL "
                      "WHERE run_id=?", (time.time(), run_id))

    def mark_pending(self, run_id: str, error: str | None = None) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET status='pending', error=? WHERE run_id=?", (error, run_id))

    def mark_failed(self, run_id: str, error: str) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET status='failed', error=?, finished_at=? WHERE run_id=?",
                      (error, time.time(), run_id))

    # -- results -----------------------------------------------------------------------
    def ingest(self, run_id: str, result: dict[str, Any]) -> str:
        """Write a finished run: its ledger, evals and train rows and its summary, replacing
        any rows it had, in one transaction. Returns the stored status."""
        run = result["run"]
        status = "diverged" if run.get("status") == "diverged" else "complete"
        ledger = [{"step": int(r["step"]), "phase": str(r["phase"]), "component": str(r.get("component", "")),
                   "flops": float(r["flops"]), "tokens": None if r.get("tokens") is None else int(r["tokens"]),
                   "seconds": _num(r.get("seconds")), "counted": int(bool(r.get("counted", True))),
                   } for r in result.get("ledger", [])]
        evals = [{"step": int(r["step"]), "flops": float(r["flops"]), "target": str(r["target"]),
                  "score": float(r["score"]), "n": None if r.get("n") is None else int(r["n"]),
                  "per_problem_json": None if r.get("per_problem") is None else json.dumps(list(r["per_problem"]))}
                 for r in result.get("evals", [])]
        train = [{"step": int(r["step"]), "flops": float(r["flops"]),
                  "metrics": {k: v for k, v in r.items() if k not in ("kind", "step", "flops")}}
                 for r in result.get("train", [])]
        wall = run.get("wall_s", result.get("wall_s"))
        with self.transaction() as c:
            if c.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is None:
                raise StoreError(f"run {run_id} is not a cell of this study")
            for table in ("ledger", "evals", "train_metrics"):
                c.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))
            _insert_rows(c, run_id, ledger, evals, train)
            c.execute(
                "UPDATE runs SET status=?, error=?, finished_at=?, wall_s=?, total_flops=?, steps=?, model_params=?, "
                "run_json=? WHERE run_id=?",
                (status, run.get("error") if status == "diverged" else None, time.time(), _num(wall),
                 _num(run.get("total_flops")), run.get("steps"), run.get("model_params"),
                 json.dumps(run, sort_keys=True), run_id))
            self._write_prefixes(c, run_id, run, ledger, evals, train)
        return status

    def _write_prefixes(self, c: sqlite3.Connection, run_id: str, run: dict[str, Any], ledger: list[dict[str, Any]],
                        evals: list[dict[str, Any]], train: list[dict[str, Any]]) -> None:
        """Replace the prefix rows of ``run_id``: one complete run per budget point of
        ``run`` (``run.json``'s ``budget_points``), with its rows up to the point's step, its
        summary from those rows (``race.records.run_record``). A run that extends a shorter
        one (``run.json``'s ``extends``: it resumed that run's last checkpoint with a larger
        budget) makes that run its prefix (``prefix_of``) instead of writing the points the
        shorter run and its own prefixes already stand for."""
        from race.records import run_record

        old = [r[0] for r in c.execute("SELECT run_id FROM runs WHERE prefix_of=?", (run_id,))
               if is_read_prefix(r[0], run_id)]
        for pid in old:
            for table in ("ledger", "evals", "train_metrics"):
                c.execute(f"DELETE FROM {table} WHERE run_id=?", (pid,))
            c.execute("DELETE FROM runs WHERE run_id=?", (pid,))
        extends = run.get("extends") or {}
        if extends.get("run_id"):  # (the cell's registered ``extends`` says the same: race.grid.runners)
            c.execute("UPDATE runs SET prefix_of=?, prefix_step=? WHERE run_id=?",
                      (run_id, int(extends["steps"]), extends["run_id"]))
        points = sorted(run.get("budget_points") or [], key=lambda p: p["budget"])
        if not points or run.get("status") == "diverged":
            return
        cols = [d[1] for d in c.execute("PRAGMA table_info(runs)")]
        base = dict(zip(cols, c.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()))
        spec = json.loads(base["spec_json"])
        checked = (run.get("diagnostics") or {}).get("overoptimisation")  # a learned reward's runs are checked
        rows = [{"step": t["step"], "flops": t["flops"], **t["metrics"]} for t in train]
        for i, p in enumerate(points):
            if extends and float(p["budget"]) <= float(extends["budget_flops"]):
                continue  # the extended run and its prefixes stand for this budget already
            pid, b, k = prefix_id(run_id, i), float(p["budget"]), int(p["step"])
            rec = run_record(evals=evals, train=rows, ledger=ledger, upto_step=k, learned=checked is not None,
                             target=(checked or {}).get("target", "greedy"))
            pspec = {**spec, "budget_flops": b,
                     "eval": {**spec.get("eval", {}), "at_budgets": [q["budget"] for q in points[:i]]}}
            prun = {"run_id": pid, "prefix_of": run_id, "prefix_step": k, "status": "complete",
                    "stop_reason": "prefix", "engine": run.get("engine"), "budget_flops": b,
                    "model_params": run.get("model_params"), "non_embedding_params": run.get("non_embedding_params"),
                    "conventions": run.get("conventions"), **rec.as_dict()}
            row = {**base, "run_id": pid, "spec_json": json.dumps(pspec, sort_keys=True), "budget": b,
                   "status": "complete", "error": None, "wall_s": None, "total_flops": rec.total_flops, "steps": k,
                   "run_json": json.dumps(prun, sort_keys=True), "prefix_of": run_id, "prefix_step": k}
            c.execute(f"INSERT INTO runs({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                      [row[col] for col in cols])
            _insert_rows(c, pid, [r for r in ledger if r["step"] <= k], [e for e in evals if e["step"] <= k],
                         [t for t in train if t["step"] <= k])

    # -- queries -----------------------------------------------------------------------
    def runs(self, status: str | None = None) -> list[dict[str, Any]]:
        q = "SELECT * FROM runs" + (" WHERE status=?" if status else "") + " ORDER BY position, run_id"
        return [dict(r) for r in self.conn.execute(q, (status,) if status else ())]

    def counts(self) -> dict[str, int]:
        """Cells by status (the prefix rows the store wrote are not cells)."""
        out = {s: 0 for s in STATUSES}
        for rid, of, status in self.conn.execute("SELECT run_id, prefix_of, status FROM runs"):
            if not (of and is_read_prefix(rid, of)):
                out[status] += 1
        return out

    # -- racing: each rung's decision, stored once --------------------------------------
    def rung_decision(self, rung: int) -> dict[str, Any] | None:
        """The decision stored for rung ``rung`` (its ``RungDecision.as_dict()``), else None."""
        row = self.conn.execute("SELECT decision_json FROM rung_decisions WHERE rung=?", (int(rung),)).fetchone()
        return json.loads(row[0]) if row else None

    def record_rung_decision(self, rung: int, budget: float, decision: dict[str, Any]) -> dict[str, Any]:
        """Store rung ``rung``'s decision unless one is stored (a resumed driver keeps the
        first); returns the stored one."""
        with self.transaction() as c:
            c.execute("INSERT OR IGNORE INTO rung_decisions(rung, budget, decision_json, created_at) VALUES (?,?,?,?)",
                      (int(rung), float(budget), json.dumps(decision, sort_keys=True, allow_nan=False), time.time()))
        stored = self.rung_decision(rung)
        assert stored is not None
        return stored

    def race_schedule(self) -> dict[str, Any] | None:
        """The racing schedule stored when the race started (``RungSchedule.as_dict()``), else None."""
        row = self.conn.execute("SELECT schedule_json FROM race_schedule WHERE id=0").fetchone()
        return json.loads(row[0]) if row else None

    def record_race_schedule(self, schedule: dict[str, Any]) -> dict[str, Any]:
        """Store the race's schedule unless one is stored (a resumed race keeps its first); returns
        the stored one."""
        with self.transaction() as c:
            c.execute("INSERT OR IGNORE INTO race_schedule(id, schedule_json, created_at) VALUES (0,?,?)",
                      (json.dumps(schedule, sort_keys=True, allow_nan=False), time.time()))
        stored = self.race_schedule()
        assert stored is not None
        return stored

    def rung_decisions(self) -> list[dict[str, Any]]:
        """Every stored rung decision, first rung first."""
        return [json.loads(r[0]) for r in self.conn.execute("SELECT decision_json FROM rung_decisions ORDER BY rung")]

    def completed_summaries(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute(
            "SELECT run_id, total_flops, steps, wall_s FROM runs WHERE status='complete'")]

    def rows(self, table: str) -> list[dict[str, Any]]:
        if table not in ("ledger", "evals", "train_metrics", "runs", "studies"):
            raise StoreError(f"unknown table {table!r}")
        order = {"ledger": "run_id, step, rowid", "evals": "run_id, step, rowid", "train_metrics": "run_id, step, rowid",
                 "runs": "position, run_id", "studies": "name"}[table]
        return [dict(r) for r in self.conn.execute(f"SELECT * FROM {table} ORDER BY {order}")]
