"""A racing study on the TRL engine (``protocol: race`` with ``engine: trl``), end to end
through the public driver (``race.protocol.run_race``, then ``race.protocol.validate_race``)
with the real racing rule, real TRL runs on a tiny model: the first rung is read at the
budget below it, the later rung's run extends the first rung's through TRL's checkpoint
resume (its ledger continues the shorter run's, nothing charged twice), and the target run
continues the pick's pilot to T. That an extended TRL run IS the fresh run of its budget is
``tests/engines/test_trl_extend.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from race.grid import Store, load_tables
from race.protocol import run_race, validate_race
from race.spec.grid import grid_spec_from_dict

T = 1.2e10
READ = 6e8

pytestmark = [pytest.mark.slow, pytest.mark.trl]


def _grid(model_dir: Path) -> dict:
    return {"study": "race-trl", "protocol": "race", "engine": "trl", "budgets": [READ], "seeds": [0, 1],
            "require_budget_span": False,
            "race": {"target_budget": T, "rungs": ["1/8", "1/3"], "rule": {"floor_steps": 0}},  # floor: test_grid_race.py
            "base": {"model": str(model_dir), "prompts_per_step": 4, "max_completion_length": 12, "reward": "rule",
                     "learning_rate": 1e-3, "torch_threads": 1, "drop_zero_variance_groups": False,
                     "checkpoint_every": 4,
                     "eval": {"n_problems": 16, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"],
                              "num_points": 1}},
            "axes": {"num_generations": [2, 4]}, "min_steps": 0, "max_retries": 0,
            "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1, "preload_torch": False}}


def _ledger(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if not k.startswith("seconds")}
            for x in (run_dir / "ledger.jsonl").read_text().splitlines()]


def test_a_trl_race_extends_its_runs_through_trl_checkpoints(tiny_model_dir, tmp_path):
    study = tmp_path / "study"
    res = run_race(grid_spec_from_dict(_grid(tiny_model_dir)), study, poll_s=0.1)
    assert res.finished and not res.failed and len(res.decisions) == 2
    pick = res.pick
    assert pick is not None and res.decisions[-1]["go_on"] == [pick]

    runs = {r["run_id"]: r for r in Store(study, create=False).runs()}
    assert {json.loads(r["run_json"])["engine"] for r in runs.values()} == {"trl"}
    first = [r for r in runs.values() if r["budget"] == pytest.approx(T / 8)]
    assert len(first) == 4 and all(r["status"] == "complete" for r in first)
    reads = [r for r in runs.values() if r["budget"] == pytest.approx(READ)]  # rung 0 read below itself
    assert len(reads) == 4 and all(r["prefix_of"] in {f["run_id"] for f in first} for r in reads)
    second = [r for r in runs.values() if r["budget"] == pytest.approx(T / 3)]
    assert second and all(r["extends"] in runs and r["status"] == "complete" for r in second)
    for r in second:  # the extension's ledger continues its rung-0 run's: those records first, unchanged
        parent = runs[r["extends"]]
        assert parent["prefix_of"] == r["run_id"]
        mine, theirs = _ledger(study / "runs" / r["run_id"]), _ledger(study / "runs" / parent["run_id"])
        assert mine[:len(theirs)] == theirs and len(mine) > len(theirs)
        assert (study / "runs" / r["run_id"] / "trl").is_dir()

    out = validate_race(study, rivals=0)
    assert out.status == "complete" and out.allocations[0] == pick
    runs = {r["run_id"]: r for r in Store(study, create=False).runs()}
    target = runs[out.run_ids[0]]
    pilot = runs[target["extends"]]
    assert pilot["budget"] == pytest.approx(T / 3) and target["budget"] == pytest.approx(T)
    run = json.loads(target["run_json"])
    assert run["engine"] == "trl" and run["extends"]["run_id"] == pilot["run_id"]
    assert run["budget_points"][-1] == {"budget": pytest.approx(T / 3), "step": pilot["steps"],
                                        "flops": pilot["total_flops"]}
    t = load_tables(study)["runs"].set_index("run_id")
    assert t.loc[target["run_id"], "own_flops"] == pytest.approx(target["total_flops"] - pilot["total_flops"])
    assert 0 < pilot["total_flops"] < target["total_flops"] <= T
