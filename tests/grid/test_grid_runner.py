"""The local runner end to end on the fake engine: retries, a SIGKILLed driver, two
drivers on one study, the CLI, and the analysis tables."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from race.cli.grid import app
from race.grid import (
    Store,
    StudyLockedError,
    expand_grid,
    grid_spec_from_dict,
    load_tables,
    run_grid,
    study_status,
)
from race.grid.tables import EVAL_COLUMNS, RUN_COLUMNS

from .conftest import grid, snapshot, write_grid

DRIVER = "import sys; from race.grid import run_grid; run_grid(sys.argv[1], sys.argv[2])"


def test_failing_cell_is_retried_then_marked_failed_and_the_rest_complete(tmp_path):
    spec = grid(axes={"model": ["tiny-xs", "fail-xs", "flaky-xs"]}, max_retries=2)
    events = []
    res = run_grid(spec, tmp_path, on_event=lambda e: events.append((e.kind, e.run_id)), poll_s=0.1)
    rows = {(r["model"], r["budget"]): r for r in Store(tmp_path).runs()}
    assert len(rows) == 6 and res.total == 6
    for b in (2e9, 2e10):
        fail, flaky, ok = rows[("fail-xs", b)], rows[("flaky-xs", b)], rows[("tiny-xs", b)]
        assert fail["status"] == "failed" and fail["attempts"] == 3
        assert "FakeEngineError: fake engine: model 'fail-xs' always fails at step 2" in fail["error"]
        assert "Traceback" in fail["error"]
        assert flaky["status"] == "complete" and flaky["attempts"] == 2 and flaky["error"] is None
        assert json.loads(flaky["run_json"])["resumed_from"] == [2]  # resumed from its checkpoint
        assert ok["status"] == "complete" and ok["attempts"] == 1
        assert json.loads(ok["run_json"])["omp_threads"] == "1"  # threads_per_worker reached the worker
    assert sorted(res.failed) == sorted(r["run_id"] for r in rows.values() if r["status"] == "failed")
    assert res.complete == 4 and not res.ok
    kinds = [k for k, _ in events]
    assert kinds.count("retry") == 2 * 2 + 2 and kinds.count("failed") == 2 and kinds.count("complete") == 4
    assert kinds[0] == "start" and kinds[-1] == "finish"
    # the flaky cell's rows were written once, although its first attempt wrote part of the run
    snap = snapshot(tmp_path)
    flaky_id = rows[("flaky-xs", 2e9)]["run_id"]
    steps = [s for (rid, s, *_rest) in snap["train"] if rid == flaky_id]
    assert steps == list(range(1, rows[("flaky-xs", 2e9)]["steps"] + 1))

    # a new session skips complete and failed cells ...
    again = run_grid(spec, tmp_path, poll_s=0.1)
    assert again.ran == 0 and again.skipped_complete == 4
    assert any("--retry-failed" in n for n in again.notes)
    # ... unless asked to retry the failed ones
    retried = run_grid(spec, tmp_path, retry_failed=True, poll_s=0.1)
    assert retried.ran == 2 * 3
    assert {r["attempts"] for r in Store(tmp_path).runs("failed")} == {6}
    assert snapshot(tmp_path)["ledger"] == snap["ledger"]


def _marker_procs(marker: str) -> list[int]:
    pids = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in env.read_bytes():
                pids.append(int(env.parent.name))
        except OSError:
            pass
    return pids


def _describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = [ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith(("State", "PPid"))]
        except OSError:
            continue
        out.append(f"{pid} {state} {cmd[:150]}")
    return "; ".join(out)


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc")
def test_sigkill_of_the_driver_loses_and_duplicates_nothing(tmp_path):
    spec = grid()
    ref = run_grid(spec, tmp_path / "ref", poll_s=0.1)
    assert ref.ok and ref.complete == 8

    grid_file = write_grid(tmp_path / "grid.yaml", spec)
    study = tmp_path / "killed"
    marker = f"race-grid-test-{uuid.uuid4().hex}"
    env = {**os.environ, "RACE_FAKE_STEP_SLEEP": "0.03", "RACE_GRID_TEST_MARKER": marker}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(grid_file), str(study)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    big = {c.run_id for c in expand_grid(grid_spec_from_dict(spec)) if c.budget == 2e10}
    try:
        deadline = time.time() + 90
        while True:  # kill once some cells are stored and a long cell is part-way through
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "driver made no progress"
            done = running = []
            if (study / "study.sqlite").exists():
                try:
                    con = sqlite3.connect(study / "study.sqlite", timeout=5)
                    done = [r[0] for r in con.execute("SELECT run_id FROM runs WHERE status='complete'")]
                    running = [r[0] for r in con.execute("SELECT run_id FROM runs WHERE status='running'")]
                    con.close()
                except sqlite3.OperationalError:
                    pass
            mid = [rid for rid in running if rid in big and (study / "runs" / rid / "checkpoint/state.json").exists()
                   and 1 <= json.loads((study / "runs" / rid / "checkpoint/state.json").read_text())["step"] <= 15]
            if len(done) >= 2 and mid:
                break
            time.sleep(0.05)
        # meanwhile a second driver is refused, naming the first, and status sees the first
        with pytest.raises(StudyLockedError, match=f"pid {proc.pid}"):
            run_grid(spec, study)
        assert study_status(study).driver["pid"] == proc.pid
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    # the orphaned workers notice the dead driver and stop writing
    deadline = time.time() + 120  # liveness only: a hang fails instead of blocking the suite
    while _marker_procs(marker):
        assert time.time() < deadline, f"workers outlived the killed driver: {_describe(_marker_procs(marker))}"
        time.sleep(0.1)
    with Store(study) as s:
        assert s.integrity_check() == "ok"
        assert s.counts()["running"] >= 1 and s.counts()["complete"] >= 2
    assert study_status(study).driver is None  # the dead driver's lock record is recognised as stale

    res = run_grid(spec, study, poll_s=0.1)
    assert res.ok and res.complete == 8 and res.restarted
    assert res.skipped_complete >= 2
    got, want = snapshot(study), snapshot(tmp_path / "ref")
    assert got == want  # every cell once, every ledger/eval/train row once, same numbers
    with Store(study) as s:
        assert s.integrity_check() == "ok"
        runs = s.runs()
    assert len(runs) == 8 and all(r["status"] == "complete" for r in runs)
    resumed = [json.loads(r["run_json"])["resumed_from"] for r in runs if r["run_id"] in mid]
    assert resumed and all(resumed), "the interrupted cell should resume from its checkpoint"


def test_cli_run_status_export_and_tables(tmp_path):
    grid_file = write_grid(tmp_path / "grid.yaml", grid(axes={"model": ["tiny-xs", "fail-xs"]}, max_retries=0,
                                                         seeds=[0, 1]))
    study = tmp_path / "study"
    cli = CliRunner(env={"COLUMNS": "250"})
    r = cli.invoke(app, ["plan", str(grid_file)])
    assert r.exit_code == 0, r.output
    assert "8 cells" in r.output and "model=tiny-xs" in r.output and "est. wall time" in r.output
    r = cli.invoke(app, ["plan", str(grid_file), "--json"])
    assert len(json.loads(r.output)["cells"]) == 8

    r = cli.invoke(app, ["run", str(grid_file), "--study-dir", str(study), "--workers", "2"])
    assert r.exit_code == 1, r.output  # failed cells -> non-zero
    assert "4/8 cells complete" in r.output and "4 failed" in r.output

    r = cli.invoke(app, ["status", str(study)])
    assert r.exit_code == 0 and "complete: 4" in r.output and "failed: 4" in r.output
    st = study_status(study)
    assert st.counts["complete"] == 4 and st.total == 8
    assert all("always fails" in c["error"] for c in st.cells if c["status"] == "failed")

    t = load_tables(study)
    runs, evals = t["runs"], t["evals"]
    assert list(runs.columns[: len(RUN_COLUMNS)]) == RUN_COLUMNS
    assert list(evals.columns) == EVAL_COLUMNS
    done = runs[runs.status == "complete"]
    assert len(done) == 4 and set(done.model) == {"tiny-xs"} and set(runs.study) == {"t"}
    row = done.iloc[0]
    run_json = json.loads(next(r for r in Store(study).runs() if r["run_id"] == row.run_id)["run_json"])
    ph = run_json["phase_flops"]
    assert row.learning_flops == ph["update"] + ph["old_logprobs"] + ph["reference"]
    assert row.rollout_flops == ph["rollout"] and row.feedback_flops == ph["reward"]
    assert row.total_flops == row.rollout_flops + row.learning_flops + row.feedback_flops <= row.budget
    assert row.model_params == 57_000 and row.zero_var_frac == run_json["diagnostics"]["zero_var_frac"]
    assert runs[runs.status == "failed"].total_flops.isna().all()
    assert isinstance(evals.per_problem.iloc[0], list) and len(evals.per_problem.iloc[0]) == evals.n.iloc[0]
    assert set(evals.run_id) == set(done.run_id)
    try:  # the tables satisfy the analysis module's schema checks, where that module is present
        from race.analysis import prepare_runs, validate_evals, validate_runs
    except ImportError:
        pass
    else:
        validate_runs(runs)
        validate_evals(evals)
        assert len(prepare_runs(runs)) == 4
        # the grid writes the parsed spec's kind; the analysis reads that column as it is
        from race.spec.reward import parse_reward

        assert list(runs.reward_system) == [parse_reward(r).kind for r in runs.reward]
        assert list(prepare_runs(runs.assign(reward_system="sentinel")).reward_system) == ["sentinel"] * 4

    import pandas as pd

    for fmt in ("parquet", "csv"):
        out = tmp_path / f"out-{fmt}"
        r = cli.invoke(app, ["export", str(study), "--format", fmt, "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert {p.name for p in out.iterdir()} == {f"{n}.{fmt}" for n in ("runs", "evals", "ledger", "train")}
    pq = pd.read_parquet(tmp_path / "out-parquet" / "evals.parquet")
    assert list(pq.per_problem.iloc[0]) == evals.per_problem.iloc[0]
    csv = pd.read_csv(tmp_path / "out-csv" / "runs.csv")
    assert len(csv) == 8 and list(csv.columns[: len(RUN_COLUMNS)]) == RUN_COLUMNS
    assert len(pd.read_csv(tmp_path / "out-csv" / "ledger.csv")) == len(t["ledger"])


def test_cli_errors_are_clear(tmp_path):
    cli = CliRunner(env={"COLUMNS": "250"})
    bad = write_grid(tmp_path / "bad.yaml", grid(budgets=[1e9, 2e9]))
    r = cli.invoke(app, ["plan", str(bad)])
    assert r.exit_code == 2 and "require_budget_span" in r.output
    r = cli.invoke(app, ["status", str(tmp_path / "none")])
    assert r.exit_code == 2 and "no study store" in r.output
    good = write_grid(tmp_path / "good.yaml", grid())
    from race.grid import StudyLock

    with StudyLock(tmp_path / "study"):
        r = cli.invoke(app, ["run", str(good), "--study-dir", str(tmp_path / "study"), "--quiet"])
    assert r.exit_code == 2 and "already being run by another driver" in r.output


def test_only_runs_the_named_cells_and_a_finished_grid_starts_no_workers(tmp_path):
    spec = grid()
    ids = [c.run_id for c in expand_grid(grid_spec_from_dict(spec))]
    with pytest.raises(ValueError, match="not runnable cells"):
        run_grid(spec, tmp_path, only=["nope"])
    res = run_grid(spec, tmp_path, only=ids[:3], poll_s=0.1)
    assert res.total == 3 and res.complete == 3 and res.ran == 3
    assert study_status(tmp_path).counts == {**dict.fromkeys(study_status(tmp_path).counts, 0),
                                             "complete": 3, "pending": 5}
    events = []
    res = run_grid(spec, tmp_path, only=ids[:3], on_event=lambda e: events.append(e.progress.runner))
    assert res.ran == 0 and res.skipped_complete == 3 and events == ["nothing to run"] * 2


def test_a_worker_killed_mid_cell_is_replaced_and_the_cell_resumes(tmp_path):
    spec = grid(axes={"model": ["crash-xs", "tiny-xs"]}, max_retries=2)
    res = run_grid(spec, tmp_path, poll_s=0.1)
    assert res.ok and res.complete == 4
    runs = {(r["model"], r["budget"]): r for r in Store(tmp_path).runs()}
    for b in (2e9, 2e10):
        crash = runs[("crash-xs", b)]
        assert crash["attempts"] >= 2 and json.loads(crash["run_json"])["resumed_from"][0] == 2
    # every step of every cell stored exactly once, and the ledger adds up to the run's total
    snap = snapshot(tmp_path)
    for r in runs.values():
        steps = [s for (rid, s, *_x) in snap["train"] if rid == r["run_id"]]
        assert steps == list(range(1, r["steps"] + 1))
        counted = sum(f for (rid, _s, _p, _c, f, _t, c) in snap["ledger"] if rid == r["run_id"] and c)
        assert counted == r["total_flops"]


def test_extra_axes_reach_the_tables_and_keep_allocations_apart(tmp_path):
    """An axis outside the standard allocation columns (here lora.r and the completion
    length) lands in its own column, and the analysis keys allocations on it."""
    from race.analysis import prepare_runs

    spec = grid(budgets=[2e9], require_budget_span=False,
                base={k: v for k, v in grid()["base"].items() if k != "max_completion_length"},
                axes={"model": ["tiny-xs"], "lora.r": [4, 8], "max_completion_length": [8, 16]},
                runner={"kind": "local", "workers": 1, "threads_per_worker": 1, "preload_torch": False})
    res = run_grid(spec, tmp_path, poll_s=0.1)
    assert res.complete == 4 and not res.failed
    runs = load_tables(tmp_path)["runs"]
    assert sorted(runs["lora_r"].tolist()) == [4, 4, 8, 8]
    assert sorted(runs["axis_max_completion_length"].tolist()) == [8, 8, 16, 16]
    keys = prepare_runs(runs)["allocation"]
    want = {f"tiny-xs|G=8|P=4|it=1|lr=0.0001|rule|lora_r={r}|max_completion_length={m}" for r in (4, 8)
            for m in (8, 16)}  # the six, then what varies between the grid's cells (engine does not)
    assert set(keys) == want == {c.name for c in grid_spec_from_dict(spec).cells()}
    # the names are the grid's, stored: a subset of the runs keeps them
    one = runs[runs["lora_r"] == 4]
    assert set(prepare_runs(one)["allocation"]) == {k for k in want if "lora_r=4" in k}
    # a store written before the names were stored names its runs at load, over all of them, the same
    con = sqlite3.connect(tmp_path / "study.sqlite")
    con.execute("UPDATE runs SET allocation=NULL")
    con.commit()
    con.close()
    old = load_tables(tmp_path)["runs"]
    assert dict(zip(old["run_id"], old["allocation"])) == dict(zip(runs["run_id"], runs["allocation"]))


@pytest.mark.parametrize("order", ["longest_first", "grid"])
def test_cells_are_handed_out_longest_first_unless_the_grid_order_is_asked_for(tmp_path, order):
    """Longest predicted cells start first, so no long cell starts last while the other
    workers idle; `order: grid` keeps the grid file's order."""
    from race.grid import plan_grid

    spec = grid(runner={"kind": "local", "workers": 1, "threads_per_worker": 1, "preload_torch": False,
                        "order": order})
    started = []
    run_grid(spec, tmp_path, on_event=lambda e: started.append(e.run_id) if e.kind == "started" else None, poll_s=0.1)
    plan = plan_grid(grid_spec_from_dict(spec))
    grid_order = [pc.cell.run_id for pc in plan.runnable]
    predicted = {pc.cell.run_id: pc.prediction["est_seconds"] for pc in plan.runnable}
    assert sorted(started) == sorted(grid_order)
    if order == "grid":
        assert started == grid_order
    else:
        walls = [predicted[r] for r in started]
        assert walls == sorted(walls, reverse=True) and started != grid_order
