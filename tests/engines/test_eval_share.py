"""One step-0 evaluation per base model: shared by runs that start from the same base,
identical to what each run would compute, charged once, and never shared across
settings that change it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from race.engines.eval_share import NOT_IN_KEY, model_fingerprint, step0_key
from race.spec.run import RunConfig, run_config_from_dict


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=2e9, prompts_per_step=2, num_generations=2,
             max_completion_length=10, reward="random", learning_rate=1e-3, seed=0,
             eval={"n_problems": 6, "n_hard_problems": 3, "n_pass_problems": 3, "pass_k": 2, "num_points": 1},
             torch_threads=1)
    d.update(over)
    return run_config_from_dict(d)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_every_setting_left_out_of_the_key_is_a_run_config_field():
    assert set(NOT_IN_KEY) <= set(RunConfig.model_fields), set(NOT_IN_KEY) - set(RunConfig.model_fields)


def test_key_ignores_training_settings_and_follows_evaluation_settings(tiny_model_dir):
    k = step0_key(_cfg(tiny_model_dir), tiny_model_dir, 1)
    same = [dict(seed=5), dict(num_generations=4), dict(reward="rule"), dict(budget_flops=9e9),
            dict(learning_rate=3e-4), dict(eval={"n_problems": 6, "n_hard_problems": 3, "n_pass_problems": 3,
                                                 "pass_k": 2, "num_points": 3})]
    for over in same:
        assert step0_key(_cfg(tiny_model_dir, **over), tiny_model_dir, 1) == k, over
    differ = [dict(max_completion_length=12), dict(temperature=0.7),
              dict(eval={"n_problems": 7, "n_hard_problems": 3, "n_pass_problems": 3, "pass_k": 2}),
              dict(task={"name": "arith", "max_ops": 3})]
    for over in differ:
        assert step0_key(_cfg(tiny_model_dir, **over), tiny_model_dir, 1) != k, over
    assert step0_key(_cfg(tiny_model_dir), tiny_model_dir, 2) != k  # thread count
    assert step0_key(_cfg(tiny_model_dir), "Qwen/Qwen2.5-0.5B", 1) is None  # not a local directory


def test_fingerprint_follows_the_files(tiny_model_dir, tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(tiny_model_dir, copy)
    before = model_fingerprint(copy)
    (copy / "config.json").write_text((copy / "config.json").read_text() + "\n")
    assert model_fingerprint(copy) != before


def test_runs_from_one_base_share_the_step0_evaluation(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    cache = tmp_path / "eval-cache"
    alone = run_engine(_cfg(tiny_model_dir, seed=1), tmp_path / "alone")
    first = run_engine(_cfg(tiny_model_dir, seed=1, eval_cache_dir=str(cache)), tmp_path / "first")
    second = run_engine(_cfg(tiny_model_dir, seed=2, num_generations=4, eval_cache_dir=str(cache)),
                        tmp_path / "second")
    assert len(list(cache.glob("*.json"))) == 1
    step0 = {name: [r for r in _lines(tmp_path / name / "metrics.jsonl") if r["kind"] == "eval" and r["step"] == 0]
             for name in ("alone", "first", "second")}
    strip = lambda rows: [{k: v for k, v in r.items() if k != "flops"} for r in rows]  # noqa: E731
    assert strip(step0["first"]) == strip(step0["alone"]) == strip(step0["second"])
    assert step0["alone"][0]["per_problem"] and len(step0["alone"]) == 3
    evals = {name: [r for r in _lines(tmp_path / name / "ledger.jsonl") if r["phase"] == "eval" and r["step"] == 0]
             for name in ("first", "second")}
    assert evals["first"][0]["component"] == "generate" and evals["first"][0]["flops"] > 0
    assert evals["second"][0]["component"] == "shared" and evals["second"][0]["flops"] == 0
    # the counted ledger and the run id do not depend on sharing
    assert first["total_flops"] == alone["total_flops"] and first["run_id"] == alone["run_id"]
    assert first["final"] == alone["final"]


def test_a_grid_shares_one_step0_evaluation_per_base(tiny_model_dir, tmp_path):
    from race.grid import run_grid

    spec = {"study": "share", "budgets": [1e9, 2e9], "require_budget_span": False,
            "base": {"model": str(tiny_model_dir), "prompts_per_step": 2, "max_completion_length": 8,
                     "reward": "random", "torch_threads": 1,
                     "eval": {"n_problems": 6, "targets": ["greedy"], "num_points": 1}},
            "axes": {"num_generations": [2, 4]}, "seeds": [0], "min_steps": 0,
            "runner": {"kind": "local", "workers": 1, "threads_per_worker": 1}}
    res = run_grid(spec, tmp_path / "study")
    assert res.ok and res.complete == 4
    assert len(list((tmp_path / "study" / "eval-cache").glob("*.json"))) == 1
    comps = []
    for run in sorted((tmp_path / "study" / "runs").iterdir()):
        comps += [r["component"] for r in _lines(run / "ledger.jsonl") if r["phase"] == "eval" and r["step"] == 0]
    assert sorted(comps) == ["generate", "shared", "shared", "shared"]
