"""The main job's plumbing: side-by-side builds of base models and reward models, and
`race demo` end to end on a small grid (fake engine cells, real warm start and report)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from race.grid.prebuild import BuildJob, plan_builds, run_builds
from race.models.base_recipes import SFTRecipe, base_dir
from race.rewards.rm_recipes import RMRecipe

TINY_SFT = SFTRecipe(steps=3, batch_size=4, warmup_steps=1, n_eval_test=4, n_eval_hard=2)
TINY_PRM = RMRecipe("prm", "tiny-xs", steps=3, batch_size=4, warmup_steps=1, n_eval=8)
FAKE_CELL_FN = f"{(Path(__file__).parents[1] / 'grid' / 'fake_engine.py').resolve()}:run_engine"


@pytest.fixture
def tiny_recipes(monkeypatch):
    import race.models.base_recipes as ws
    import race.rewards.rm_recipes as tr

    monkeypatch.setattr(ws, "DEFAULT_RECIPE", TINY_SFT)
    monkeypatch.setitem(tr.RM_RECIPES, "prm-xs", TINY_PRM)


def test_builds_run_side_by_side_one_thread_each_and_are_cached(tmp_path, tiny_recipes):
    jobs = plan_builds(["tiny-xs", "tiny-s", "tiny-xs"], ["prm-xs"], cache_dir=tmp_path)
    assert sorted(j.name for j in jobs) == ["prm-xs", "tiny-s", "tiny-xs"]  # duplicates dropped
    assert jobs == sorted(jobs, key=lambda j: -j.cost)  # longest first
    done = run_builds(jobs, cache_dir=tmp_path, workers=2)
    assert sorted(d.job.name for d in done) == ["prm-xs", "tiny-s", "tiny-xs"]
    assert all(d.seconds > 0 and d.summary for d in done)
    info = json.loads((base_dir("tiny-s", cache_dir=tmp_path, recipe=TINY_SFT) / "info.json").read_text())
    assert info["torch_threads"] == 1 and info["steps"] == 3
    assert plan_builds(["tiny-xs", "tiny-s"], ["prm-xs"], cache_dir=tmp_path) == []  # nothing left to build

    # a side-by-side build equals the same build run here with one thread (deterministic)
    import torch

    other = tmp_path / "again"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_builds(plan_builds(["tiny-s"], [], cache_dir=other), cache_dir=other, workers=1)
    finally:
        torch.set_num_threads(threads)
    a = base_dir("tiny-s", cache_dir=tmp_path, recipe=TINY_SFT) / "model.safetensors"
    b = base_dir("tiny-s", cache_dir=other, recipe=TINY_SFT) / "model.safetensors"
    assert a.read_bytes() == b.read_bytes()


def test_rms_from_a_base_wait_for_the_bases_and_failures_surface(tmp_path, tiny_recipes, monkeypatch):
    import race.rewards.rm_recipes as tr

    monkeypatch.setitem(tr.RM_RECIPES, "prm-xs", dataclasses.replace(TINY_PRM, init="base"))
    jobs = plan_builds(["tiny-xs"], ["prm-xs"], cache_dir=tmp_path)
    assert [(j.name, j.needs_base) for j in jobs] == [("tiny-xs", False), ("prm-xs", True)]
    done = run_builds(jobs, cache_dir=tmp_path, workers=2)
    assert [d.job.name for d in done] == ["tiny-xs", "prm-xs"]
    with pytest.raises(KeyError, match="tiny-zz"):
        run_builds([BuildJob("base", "tiny-zz", TINY_SFT, 1.0), BuildJob("base", "tiny-xs", TINY_SFT, 1.0)],
                   cache_dir=tmp_path / "bad", workers=2)


def _demo(tmp_path, monkeypatch, *, eval=None, **changes):
    """``race demo`` (quiet) on a small grid of fake-engine cells with ``changes``; returns
    the study dir, the grid file and the CLI result (asserted successful)."""
    from race.cli.app import app

    monkeypatch.setenv("RACE_CACHE", str(tmp_path / "cache"))
    grid = {
        "base": {"prompts_per_step": 4, "max_prompt_length": 24, "max_completion_length": 16,
                 "eval": {"n_problems": 16, "n_pass_problems": 8, "targets": ["greedy", "pass@k"], **(eval or {})}},
        "axes": {"model": ["tiny-xs", "tiny-s"], "num_generations": [4, 8]},
        "seeds": [0, 1], "min_steps": 0, "cell_fn": FAKE_CELL_FN,
        "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1, "preload_torch": False}, **changes,
    }
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump(grid))
    study = tmp_path / "study"
    r = CliRunner().invoke(app, ["demo", "--grid", str(grid_file), "--study-dir", str(study), "--quiet"])
    assert r.exit_code == 0, r.output
    return study, grid_file, r


def test_demo_builds_runs_the_grid_and_writes_the_report(tmp_path, tiny_recipes, monkeypatch):
    from race.cli.app import app

    study, grid_file, r = _demo(tmp_path, monkeypatch, study="mini-demo", budgets=[2e9, 2e10])
    assert "building tiny-s, tiny-xs" in r.output.replace("\n", " ") or "building tiny-xs, tiny-s" in r.output
    assert "tiny-xs: built in" in r.output and "16/16 cells complete" in r.output.replace("\n", " ")
    assert (study / "report" / "report.html").is_file() and (study / "report" / "report.md").is_file()
    assert "demo wall time" in r.output and "grid " in r.output and "validation " in r.output
    # validation ran the recommendation and one rival at 4x the largest pilot budget, into the study
    [val] = json.loads((study / "validation.json").read_text())["validations"]
    assert val["target_budget"] == pytest.approx(8e10) and len(val["allocations"]) == 2
    assert val["status"] == "complete" and val["result"]["realised_score"] is not None
    assert "3/4 validation" in r.output and "realised" in r.output
    md = (study / "report" / "report.md").read_text()
    assert "realised" in md.lower() and "Validation: not shown" not in md
    # a second run reuses everything: no builds, no cells
    r = CliRunner().invoke(app, ["demo", "--grid", str(grid_file), "--study-dir", str(study), "--quiet"])
    assert r.exit_code == 0, r.output
    assert "building" not in r.output and "16 were already" in r.output.replace("\n", " ")


def test_demo_races_a_racing_grid_and_continues_the_pick(tmp_path, tiny_recipes, monkeypatch):
    """``race demo`` on a ``protocol: race`` grid (fake engine cells, the real racing rule):
    the rungs run and are decided, the target run continues the pick's pilot, the report
    shows the race."""
    study, _, r = _demo(tmp_path, monkeypatch, study="mini-race", protocol="race", budgets=[2e9],
                        require_budget_span=False, race={"target_budget": 9.6e10, "rungs": ["1/16", "1/3"]},
                        eval={"num_points": 1})
    out = r.output.replace("\n", " ")
    assert "2/4 pilot race" in out and "rung 0 (" in out and "rung 1 (" in out and "3/4 target run" in out
    [val] = json.loads((study / "validation.json").read_text())["validations"]
    assert val["protocol"] == "race" and val["target_budget"] == pytest.approx(9.6e10)
    pick = val["allocations"][0]
    assert all(val["continued"].values())  # every target run continued a pilot
    md = (study / "report" / "report.md").read_text()
    assert "Racing: rungs toward the target" in md and "continued pilot" in md and pick.split("|")[0] in md
    # the report written right after the validation reads its outcome, not the entry it started as
    assert "the validation recorded for this budget is" not in md and "Realised regret" in md


def test_the_packaged_demo_races_a_schedule_that_fits_its_cap_and_measures_every_allocation():
    """The default study is a racing grid whose schedule is sized by its 12 allocations and the
    cap (issue 46): the pilots the target run does not reuse stay within the cap, every
    allocation's first rung buys it warmup + the rule's floor of optimizer steps, the last rung
    races more than one allocation, and the evaluations the plan prices cost at most the
    training (rule and predictions read from the code, no number copied here)."""
    from importlib import resources

    from race.grid import load_grid_spec
    from race.grid.plan import predict_cell
    from race.grid.race_plan import plan_race
    from race.protocol.racing import race_schedule, racing_rule

    with resources.as_file(resources.files("race") / "configs" / "demo.yaml") as path:
        spec = load_grid_spec(path)
    assert spec.racing and spec.race is not None
    rule = racing_rule(spec.race.rule, spec.race.later_seeds)
    sched = race_schedule(spec, predict_cell)
    race = plan_race(spec, sched).race
    assert race["target_budget"] == pytest.approx(spec.race.target_budget) and race["allocations"] == 12
    assert race["fits"] and race["unreused_T"] <= rule.max_unreused + 1e-9  # the schedule's worst case
    assert race["keep"][0] == 12 and race["keep"][-1] >= 2  # the last rung races more than one
    assert race["schedule"]["pilot_budget_T"] <= race["all"]["pilot_budget_T"] + 1e-9
    for cell in spec.ladder(sched).cells(0):
        pred = predict_cell(cell.config)
        steps = int(race["first_rungs"][cell.name] // pred["step_flops"])  # what the first rung buys
        assert steps >= cell.config.warmup_steps + rule.floor_steps, (cell.name, steps)
    assert race["schedule"]["eval_flops"] <= race["schedule"]["pilot_flops"], race["schedule"]
