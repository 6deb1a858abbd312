"""A racing study end to end on the real built-in engine with the real racing rule
(``race.analysis.racing.rung_decision``): the rungs run and are decided from the store, the
later rung extends the first rung's run, ``race validate`` continues the pick's pilot to the
target budget (the pilot becomes the target run's prefix), and the report counts the
pilot's FLOPs once and says what share of the target run it was."""

from __future__ import annotations

import json

import pytest

from race.grid import Store, grid_spec_from_dict, load_tables
from race.protocol import load_study, run_race, validate_race
from race.report import build_report

T = 1.2e10


def _grid(model_dir):
    return {"study": "race-e2e", "protocol": "race", "budgets": [6e8], "seeds": [0, 1], "require_budget_span": False,
            "race": {"target_budget": T, "rungs": ["1/8", "1/3"]},
            "base": {"model": str(model_dir), "prompts_per_step": 4, "max_completion_length": 12, "reward": "rule",
                     "learning_rate": 1e-3, "torch_threads": 1,
                     "eval": {"n_problems": 16, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"],
                              "num_points": 1}},
            "axes": {"num_generations": [2, 4]}, "min_steps": 0, "max_retries": 0,
            "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1, "preload_torch": False}}


@pytest.mark.slow
def test_a_race_with_the_real_rule_ends_in_the_target_run_continuing_the_pick(tiny_model_dir, tmp_path):
    study = tmp_path / "study"
    res = run_race(grid_spec_from_dict(_grid(tiny_model_dir)), study, poll_s=0.1)
    assert res.finished and not res.failed and len(res.decisions) == 2
    assert res.decisions[0]["rule"]["level"] > 0  # the real rule's parameters, stored with the decision
    with Store(study, create=False) as s:
        assert s.rung_decisions() == res.decisions
    pick = res.pick
    assert res.decisions[-1]["go_on"] == [pick]

    out = validate_race(study, rivals=1)
    assert out.status == "complete" and out.recommendation.allocation == pick and out.allocations[0] == pick
    runs = {r["run_id"]: r for r in Store(study, create=False).runs()}
    target = runs[out.run_ids[0]]
    pilot = runs[target["extends"]]
    assert pilot["budget"] == pytest.approx(T / 3) and target["budget"] == pytest.approx(T)
    assert pilot["prefix_of"] == target["run_id"] and pilot["extends"]  # the pilot itself extended rung 0's run
    assert json.loads(target["run_json"])["extends"]["run_id"] == pilot["run_id"]

    t = load_tables(study)["runs"].set_index("run_id")
    assert t.loc[target["run_id"], "own_flops"] == pytest.approx(target["total_flops"] - pilot["total_flops"])
    study_data = load_study(study)
    assert study_data.rung_decisions == res.decisions and target["run_id"] in study_data.validation_ids

    paths = build_report(study, n_boot=50, n_boot_fit=50)
    data = json.loads(paths.json.read_text())
    race = data["sections"]["race"]["data"]
    assert race["target_run"]["pilot"] == pilot["run_id"]
    assert race["target_run"]["share"] == pytest.approx(pilot["total_flops"] / target["total_flops"])
    pilot_rows = t.drop(index=list(study_data.validation_ids))
    assert race["pilot_flops"] == pytest.approx(pilot_rows["own_flops"].sum())
    # the study's total counts every FLOP once: the pilots plus what the target runs added
    assert paths.total_flops == pytest.approx(t["own_flops"].sum())
    md = paths.markdown.read_text()
    share = f"{100 * pilot['total_flops'] / target['total_flops']:.1f}%"
    card = next(line for line in md.splitlines() if line.startswith("Pilot grid:"))
    assert "the continued pilot was" in card and share in card  # the report card says it (the rival's is beside)
    assert f"{share} of the target run (counted once)" in md  # and the racing section
