"""The built-in GRPO engine: budget, ledger == measured FLOPs, determinism, resume, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from race.accounting import AccountingError
from race.spec.run import run_config_from_dict

from kill_resume import assert_same_files, kill_after_step


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=6e9, prompts_per_step=4, num_generations=4,
             max_completion_length=12, reward="random", learning_rate=1e-3, seed=3, checkpoint_every=2,
             eval={"n_problems": 8, "n_hard_problems": 4, "n_pass_problems": 4, "pass_k": 2, "num_points": 2},
             torch_threads=1)
    d.update(over)
    return run_config_from_dict(d)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _strip_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


def test_run_stays_within_budget_and_writes_the_run_directory(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    cfg = _cfg(tiny_model_dir, num_iterations=2, beta=0.05)
    out = run_engine(cfg, tmp_path / "run")
    assert out["status"] == "complete" and out["stop_reason"] == "budget"
    assert 0 < out["total_flops"] <= cfg.budget_flops
    ledger = _lines(tmp_path / "run" / "ledger.jsonl")
    counted = sum(r["flops"] for r in ledger if r["counted"])
    assert counted == out["total_flops"]
    phases = {r["phase"] for r in ledger if r["flops"] > 0}
    # random rewards give groups with variance: old log-probs (iterations 2), reference (beta) and update run
    assert {"rollout", "old_logprobs", "reference", "update", "eval"} <= phases
    assert not any(r["counted"] for r in ledger if r["phase"] == "eval")
    for f in ("config.yaml", "metrics.jsonl", "report_card.json", "report_card.md", "report_card.tex", "run.json"):
        assert (tmp_path / "run" / f).exists(), f
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").exists()
    evals = [r for r in _lines(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "eval"]
    assert {r["target"] for r in evals} == {"greedy", "pass@k", "hard"}
    assert evals[0]["step"] == 0 and evals[-1]["step"] == out["steps"]
    card = json.loads((tmp_path / "run" / "report_card.json").read_text())
    assert card["total_flops"] == out["total_flops"] and sum(card["split"].values()) == out["total_flops"]


def test_second_call_on_a_complete_run_does_not_train_again(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    cfg = _cfg(tiny_model_dir, budget_flops=2e9)
    a = run_engine(cfg, tmp_path / "r")
    size = (tmp_path / "r" / "ledger.jsonl").stat().st_size
    b = run_engine(cfg, tmp_path / "r")
    assert a == b and (tmp_path / "r" / "ledger.jsonl").stat().st_size == size


def test_same_seed_same_ledger_and_metrics(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    cfg = _cfg(tiny_model_dir, budget_flops=3e9)
    run_engine(cfg, tmp_path / "a")
    run_engine(cfg, tmp_path / "b")
    for f in ("ledger.jsonl", "metrics.jsonl"):
        assert _strip_seconds(_lines(tmp_path / "a" / f)) == _strip_seconds(_lines(tmp_path / "b" / f)), f


def test_killed_run_resumes_to_the_same_result(tiny_model_dir, tmp_path, monkeypatch):
    """Crash after step 3 (checkpoint at step 2): the resumed run drops step 3's records,
    redoes it, and ends with the ledger and metrics of an uninterrupted run."""
    from race.engines import run_engine

    cfg = _cfg(tiny_model_dir, budget_flops=4e9)
    ref = run_engine(cfg, tmp_path / "ref")
    assert ref["steps"] >= 4
    kill_after_step(monkeypatch, cfg, tmp_path / "run", 3)
    assert not (tmp_path / "run" / "run.json").exists()
    assert max(r["step"] for r in _lines(tmp_path / "run" / "ledger.jsonl")) == 3
    out = run_engine(cfg, tmp_path / "run")
    assert out["resumed_from"] == 2
    assert_same_files(tmp_path / "ref", tmp_path / "run")
    assert out["total_flops"] == ref["total_flops"] and out["final"] == ref["final"]


def test_resumed_run_keeps_the_lr_schedule_of_the_uninterrupted_run(tiny_model_dir, tmp_path, monkeypatch):
    """The cosine schedule's length (steps the budget buys) is planned from step 1's bound
    in every run: a resume must not re-plan it from the bound of the step it resumes at.
    Steps from 3 on are given a 30% larger bound (in both runs), so a re-plan at step 3
    would buy fewer steps and change every learning rate after the resume."""
    from race.engines import builtin, run_engine

    real_prompts, real_bound = builtin.BuiltinEngine.prompts_at, builtin.BuiltinEngine.step_bound

    def prompts(self, step):
        self._bound_step = step
        return real_prompts(self, step)

    def bound(self, *a, **k):
        b = real_bound(self, *a, **k)
        return int(b * 1.3) if getattr(self, "_bound_step", 1) >= 3 else b

    monkeypatch.setattr(builtin.BuiltinEngine, "prompts_at", prompts)
    monkeypatch.setattr(builtin.BuiltinEngine, "step_bound", bound)
    cfg = _cfg(tiny_model_dir, budget_flops=5e9, lr_scheduler_type="cosine")
    ref = run_engine(cfg, tmp_path / "ref")
    assert ref["steps"] >= 4
    kill_after_step(monkeypatch, cfg, tmp_path / "run", 3)
    out = run_engine(cfg, tmp_path / "run")
    assert out["resumed_from"] == 2
    lrs = [r["lr"] for r in _lines(tmp_path / "ref" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(set(lrs)) > 2  # the schedule moves, so a different length would show
    assert_same_files(tmp_path / "ref", tmp_path / "run")


def test_kill_between_the_final_evaluation_and_the_final_checkpoint_does_not_evaluate_twice(
        tiny_model_dir, tmp_path, monkeypatch):
    """The last step is a checkpoint step; the final evaluation runs after that checkpoint
    and the run is killed before the final one. The resumed run drops the evaluation the
    checkpoint did not record and redoes it once: files equal an uninterrupted run's."""
    from race.engines import builtin, run_engine

    cfg = _cfg(tiny_model_dir, budget_flops=1e12, max_steps=4, checkpoint_every=2,
               eval={"n_problems": 8, "n_hard_problems": 4, "n_pass_problems": 4, "pass_k": 2, "num_points": 1})
    ref = run_engine(cfg, tmp_path / "ref")
    assert ref["steps"] == 4 and ref["stop_reason"] == "max_steps"
    real = builtin.BuiltinEngine.checkpoint
    calls: list[int] = []

    def killed_at_the_final_checkpoint(self, step):
        calls.append(step)
        if calls.count(4) == 2:  # the in-loop checkpoint at step 4 ran; this is the final one
            raise KeyboardInterrupt("simulated kill")
        return real(self, step)

    monkeypatch.setattr(builtin.BuiltinEngine, "checkpoint", killed_at_the_final_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        run_engine(cfg, tmp_path / "run")
    evals = [r for r in _lines(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "eval" and r["step"] == 4]
    assert evals  # the final evaluation was written before the kill
    monkeypatch.setattr(builtin.BuiltinEngine, "checkpoint", real)
    out = run_engine(cfg, tmp_path / "run")
    assert out["resumed_from"] == 4
    assert_same_files(tmp_path / "ref", tmp_path / "run")
    assert out["final"] == ref["final"]


def test_ledger_equals_measured_flops_under_torch_conventions(tiny_model_dir, tmp_path, monkeypatch):
    """Each training step's counted ledger FLOPs equal FlopCounterMode's count of that step
    (rollout, old/reference log-probs, update; eager attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines import builtin, run_engine

    measured: dict[int, int] = {}
    real = builtin.BuiltinEngine._train_step

    def counted(self, step, *a, **k):
        with FlopCounterMode(display=False) as fc:
            charged = real(self, step, *a, **k)
        measured[step] = fc.get_total_flops()
        return charged

    monkeypatch.setattr(builtin.BuiltinEngine, "_train_step", counted)
    cfg = _cfg(tiny_model_dir, budget_flops=4e9, conventions="torch", num_iterations=2, beta=0.1,
               attn_implementation="eager")
    run_engine(cfg, tmp_path / "m")
    ledger = _lines(tmp_path / "m" / "ledger.jsonl")
    assert len(measured) >= 2
    for step, flops in measured.items():
        analytic = sum(r["flops"] for r in ledger if r["step"] == step and r["counted"])
        assert analytic == flops, (step, analytic, flops)


def test_budget_below_one_step_says_what_a_step_costs(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    with pytest.raises(AccountingError, match="smaller than one step"):
        run_engine(_cfg(tiny_model_dir, budget_flops=1e6), tmp_path / "x")


def test_bad_configs_are_refused_with_the_field_named():
    from race.spec.errors import ConfigError

    with pytest.raises(ConfigError, match="num_generations"):
        run_config_from_dict({"budget_flops": 1e9, "num_generations": 1})
    with pytest.raises(ConfigError, match="prompts_per_step"):
        run_config_from_dict({"budget_flops": 1e9, "prompts_per_step": 0})
    with pytest.raises(ConfigError, match="budget_flops"):
        run_config_from_dict({})
    with pytest.raises(ConfigError, match="unknown field"):
        run_config_from_dict({"budget_flops": 1e9, "num_generation": 4})


def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    import torch

    from race.engines import grpo_math, run_engine

    real = grpo_math.grpo_loss
    calls = {"n": 0}

    def poisoned(*a, **k):
        loss, stats = real(*a, **k)
        calls["n"] += 1
        return (loss * torch.tensor(float("nan")) if calls["n"] >= 3 else loss), stats

    monkeypatch.setattr("race.engines.builtin.engine.grpo_loss", poisoned)
    out = run_engine(_cfg(tiny_model_dir, budget_flops=4e9), tmp_path / "d")
    assert out["status"] == "diverged" and "non-finite" in out["error"]
    assert (tmp_path / "d" / "checkpoint" / "trainable.safetensors").exists()


def test_default_torch_threads_config_then_worker_then_one_for_tiny(monkeypatch):
    from race.spec.run import RunConfig
    from race.engines.common import default_torch_threads

    monkeypatch.delenv("RACE_TORCH_THREADS", raising=False)
    assert default_torch_threads(RunConfig(model="tiny-s", budget_flops=1e9)) == 1
    assert default_torch_threads(RunConfig(model="qwen2.5-0.5b", budget_flops=1e9)) is None
    assert default_torch_threads(RunConfig(model="tiny-s", budget_flops=1e9, torch_threads=3)) == 3
    monkeypatch.setenv("RACE_TORCH_THREADS", "2")  # a grid worker's threads_per_worker
    assert default_torch_threads(RunConfig(model="tiny-s", budget_flops=1e9)) == 2
    assert default_torch_threads(RunConfig(model="tiny-s", budget_flops=1e9, torch_threads=4)) == 4


def test_bfloat16_base_with_float32_adapters_trains_with_the_fast_paths(tiny_model_dir, tmp_path):
    """``dtype: bfloat16`` loads the base in bf16 while PEFT keeps the LoRA weights in fp32
    (its ``autocast_adapter_dtype``): the fast decoder and forward mix them as PEFT does
    (the adapter branch in fp32, added to the bf16 base output) and the run stays within
    its budget with finite losses."""
    import math

    from race.engines import run_engine

    cfg = _cfg(tiny_model_dir, budget_flops=3e9, dtype="bfloat16")
    out = run_engine(cfg, tmp_path / "bf16")
    assert out["status"] == "complete" and 0 < out["total_flops"] <= cfg.budget_flops and out["steps"] >= 2
    losses = [r["loss"] for r in _lines(tmp_path / "bf16" / "metrics.jsonl") if r["kind"] == "train"]
    assert losses and all(math.isfinite(x) for x in losses)
