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
