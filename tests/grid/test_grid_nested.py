"""Nested pilots (``nested: true``): one run per allocation and seed at the largest budget,
read at its prefixes. Real built-in engine runs on a tiny model: the prefix rows the store
writes equal the separate runs of the smaller budget (constant learning rate), the
analysis reads them as that budget's observations, and the plan prices the saving."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from race.grid import Store, plan_grid, run_grid
from race.grid.store import MIGRATIONS
from race.grid.tables import load_tables, study_status
from race.spec.errors import GridSpecError
from race.spec.grid import grid_spec_from_dict

from .conftest import write_grid

SMALL, LARGE = 1.2e9, 3e9


def _grid(model_dir: Path, **changes) -> dict:
    g = {"study": "nest", "budgets": [SMALL, LARGE], "require_budget_span": False,
         "base": {"model": str(model_dir), "prompts_per_step": 4, "max_completion_length": 12, "reward": "random",
                  "learning_rate": 1e-3, "torch_threads": 1,
                  "eval": {"n_problems": 8, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"],
                           "num_points": 2}},
         "axes": {"num_generations": [2, 4]}, "seeds": [0, 1], "min_steps": 0, "max_retries": 0,
         "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1, "preload_torch": False}}
    g.update(changes)
    return g


def _ends(study: Path) -> dict[tuple, dict]:
    """Per (allocation, budget, seed): steps, total FLOPs and the last greedy per-problem vector."""
    t = load_tables(study)
    runs, evals = t["runs"], t["evals"]
    out = {}
    for r in runs[runs["status"] == "complete"].itertuples():
        ev = evals[(evals["run_id"] == r.run_id) & (evals["target"] == "greedy")].sort_values("step")
        out[(r.label, r.budget, r.seed)] = {"steps": int(r.steps), "flops": r.total_flops,
                                                 "pp": list(ev["per_problem"].iloc[-1]),
                                                 "prefix_of": r.prefix_of if isinstance(r.prefix_of, str) else None}
    return out


def test_nested_prefixes_are_the_smaller_budgets_runs(tiny_model_dir, tmp_path):
    nested = grid_spec_from_dict(_grid(tiny_model_dir, nested=True))
    cells = nested.cells()
    assert len(cells) == 4 and {c.budget for c in cells} == {LARGE}
    assert all(c.config.eval.at_budgets == [SMALL] for c in cells)
    run_grid(nested, tmp_path / "nested", poll_s=0.1)
    run_grid(grid_spec_from_dict(_grid(tiny_model_dir)), tmp_path / "flat", poll_s=0.1)

    a, b = _ends(tmp_path / "nested"), _ends(tmp_path / "flat")
    assert set(a) == set(b) and len(a) == 8  # 2 allocations x 2 budgets x 2 seeds in both studies
    for key in a:
        assert a[key]["steps"] == b[key]["steps"], key
        assert a[key]["flops"] == b[key]["flops"], key
        assert a[key]["pp"] == b[key]["pp"], key
    prefixes = [k for k, v in a.items() if v["prefix_of"]]
    assert sorted(k[1] for k in prefixes) == [SMALL] * 4 and all(b[k]["prefix_of"] is None for k in b)

    with Store(tmp_path / "nested", create=False) as s:
        rows = s.runs()
        assert s.counts()["complete"] == 4  # cells; prefixes are not cells
    by_id = {r["run_id"]: r for r in rows}
    for r in rows:
        if r["prefix_of"]:
            parent = by_id[r["prefix_of"]]
            run = json.loads(parent["run_json"])
            assert run["budget_points"][0]["step"] == r["prefix_step"] == r["steps"]
            assert r["wall_s"] is None and r["total_flops"] <= SMALL < parent["total_flops"]
            assert json.loads(r["run_json"])["prefix_of"] == parent["run_id"]
    st = study_status(tmp_path / "nested")
    assert st.prefixes == 4 and len(st.cells) == 4 and st.flops_planned == 4 * LARGE

    # the analysis reads each prefix as its budget's observation: same matrix as the flat study
    from race.analysis.joint import study_matrix

    ms = []
    for study in ("nested", "flat"):
        t = load_tables(tmp_path / study)
        m = study_matrix(t["evals"], t["runs"], "greedy")
        ms.append({(r.allocation, r.budget, r.seed): (m.end[i], m.end_pp[i].tolist())
                   for i, r in enumerate(m.runs.itertuples())})
        assert {k: len(v) for k, v in m.strata().items()} == {(al, bu): 2 for al, bu, _ in ms[-1]}
    assert ms[0] == ms[1]

    # validating a nested study: the validation runs copy a pilot's settings but not its prefix points
    from race.analysis import prepare_runs
    from race.protocol.study import load_study
    from race.protocol.validate import validation_grids

    study = load_study(tmp_path / "nested")
    allocs = sorted(prepare_runs(study.pilot_runs)["allocation"].unique())
    for g in validation_grids(study, allocs, 4 * LARGE):
        assert "at_budgets" not in g["base"]["eval"] and g["base"]["eval"]["n_problems"] == 8
        cells = grid_spec_from_dict(g).cells()
        assert len(cells) == 2 and all(c.budget == 4 * LARGE and not c.config.eval.at_budgets for c in cells)

    # the report counts a trajectory's FLOPs once: the prefixes are inside the runs they were read from
    from race.report import build_report

    with Store(tmp_path / "nested", create=False) as s:
        cells_flops = sum(r["total_flops"] for r in s.runs() if not r["prefix_of"])
        prefix_flops = sum(r["total_flops"] for r in s.runs() if r["prefix_of"])
    assert prefix_flops > 0
    paths = build_report(tmp_path / "nested", tmp_path / "report", n_boot=20, n_boot_fit=10)
    card = json.loads(paths.json.read_text())["sections"]["card"]
    assert card["data"]["total_flops"] == cells_flops
    assert card["data"]["report_card"]["total_flops"] == round(cells_flops)
    assert "other 4 runs are prefixes of these" in paths.markdown.read_text()


def test_plan_prices_the_saving_and_the_cli_shows_it(tiny_model_dir, tmp_path):
    p = plan_grid(grid_spec_from_dict(_grid(tiny_model_dir, nested=True)))
    assert len(p.runnable) == 4 and p.total_budget == 4 * LARGE
    assert p.separate["total_budget"] == 4 * (SMALL + LARGE)
    assert p.separate["est_wall_s"] > p.est_wall_s
    pct = round(100 * (1 - LARGE / (SMALL + LARGE)))
    assert any(f"({pct}% less)" in n for n in p.notes)
    from race.cli.grid import app

    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["plan", str(write_grid(tmp_path / "g.yaml",
                                                                                _grid(tiny_model_dir, nested=True)))])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "nested: 4 run(s) at the largest budget, read at their prefixes" in text and "replace 8 separate runs" in text and f"({pct}% less)" in text


@pytest.mark.parametrize("change, needle", [
    ({"base": {"lr_scheduler_type": "cosine"}}, "lr_scheduler_type: constant"),
    ({"budgets": [LARGE]}, "at least two budgets"),
    ({"base": {"eval": {"at_budgets": [SMALL]}}}, "set nested: true"),
])
def test_nested_refusals_say_what_to_change(tiny_model_dir, change, needle):
    g = _grid(tiny_model_dir, nested=True)
    base = {**g["base"], **change.pop("base", {})}
    g.update(base=base, **change)
    with pytest.raises(GridSpecError, match=needle.replace("(", r"\(")):
        grid_spec_from_dict(g)


def test_a_version_1_store_migrates(tmp_path):
    conn = sqlite3.connect(tmp_path / "study.sqlite")
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for stmt in MIGRATIONS[1]:
        conn.execute(stmt)
    conn.execute("INSERT INTO schema_version VALUES (1)")
    conn.commit()
    conn.close()
    with Store(tmp_path) as s:
        assert s.schema_version() == 6
        assert s.race_schedule() is None  # schema 6: a racing study's schedule, none stored yet
        cols = {r[1] for r in s.conn.execute("PRAGMA table_info(runs)")}
    assert {"prefix_of", "prefix_step", "extends", "allocation"} <= cols and "final_json" not in cols  # schema 3 dropped it
