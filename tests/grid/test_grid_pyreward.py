"""A grid whose reward is a Python function named by import path (``py:MODULE:FUNCTION``)
runs on the local runner and on a local Ray cluster, with both engines, and stores the same
study: the function travels to the workers by its import path (the local runner's spawned
workers inherit the driver's ``sys.path``; Ray's workers see the ``PYTHONPATH`` the cluster
was started with, as each node's ``ray start`` does). A worker that cannot import the
module fails its cell saying what to do. Real engines, tiny model."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from race.grid import Store, run_grid

from .conftest import snapshot

FUNCS = Path(__file__).resolve().parents[1] / "data" / "pyrewards"

pytestmark = pytest.mark.slow


def _grid(model_dir: Path, rewards: list[str]) -> dict:
    return {"study": "pyreward", "budgets": [1.2e9], "seeds": [0], "require_budget_span": False,
            "base": {"model": str(model_dir), "prompts_per_step": 4, "num_generations": 4,
                     "max_completion_length": 12, "learning_rate": 1e-3, "torch_threads": 1,
                     "drop_zero_variance_groups": False,
                     "eval": {"n_problems": 8, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"],
                              "num_points": 1}},
            "axes": {"engine": ["builtin", "trl"], "reward": rewards}, "min_steps": 0, "max_retries": 0,
            "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1, "preload_torch": False}}


REWARDS = ["py:race_test_rewards:final_answer", "py:race_test_rewards:digits_by_model"]


@pytest.fixture(scope="module")
def ray_with_the_module():
    """A local Ray cluster started with the module's folder on PYTHONPATH."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(FUNCS), *([old] if old else [])])
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield ray
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _reward_flops(study: Path) -> dict[tuple[str, str], float]:
    with Store(study, create=False) as s:
        return {(json.loads(r["spec_json"])["engine"], json.loads(r["spec_json"])["reward"]):
                json.loads(r["run_json"])["phase_flops"].get("reward", 0.0) for r in s.runs()}


@pytest.mark.ray
def test_a_python_reward_grid_runs_locally_and_on_ray(tiny_model_dir, tmp_path, monkeypatch, ray_with_the_module):
    monkeypatch.syspath_prepend(str(FUNCS))  # the driver imports it (the plan prices it); spawned workers inherit it
    spec = _grid(tiny_model_dir, REWARDS)
    local = run_grid(spec, tmp_path / "local", poll_s=0.1)
    via_ray = run_grid(spec, tmp_path / "ray", runner="ray", poll_s=0.1)
    assert local.ok and via_ray.ok and local.complete == via_ray.complete == 4, (local, via_ray)
    assert snapshot(tmp_path / "ray") == snapshot(tmp_path / "local")
    flops = _reward_flops(tmp_path / "local")
    for engine in ("builtin", "trl"):  # a rule's cost, and the declared model's
        assert flops[(engine, REWARDS[0])] == 0 and flops[(engine, REWARDS[1])] > 0


def test_a_worker_that_cannot_import_the_module_says_what_to_do(tiny_model_dir, tmp_path):
    spec = _grid(tiny_model_dir, ["py:race_test_module_nowhere:f"])
    spec["axes"]["engine"] = ["builtin"]
    res = run_grid(spec, tmp_path / "study", poll_s=0.1)
    assert not res.ok and len(res.failed) == 1
    with Store(tmp_path / "study", create=False) as s:
        (run,) = s.runs()
    assert run["status"] == "failed"
    assert "no module named 'race_test_module_nowhere'" in run["error"] and "PYTHONPATH" in run["error"]
    assert "race_test_module_nowhere" not in sys.modules
