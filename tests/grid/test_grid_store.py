"""The SQLite store and the locks, in process."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from race.grid import SCHEMA_VERSION, Store, StoreError, StudyLock, StudyLockedError, expand_grid, grid_spec_from_dict
from race.grid.cell import collect_run_dir
from race.grid.store import migrate

from .conftest import grid
from .fake_engine import run_engine


@pytest.fixture()
def study(tmp_path):
    """A store with the grid's cells registered, and one finished fake run's result."""
    spec = grid_spec_from_dict(grid())
    cells = expand_grid(spec)
    store = Store(tmp_path / "s")
    store.register_study(spec.study, spec.model_dump_json())
    assert store.add_cells(spec.study, cells) == len(cells)
    run_dir = tmp_path / "run"
    run_engine(cells[0].config, run_dir)
    yield store, cells, collect_run_dir(run_dir)
    store.close()


def _count(store, table, run_id):
    return store.conn.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id=?", (run_id,)).fetchone()[0]


def test_schema_is_versioned_and_in_wal_mode(study):
    store, cells, _ = study
    assert store.schema_version() == SCHEMA_VERSION
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.integrity_check() == "ok"
    assert migrate(store.conn) == SCHEMA_VERSION  # idempotent
    assert store.add_cells("t", cells) == 0  # already there
    assert {r["run_id"]: r["allocation"] for r in store.runs()} == {c.run_id: c.name for c in cells}
    assert len({c.name for c in cells}) == 4 and all(c.name.startswith("tiny-") for c in cells)
    assert store.counts()["pending"] == len(cells)


def test_a_newer_schema_is_refused(tmp_path):
    Store(tmp_path).close()
    con = sqlite3.connect(tmp_path / "study.sqlite")
    con.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="upgrade RACE"):
        Store(tmp_path)


def test_ingest_writes_a_run_and_reingest_replaces_it(study):
    store, cells, result = study
    rid = cells[0].run_id
    store.mark_running(rid)
    assert store.ingest(rid, result) == "complete"
    n = {t: _count(store, t, rid) for t in ("ledger", "evals", "train_metrics")}
    assert n["ledger"] == len(result["ledger"]) > 0
    assert n["evals"] == len(result["evals"]) > 0 and n["train_metrics"] == len(result["train"]) > 0
    first = store.rows("evals")
    store.ingest(rid, result)
    assert {t: _count(store, t, rid) for t in n} == n  # no duplicates
    assert store.rows("evals") == first
    row = store.runs("complete")[0]
    assert row["run_id"] == rid and row["attempts"] == 1 and row["total_flops"] == result["run"]["total_flops"]
    assert json.loads(row["run_json"])["steps"] == result["run"]["steps"]
    assert json.loads(first[0]["per_problem_json"]) == result["evals"][0]["per_problem"]


def _old_store(path, source: Store) -> None:
    """A study store as RACE at schema 2 wrote it (``MIGRATIONS`` 1 and 2, the statements
    that RACE ran): ``source``'s rows, each run with the ``final_json`` column the old
    ``ingest`` filled (``json.dumps(run["final"])``; NULL before a run finished)."""
    from race.grid.store import MIGRATIONS

    path.mkdir(parents=True)
    con = sqlite3.connect(path / "study.sqlite", isolation_level=None)
    con.execute("PRAGMA foreign_keys = ON")
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for version in (1, 2):
        for stmt in MIGRATIONS[version]:
            con.execute(stmt)
        con.execute("INSERT INTO schema_version VALUES (?)", (version,))
    for r in source.rows("runs"):
        r = {k: v for k, v in r.items() if k not in ("extends", "allocation")}  # schema 4's and 5's columns
        r = dict(r, final_json=None if r["run_json"] is None else json.dumps(json.loads(r["run_json"])["final"]))
        con.execute(f"INSERT INTO runs ({', '.join(r)}) VALUES ({', '.join('?' * len(r))})", list(r.values()))
    for table in ("studies", "ledger", "evals", "train_metrics"):
        for r in source.rows(table):
            con.execute(f"INSERT INTO {table} ({', '.join(r)}) VALUES ({', '.join('?' * len(r))})", list(r.values()))
    con.close()


def test_a_schema_2_store_migrates_and_reads_the_same_rows(study, tmp_path):
    """Schema 3 drops ``runs.final_json`` (written, never read) by rebuilding the table: an
    old store opens, loses that column only, and its runs (a complete one and its prefix
    rows among pending ones), ledger, evaluations and training rows read back identical;
    the index and the other tables' references to ``runs`` still hold."""
    store, cells, result = study
    rid = cells[0].run_id
    store.mark_running(rid)
    nested = dict(result, run=dict(result["run"], budget_points=[
        {"budget": result["run"]["total_flops"] / 2, "step": 1, "flops": 1.0}]))
    store.ingest(rid, nested)
    want = {t: store.rows(t) for t in ("runs", "studies", "ledger", "evals", "train_metrics")}
    assert len(want["runs"]) == len(cells) + 1 and want["ledger"] and want["evals"] and want["train_metrics"]
    _old_store(tmp_path / "old", store)
    con = sqlite3.connect(tmp_path / "old" / "study.sqlite")
    assert "final_json" in [c[1] for c in con.execute("PRAGMA table_info(runs)")]
    con.close()
    with Store(tmp_path / "old", create=False) as old:
        assert old.schema_version() == SCHEMA_VERSION == 6
        assert old.rung_decisions() == []  # schema 4: racing's decision table, empty
        assert [c[1] for c in old.conn.execute("PRAGMA table_info(runs)")] == list(want["runs"][0])
        # schema 5: the allocation's name, empty in the old rows (the tables name them at load)
        assert {r["allocation"] for r in old.rows("runs")} == {None}
        assert {t: old.rows(t) for t in want if t != "runs"} == {t: v for t, v in want.items() if t != "runs"}
        assert [{**r, "allocation": None} for r in want["runs"]] == old.rows("runs")
        assert old.integrity_check() == "ok"
        assert old.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert old.conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name='runs_status'").fetchone()[0] == 1
        with pytest.raises(sqlite3.IntegrityError):  # the ledger still references runs(run_id)
            old.conn.execute("INSERT INTO ledger VALUES ('no-such-run', 1, 'rollout', 'decode', 1.0, 1, 0.0, 1)")
        assert old.ingest(rid, nested) == "complete"  # and it takes results again
        assert old.rows("evals") == want["evals"] and old.rows("ledger") == want["ledger"]
    with Store(tmp_path / "old", create=False) as again:  # migrated once
        assert again.conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 6


class _FailingConn:
    """Connection proxy whose executemany fails on one table: a crash mid-transaction."""

    def __init__(self, conn, table):
        self._conn, self._table = conn, table

    def executemany(self, sql, rows):
        if f"INTO {self._table}" in sql:
            raise sqlite3.OperationalError("disk I/O error (simulated)")
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_a_failure_inside_ingest_leaves_nothing_half_written(study):
    store, cells, result = study
    a, b = cells[0].run_id, cells[1].run_id
    store.ingest(a, result)
    before = {t: store.rows(t) for t in ("ledger", "evals", "train_metrics")}
    store.mark_running(b)
    real = store.conn
    store.conn = _FailingConn(real, "train_metrics")  # ledger and evals go in, then train fails
    with pytest.raises(sqlite3.OperationalError):
        store.ingest(b, result)
    store.conn = real
    assert {t: store.rows(t) for t in before} == before  # b's ledger/evals rolled back, a intact
    assert store.runs("running")[0]["run_id"] == b
    assert store.integrity_check() == "ok"
    # and a re-ingest of a with the same failure keeps its previous rows
    store.conn = _FailingConn(real, "evals")
    with pytest.raises(sqlite3.OperationalError):
        store.ingest(a, result)
    store.conn = real
    assert {t: store.rows(t) for t in before} == before


def test_malformed_results_and_unknown_runs_are_refused(study):
    store, cells, result = study
    bad = {**result, "evals": [{k: v for k, v in result["evals"][0].items() if k != "score"}]}
    with pytest.raises(KeyError):
        store.ingest(cells[0].run_id, bad)
    with pytest.raises(StoreError, match="not a cell of this study"):
        store.ingest("nope", result)
    assert store.counts()["complete"] == 0


def test_status_transitions_and_reset_of_running(study):
    store, cells, _ = study
    a, b = cells[0].run_id, cells[1].run_id
    store.mark_running(a)
    store.mark_running(b)
    store.mark_failed(b, "boom")
    assert store.reset_running() == [a]
    assert store.counts()["pending"] == len(cells) - 1 and store.counts()["failed"] == 1
    assert store.runs("failed")[0]["error"] == "boom"


def test_a_directory_holding_another_study_is_refused(study):
    store, _, _ = study
    with pytest.raises(StoreError, match="holds study 't'"):
        store.register_study("other", "{}")


def test_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="no study store"):
        Store(tmp_path / "nothing", create=False)


# -- locks ----------------------------------------------------------------------------

def test_study_lock_refuses_a_second_holder_and_names_the_first(tmp_path):
    with StudyLock(tmp_path):
        with pytest.raises(StudyLockedError) as e:
            StudyLock(tmp_path).acquire()
        assert f"pid {os.getpid()}" in str(e.value) and "already being run" in str(e.value)
    StudyLock(tmp_path).acquire().release()  # free again


def test_a_dead_holder_leaves_no_lock(tmp_path):
    code = ("import sys, time; from race.grid.lock import StudyLock; StudyLock(sys.argv[1]).acquire(); "
            "print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(StudyLockedError, match=f"pid {proc.pid} on host"):
            StudyLock(tmp_path).acquire()
    finally:
        proc.kill()
        proc.wait()
    deadline = time.time() + 60  # liveness only: the flock goes with the reaped process
    while True:  # the kernel drops the flock with the process
        try:
            StudyLock(tmp_path).acquire().release()
            break
        except StudyLockedError:
            assert time.time() < deadline
            time.sleep(0.05)
