"""``race grid plan`` refuses, before anything runs, the cells a worker would refuse: a
``task.path`` that is not there and settings the cell's engine refuses."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from race.cli.app import app
from race.grid import grid_spec_from_dict, plan_grid
from tests.grid.conftest import grid, write_grid


def _base(**over):
    g = grid()
    g["base"] = {**g["base"], **over}
    return g


def _plan(g):
    return plan_grid(grid_spec_from_dict(g))


def test_a_missing_task_file_refuses_every_cell_that_reads_it(tmp_path):
    p = _plan(_base(task={"name": "jsonl", "path": str(tmp_path / "nope.jsonl")}))
    assert p.cells and not p.runnable
    assert all("task.path" in c.refusal and "file not found" in c.refusal and "nope.jsonl" in c.refusal
               for c in p.cells)


def test_an_existing_task_file_is_not_refused(tmp_path):
    f = tmp_path / "probs.jsonl"
    f.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    p = _plan(_base(task={"name": "jsonl", "path": str(f)}))
    assert all(c.refusal is None or "task.path" not in c.refusal for c in p.cells)


def test_cells_the_trl_engine_refuses_are_refused_in_the_plan():
    g = _base(drop_zero_variance_groups=True)
    g["axes"] = {**g["axes"], "engine": ["builtin", "trl"]}
    p = _plan(g)
    trl = [c for c in p.cells if c.cell.config.engine == "trl"]
    builtin = [c for c in p.cells if c.cell.config.engine == "builtin"]
    assert trl and builtin
    assert all(c.refusal and "engine: trl refuses" in c.refusal and "drop_zero_variance_groups: false" in c.refusal
               for c in trl)
    assert all(c.refusal is None for c in builtin)


def test_race_grid_plan_shows_both_refusals(tmp_path):
    g = _base(task={"name": "jsonl", "path": str(tmp_path / "missing.jsonl")})
    f = write_grid(tmp_path / "g.yaml", g)
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["grid", "plan", str(f)])
    assert res.exit_code == 1, res.output  # cells a worker would fail on: the plan fails
    assert "refused" in res.output and "missing.jsonl" in res.output and "file not found" in res.output
    assert "8 of 8 cell(s) cannot run" in res.output
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["grid", "plan", str(f), "--allow-refused"])
    assert res.exit_code == 0 and "missing.jsonl" in res.output  # report only, as before
    g = _base(drop_zero_variance_groups=True)
    g["axes"] = {**g["axes"], "engine": ["trl"]}
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["grid", "plan", str(write_grid(tmp_path / "t.yaml", g))])
    assert res.exit_code == 1, res.output
    assert "engine: trl refuses this cell" in res.output
