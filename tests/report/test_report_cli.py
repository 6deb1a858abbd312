"""`race report` and `race validate` end to end on a real study store, run by the grid on
the grid tests' fake engine (a cheap cell function that writes the run format)."""

from __future__ import annotations

import json
from html import unescape
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from race.cards import fmt_flops
from race.cli.study_cmds import register
from race.grid import Store, load_tables, run_grid

FAKE_ENGINE = Path(__file__).resolve().parents[1] / "grid" / "fake_engine.py"
GRID = {
    "study": "cli-report",
    "budgets": [2e9, 2e10],
    "base": {"prompts_per_step": 4, "max_prompt_length": 16, "max_completion_length": 16,
             "eval": {"n_problems": 24, "n_hard_problems": 8, "n_pass_problems": 8}},
    "axes": {"model": ["tiny-xs", "tiny-s"], "num_generations": [4]},
    "seeds": [0],
    "min_steps": 0,
    "max_retries": 0,
    "cell_fn": f"{FAKE_ENGINE}:run_engine",
    "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1, "preload_torch": False},
}
FAST = ["--n-boot", "40", "--n-boot-fit", "10"]


@pytest.fixture
def cli():
    app = typer.Typer()
    register(app)
    runner = CliRunner(env={"COLUMNS": "200"})

    def invoke(*args: str):
        res = runner.invoke(app, [str(a) for a in args])
        return res, res.output
    return invoke


def test_report_then_validate_then_report(tmp_path, cli):
    study = tmp_path / "study"
    assert run_grid(GRID, study, poll_s=0.05).ok
    runs = load_tables(study)["runs"]
    res, out = cli("report", study, *FAST)
    assert res.exit_code == 0, out
    html_path = study / "report" / "report.html"
    assert f"report: {html_path}" in out and "confidence: " in out
    # the printed headline is the report's (with 1 seed and 24 problems the t-based learning
    # gate may pass nothing here: then it is the observed standings, "No learning detected")
    head = json.loads((study / "report" / "report.json").read_text())["headline"]["text"]
    assert head and head.split(":")[0] in out and head.startswith(("Run tiny-", "No learning detected"))
    html = unescape(html_path.read_text())
    assert fmt_flops(runs["total_flops"].sum()) in html
    assert "not validated yet" in html

    res, out = cli("validate", study, "--rivals", "1", *FAST)
    assert res.exit_code == 0, out
    assert "realised regret" in out and "validated at 80 GFLOP" in out
    entry = json.loads((study / "validation.json").read_text())["validations"][-1]
    assert entry["status"] == "complete" and entry["target_budget"] == pytest.approx(8e10)
    assert len(entry["allocations"]) == 2 and len(entry["run_ids"]) == 2
    with Store(study, create=False) as store:
        rows = store.runs()
        spec = json.loads(store.rows("studies")[0]["spec_json"])
    at_target = [r for r in rows if r["budget"] == pytest.approx(8e10)]
    assert {r["run_id"] for r in at_target} == set(entry["run_ids"])
    assert all(r["status"] == "complete" for r in at_target)
    assert spec["budgets"] == [2e9, 2e10]  # the study's own grid spec is put back
    html = unescape(html_path.read_text())
    assert "Realised regret" in html and entry["allocations"][0] in html
    assert entry["result"]["realised_regret"] is None or f"{entry['result']['realised_regret']:.3f}" in html

    # a later report finds the validation by itself (default target budget = the validated one)
    res, out = cli("report", study, "--out", tmp_path / "again", *FAST)
    assert res.exit_code == 0, out
    again = unescape((tmp_path / "again" / "report.html").read_text())
    assert "Realised regret" in again and "Recommendation for 80 GFLOP" in again

    # clear errors
    res, out = cli("validate", study, "--target-budget", "1e9", *FAST)
    assert res.exit_code == 2 and "not above the largest pilot budget" in out
    res, out = cli("report", study, "--target", "bogus", *FAST)
    assert res.exit_code == 2 and "'bogus' is not evaluated" in out


def test_cli_errors_for_missing_or_empty_studies(tmp_path, cli):
    res, out = cli("report", tmp_path / "nope")
    assert res.exit_code == 2 and "no such study directory" in out
    res, out = cli("validate", tmp_path)
    assert res.exit_code == 2 and "no study store" in out
    res, out = cli("validate", tmp_path, "--seeds", "a,b")
    assert res.exit_code == 2 and "comma-separated integers" in out


def test_the_grids_first_eval_target_is_the_studys_primary_target(tmp_path, cli):
    from race.protocol import load_study

    grid = json.loads(json.dumps(GRID))
    grid["base"]["eval"]["targets"] = ["greedy", "pass@k"]
    grid["eval"] = {"targets": ["pass@k", "greedy"]}  # the grid's eval: section wins, as in the cells
    study = tmp_path / "study"
    assert run_grid(grid, study, poll_s=0.05).ok
    assert load_study(study).primary_target == "pass@k"
    res, out = cli("report", study, *FAST)
    assert res.exit_code == 0, out
    assert json.loads((study / "report" / "report.json").read_text())["options"]["targets"][0] == "pass@k"
    res, out = cli("report", study, "--target", "greedy", *FAST)  # --target still wins
    assert json.loads((study / "report" / "report.json").read_text())["options"]["targets"][0] == "greedy"
    res, out = cli("validate", study, "--rivals", "1", *FAST)
    assert res.exit_code == 0, out
    [val] = json.loads((study / "validation.json").read_text())["validations"]
    assert val["target"] == "pass@k"


def test_each_command_reads_the_study_once(tmp_path, cli, store_opens):
    """``race report`` opens the study's store once (tables, grid, decisions in one read);
    ``race validate`` reads it once before its runs and once after (the realised regret and
    the report it writes use that second reading); the grid driver's own opens are apart."""
    study = tmp_path / "study"
    assert run_grid(GRID, study, poll_s=0.05).ok
    opens = store_opens
    opens.update(read=0, grid=0)
    res, out = cli("report", study, *FAST)
    assert res.exit_code == 0, out
    assert opens == {"read": 1, "grid": 0}
    res, out = cli("validate", study, "--rivals", "1", *FAST)
    assert res.exit_code == 0, out
    assert opens["read"] == 1 + 2 and opens["grid"] >= 2  # 2 validation grids, each driven into the store
