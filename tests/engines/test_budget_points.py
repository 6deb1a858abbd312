"""``eval.at_budgets``: a run evaluated where a run of each smaller budget would stop.

With the same seed and a constant learning rate the prefix IS the shorter run: the same
steps, the same counted FLOPs, the same per-problem outcomes. With a decaying schedule it
is not (the shorter run anneals sooner).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from race.engines.common import EvalSchedule
from race.engines.checks import engine_refusal
from race.spec.errors import ConfigError
from race.spec.run import run_config_from_dict

from kill_resume import assert_same_files, kill_after_step


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=2e9, prompts_per_step=4, num_generations=4,
             max_completion_length=12, reward="random", learning_rate=1e-3, seed=5, checkpoint_every=3,
             eval={"n_problems": 8, "n_hard_problems": 0, "n_pass_problems": 4, "pass_k": 2, "num_points": 2,
                   "targets": ["greedy", "pass@k"]},
             torch_threads=1)
    d.update(over)
    return run_config_from_dict(d)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _train(run: Path, upto: int) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("seconds")}
            for r in _lines(run / "metrics.jsonl") if r["kind"] == "train" and r["step"] <= upto]


def _counted(run: Path, upto: int) -> list[tuple]:
    return [(r["step"], r["phase"], r["component"], r["flops"]) for r in _lines(run / "ledger.jsonl")
            if r["counted"] and r["step"] <= upto]


def _evals_at(run: Path, step: int) -> dict[str, list]:
    return {r["target"]: r["per_problem"] for r in _lines(run / "metrics.jsonl")
            if r["kind"] == "eval" and r["step"] == step}


def test_constant_lr_prefix_is_the_shorter_run(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    short = run_engine(_cfg(tiny_model_dir), tmp_path / "short")
    long_cfg = _cfg(tiny_model_dir, budget_flops=5e9, eval={**_cfg(tiny_model_dir).eval.model_dump(),
                                                           "at_budgets": [2e9]})
    long = run_engine(long_cfg, tmp_path / "long")
    assert long["steps"] > short["steps"] >= 3
    (point,) = long["budget_points"]
    assert point["budget"] == 2e9
    assert point["step"] == short["steps"] and point["flops"] == short["total_flops"]
    k = short["steps"]
    assert _train(tmp_path / "long", k) == _train(tmp_path / "short", k)
    assert _counted(tmp_path / "long", k) == _counted(tmp_path / "short", k)
    assert _evals_at(tmp_path / "long", k) == _evals_at(tmp_path / "short", k)
    assert _train(tmp_path / "long", k + 1) != _train(tmp_path / "short", k + 1)  # the long run went on


def test_decaying_lr_prefix_is_not_the_shorter_run(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    base = _cfg(tiny_model_dir, lr_scheduler_type="cosine")
    short = run_engine(base, tmp_path / "short")
    long_cfg = _cfg(tiny_model_dir, lr_scheduler_type="cosine", budget_flops=5e9,
                    eval={**base.eval.model_dump(), "at_budgets": [2e9]})
    long = run_engine(long_cfg, tmp_path / "long")
    k = short["steps"]
    assert long["budget_points"][0]["step"] == k
    lr_short = [r["lr"] for r in _train(tmp_path / "short", k)]
    lr_long = [r["lr"] for r in _train(tmp_path / "long", k)]
    # the short run's cosine anneals over its k steps; the prefix is still early in a longer one
    assert all(a <= b for a, b in zip(lr_short, lr_long)) and lr_short[-1] < lr_long[-1]
    assert _evals_at(tmp_path / "long", k) != _evals_at(tmp_path / "short", k) or \
        _train(tmp_path / "long", k) != _train(tmp_path / "short", k)


def test_budget_points_survive_a_checkpoint():
    s = EvalSchedule(every=1.0, at_budgets=(2.0, 4.0))
    s.budget_points.append({"budget": 2.0, "step": 3, "flops": 1.9})
    t = EvalSchedule(every=1.0, at_budgets=(2.0, 4.0))
    t.restore(json.loads(json.dumps(s.state())))
    assert t.budget_points == s.budget_points
    t.restore({"next_eval_at": 0.0, "last_eval_step": 0})  # a checkpoint written before at_budgets existed
    assert t.budget_points == []


def test_at_budgets_refusals_say_what_to_change(tiny_model_dir):
    with pytest.raises(ConfigError, match="not below budget_flops"):
        _cfg(tiny_model_dir, eval={"at_budgets": [2e9]})
    with pytest.raises(ConfigError, match="twice"):
        _cfg(tiny_model_dir, budget_flops=5e9, eval={"at_budgets": [1e9, 1e9]})
    trl = _cfg(tiny_model_dir, engine="trl", drop_zero_variance_groups=False, budget_flops=5e9,
               eval={"at_budgets": [1e9]})
    assert engine_refusal(trl) is None  # the TRL engine reads its prefixes too (tests/engines/test_trl_extend.py)


def test_at_budgets_left_out_of_the_run_id_while_empty(tiny_model_dir):
    a = _cfg(tiny_model_dir, budget_flops=5e9)
    b = _cfg(tiny_model_dir, budget_flops=5e9, eval={**a.eval.model_dump(), "at_budgets": [1e9]})
    assert "at_budgets" in a.model_dump(mode="json")["eval"] and a.run_id() != b.run_id()
    # the id of a run without at_budgets is the hash it had before the setting existed
    import hashlib

    d = a.model_dump(mode="json")
    for k in ("output_dir", "log_to", "wandb_project", "eval_cache_dir", "per_device_train_batch_size",
              "gradient_accumulation_steps", "steps_per_generation", "sapo_temperature_pos",
              "sapo_temperature_neg", "num_update_generations", "update_selection"):
        d.pop(k, None)
    d["eval"].pop("at_budgets")
    d["scale_rewards"] = True
    from race.spec.task import TASK_ID_NEUTRAL

    for k, neutral in TASK_ID_NEUTRAL.items():
        if d["task"].get(k) == neutral:
            d["task"].pop(k)
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
    assert a.run_id() == hashlib.sha256(blob.encode()).hexdigest()[:12]


def test_killed_run_resumes_with_the_same_budget_points(tiny_model_dir, tmp_path, monkeypatch):
    """Checkpoint every step; crash in the step after the budget point (whose evaluation
    ran after the checkpoint): the resumed run neither repeats nor loses it."""
    from race.engines import run_engine

    base = _cfg(tiny_model_dir)
    cfg = _cfg(tiny_model_dir, budget_flops=4e9, checkpoint_every=1,
               eval={**base.eval.model_dump(), "at_budgets": [2e9]})
    ref = run_engine(cfg, tmp_path / "ref")
    k = ref["budget_points"][0]["step"]
    kill_after_step(monkeypatch, cfg, tmp_path / "run", k + 1)
    out = run_engine(cfg, tmp_path / "run")
    assert out["resumed_from"] == k and out["budget_points"] == ref["budget_points"]
    assert_same_files(tmp_path / "ref", tmp_path / "run")
