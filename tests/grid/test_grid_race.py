"""The racing protocol's grid side (``protocol: race``): the grid file's refusals, the plan's
pricing, the driver running rungs on the fake engine with a small injected rule (each rung's
decision stored, later rungs extending the earlier rungs' runs), and a SIGKILL of the driver
between rungs that resumes at the same decisions with nothing lost or run twice."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from race.grid import Store, load_tables, study_status
from race.grid.race_plan import plan_race
from race.protocol.racing import run_race
from race.spec.errors import GridSpecError
from race.spec.grid import grid_spec_from_dict

from .conftest import grid, snapshot, write_grid
from .race_rule import top_half

T = 6.4e10


def race_grid(**changes):
    g = grid(budgets=[1e9], seeds=[0, 1], protocol="race", require_budget_span=False,
             race={"target_budget": T, "rungs": ["1/32", "1/8", "1/3"], "rule": {"floor_steps": 0}})
    g["base"]["eval"] = {**g["base"]["eval"], "num_points": 1}
    g.update(changes)
    return g


@pytest.mark.parametrize("change, needle", [
    ({"race": {"target_budget": T, "rungs": [0.03125, 0.125, 0.6]}}, "2-3x below the target"),
    ({"race": {"target_budget": T, "rungs": [0.03125, 0.125, 0.2]}}, "5x below it"),
    ({"race": {"target_budget": T, "rungs": ["1/8", "1/32", "1/3"]}}, "ascending order"),
    ({"race": {"target_budget": T, "rungs": ["1/3", 1.0]}}, "in (0, 1)"),
    ({"race": {"target_budget": T, "rungs": ["x/3"]}}, "not a fraction"),
    ({"budgets": [1e9, 5e9]}, "contradict the rungs"),
    ({"race": {"target_budget": T, "rungs": ["1/8", "1/3"], "later_seeds": 3}}, "later_seeds=3"),
    ({"gang": True}, "set gang: false"),
    ({"protocol": "flat"}, "belong to protocol: race"),
    ({"race": None}, "needs a race: section"),
    ({"base": {"lr_scheduler_type": "cosine"}}, "lr_scheduler_type: constant"),
    # the TRL engine races (tests/grid/test_grid_race_trl.py), one optimizer step per generation
    ({"engine": "trl", "base": {"drop_zero_variance_groups": False, "num_iterations": 2}}, "set num_iterations: 1"),
    ({"engine": "trl", "base": {"drop_zero_variance_groups": False, "steps_per_generation": 2}}, "= 2 optimizer steps"),
    ({"base": {"eval": {"num_points": 3}}}, "eval.num_points: 1"),
])
def test_racing_refusals_say_what_to_change(change, needle):
    g = race_grid()
    base = {**g["base"], **change.pop("base", {})}
    g.update(base=base, **change)
    if g.get("race") is None:
        g.pop("race")
    with pytest.raises(GridSpecError, match=re.escape(needle)):
        grid_spec_from_dict(g)


def test_the_grid_reads_rungs_and_chains_extensions():
    spec = grid_spec_from_dict(race_grid(budgets=[1e9, T / 8]))  # a rung's budget may be repeated in budgets
    assert spec.budgets == [1e9, T / 32, T / 8, T / 3]
    first = spec.cells()
    assert len(first) == 8 and {c.budget for c in first} == {T / 32} and not any(c.extends for c in first)
    assert all(c.config.eval.at_budgets == [1e9] for c in first)
    ladder = spec.ladder()
    assert ladder is spec.ladder() and ladder.budgets() == [T / 32, T / 8, T / 3]
    later = ladder.cells(2, [first[0].name])
    assert [c.seed for c in later] == [0] and later[0].config.eval.at_budgets == [1e9, T / 32, T / 8]
    assert later[0].extends == ladder.cells(1, [first[0].name])[0].run_id
    # one name per allocation: every rung's cells and the target run's carry the first rung's
    assert {c.name for c in ladder.cells(1)} == set(ladder.names) == {c.name for c in first} and len(ladder.names) == 4
    target = ladder.target_cells([first[0].name], T, seeds=[1, 5])
    assert [(c.name, c.seed, c.budget) for c in target] == [(first[0].name, s, T) for s in (0, 1, 5)]
    assert target[0].extends == later[0].run_id  # the continued seed extends its last-rung run
    assert target[1].extends == next(c.run_id for c in ladder.cells(0) if c.name == first[0].name and c.seed == 1)
    assert target[2].extends is None  # a seed the study never ran starts fresh
    with pytest.raises(ValueError, match="not allocations of the racing grid"):
        ladder.cells(1, ["no-such-allocation"])


def test_the_plan_prices_its_schedule_and_both_ends_in_units_of_the_target():
    from race.protocol.racing import race_schedule

    spec = grid_spec_from_dict(race_grid())
    per_step = 1e8  # each step costs 1e8 FLOPs: a run of budget b spends floor(b / 1e8) steps

    def predictor(cfg):
        steps = int(cfg.budget_flops // per_step)
        return {"steps": steps, "step_flops": per_step, "rollout": 0.0, "learning": 0.0, "feedback": 0.0,
                "total": steps * per_step}

    sched = race_schedule(spec, predictor)
    assert sched.keep == (4, 4, 2)  # the listed rungs; keep counts from 4 allocations down to 2 over them
    race = plan_race(spec, sched, predictor=predictor).race
    r0, r1, r2 = T / 32, T / 8, T / 3
    assert race["all"]["pilot_budget"] == pytest.approx(8 * r0 + 4 * (r1 - r0) + 4 * (r2 - r1))
    assert race["schedule"]["pilot_budget"] == pytest.approx(8 * r0 + 4 * (r1 - r0) + 2 * (r2 - r1))
    assert race["schedule"]["pilot_budget"] == pytest.approx(sched.cost()["pilots"])
    assert race["least"]["pilot_budget"] == pytest.approx(8 * r0 + (r2 - r0))
    assert race["all"]["pilot_budget_T"] == pytest.approx(race["all"]["pilot_budget"] / T)
    spend = lambda b: (b // per_step) * per_step  # noqa: E731
    assert race["least"]["pilot_flops"] == pytest.approx(8 * spend(r0) + spend(r2) - spend(r0))
    assert race["reused_budget"] == pytest.approx(r2) and race["unreused_T"] == pytest.approx(sched.cost()["unreused_T"])
    assert race["target_extension_flops"] == pytest.approx(spend(T) - spend(r2))
    assert race["fits"] == sched.fits() and race["cap"] == 0.9


def _race(study: Path, spec) -> None:
    res = run_race(spec, study, decide=top_half, poll_s=0.05)
    assert res.finished and not res.failed


def test_a_race_runs_rungs_decided_from_the_store_and_extends_runs(tmp_path, store_opens):
    spec = grid_spec_from_dict(race_grid())
    study = tmp_path / "race"
    opens = store_opens
    _race(study, spec)
    # the schedule (stored once, when the race starts), then each rung's decision: the store opened once
    # (stored decision, tables, record)
    assert opens["read"] == 1 + 3
    with Store(study, create=False) as s:
        decisions = s.rung_decisions()
        rows = {r["run_id"]: r for r in s.runs()}
    assert [d["rung"] for d in decisions] == [0, 1, 2] and len(decisions[0]["go_on"]) == 2
    assert len(decisions[1]["go_on"]) == 1 and decisions[2]["go_on"] == [decisions[2]["leader"]]
    assert len(rows) == 8 + 2 + 1  # rung 0: 4 allocations x 2 seeds; rung 1: 2 x 1 seed; rung 2: 1
    ext = [r for r in rows.values() if r["extends"]]
    assert len(ext) == 3
    names = spec.ladder().names  # the store holds each run's allocation name; the decisions name the same
    assert {r["allocation"] for r in rows.values()} == set(names) and set(decisions[0]["go_on"]) <= set(names)
    assert all(r["allocation"] == rows[r["extends"]]["allocation"] for r in ext)
    for r in ext:  # an extension continues its parent's ledger; the parent becomes its prefix
        parent = rows[r["extends"]]
        assert parent["prefix_of"] == r["run_id"] and parent["prefix_step"] == parent["steps"]
        assert json.loads(r["run_json"])["extends"]["run_id"] == parent["run_id"]
        assert r["total_flops"] > parent["total_flops"]
    t = load_tables(study)
    led = t["ledger"]
    for r in ext:
        mine = led[led["run_id"] == r["run_id"]].drop(columns=["run_id", "seconds"]).reset_index(drop=True)
        theirs = led[led["run_id"] == r["extends"]].drop(columns=["run_id", "seconds"]).reset_index(drop=True)
        assert mine.iloc[: len(theirs)].equals(theirs)  # the ledger continues: nothing charged twice
    st = study_status(study)
    assert st.counts["complete"] == 11  # every cell, extended ones included
    top = [r for r in rows.values() if not r["prefix_of"]]
    assert st.flops_done == pytest.approx(sum(r["total_flops"] for r in top))  # counted once per trajectory
    again = run_race(spec, study, decide=top_half, poll_s=0.05)  # a finished race runs nothing again
    assert again.decisions == decisions
    from race.protocol import load_study

    opens["read"] = 0
    st = load_study(study)  # the study as one value, its store opened once
    assert opens["read"] == 1 and st.rung_decisions == decisions and st.race == spec.race
    assert st.grid is not None and st.ladder.names == names and st.ladder.budgets() == [T / 32, T / 8, T / 3]
    assert st.primary_target == spec.primary_target() == "greedy"


DRIVER = ("import sys; sys.path.insert(0, sys.argv[3]); from race_rule import top_half; "
          "from race.grid import load_grid_spec; from race.protocol.racing import run_race; "
          "run_race(load_grid_spec(sys.argv[1]), sys.argv[2], decide=top_half)")


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc")
def test_a_race_killed_between_rungs_resumes_at_the_same_decisions(tmp_path):
    spec = race_grid()
    _race(tmp_path / "ref", grid_spec_from_dict(spec))
    grid_file = write_grid(tmp_path / "grid.yaml", spec)
    study = tmp_path / "killed"
    env = {**os.environ, "RACE_FAKE_STEP_SLEEP": "0.02"}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(grid_file), str(study), str(Path(__file__).parent)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while True:  # kill once rung 0 is decided and a rung-1 extension is part-way
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "the race driver made no progress"
            decided = running = 0
            if (study / "study.sqlite").exists():
                try:
                    con = sqlite3.connect(study / "study.sqlite", timeout=5)
                    decided = con.execute("SELECT COUNT(*) FROM rung_decisions").fetchone()[0]
                    running = con.execute("SELECT COUNT(*) FROM runs WHERE status='running' AND extends IS NOT NULL"
                                          ).fetchone()[0]
                    con.close()
                except sqlite3.OperationalError:
                    pass
            if decided == 1 and running:
                break
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    _race(study, grid_spec_from_dict(spec))
    with Store(study, create=False) as a, Store(tmp_path / "ref", create=False) as b:
        assert a.rung_decisions() == b.rung_decisions()
    assert snapshot(study) == snapshot(tmp_path / "ref")  # every cell once, every row once, same numbers


def test_the_rule_counts_the_grids_later_seeds_and_refuses_a_contradiction():
    from race.protocol.errors import ReportError
    from race.protocol.racing import racing_rule

    assert racing_rule({"p_keep": 0.1}, 2).later_seeds == 2 and racing_rule({}, 1).p_keep >= 0
    with pytest.raises(ReportError, match="contradicts race.later_seeds=1"):
        racing_rule({"later_seeds": 2}, 1)
    with pytest.raises(ReportError, match="unknown setting"):
        racing_rule({"no_such": 1}, 1)


def _grid24(**race_changes):
    """24 allocations (4 sizes x 3 group sizes x 2 rewards), rungs: auto, T = 2e13."""
    g = grid(budgets=[], seeds=[0], protocol="race", require_budget_span=False,
             race={"target_budget": 2e13, "rungs": "auto", **race_changes})
    g["base"] = {**g["base"], "warmup_steps": 2, "eval": {**g["base"]["eval"], "num_points": 1}}
    g["axes"] = {"model": ["tiny-xs", "tiny-s", "tiny-m", "tiny-l"], "num_generations": [2, 4, 8],
                 "reward": ["rule", "rule:partial"]}
    return g


def test_the_plan_of_a_24_allocation_grid_prints_its_schedule_and_cost_evaluation_included(tmp_path):
    from typer.testing import CliRunner

    from race.cli.app import app
    from race.protocol.racing import race_schedule
    from race.spec.rungs import keep_counts

    spec = grid_spec_from_dict(_grid24())
    sched = race_schedule(spec)
    assert len(spec.ladder(sched).names) == 24 and sched.keep == keep_counts(24) and sched.fits()
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["grid", "plan", str(write_grid(tmp_path / "g.yaml",
                                                                                           _grid24()))])
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert f"race schedule: {len(sched.budgets)} rungs" in text and "(24 ranked onto it)" in text
    assert "not reused by the target run (cap 0.9 T)" in text and "evaluations" in text
    for k in range(len(sched.budgets)):
        assert f"rung {k} (T/" in text
    # the cap that does not fit: the plan refuses the grid and says what would
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["grid", "plan", str(write_grid(
        tmp_path / "tight.yaml", _grid24(rule={"max_unreused": 0.05})))])
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "24 allocations do not fit the racing cap" in text
    assert "Raise the cap (race.rule.max_unreused)" in text and "cut the grid to <=" in text
