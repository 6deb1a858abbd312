"""One constructor of a run's StepPlan (``race.estimate.run_step_plan``): the built-in
engine's setup and the dry run (``run_step_flops``, the grid's prediction) build the same
plan from a config, the facts only a loaded model tells included."""

from __future__ import annotations

from dataclasses import replace

import pytest

from race.accounting import RULE, LoRA
from race.estimate import run_lora, run_step_flops, run_step_plan
from race.models.refs import resolve_shape
from race.rewards.systems import reward_system
from race.spec.run import run_config_from_dict


def _cfg(model_dir, **over):
    d = dict(model=str(model_dir), budget_flops=5e9, prompts_per_step=2, num_generations=4, max_completion_length=6,
             reward="random", seed=5, max_steps=1, num_iterations=2, beta=0.05, gradient_accumulation_steps=2,
             eval={"n_problems": 2, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"]},
             torch_threads=1, conventions="torch")
    d.update(over)
    return run_config_from_dict(d)


@pytest.mark.parametrize("over", [{}, {"gradient_checkpointing": True}, {"lora": None},
                                  {"num_update_generations": 2}])
def test_the_engine_builds_the_plan_the_dry_run_predicts(tiny_model_dir, tmp_path, over):
    from race.engines.builtin.engine import BuiltinEngine

    cfg = _cfg(tiny_model_dir, **over)
    state = BuiltinEngine(cfg, tmp_path / "run").setup()
    predicted = run_step_plan(cfg, resolve_shape(cfg.model))
    assert replace(predicted.shape, name=state.shape.name) == state.shape  # the config's shape is the model's
    assert state.step_plan == replace(predicted, shape=state.shape) and predicted.reward == RULE
    assert predicted.share_prompt and predicted.recompute_early_stop
    assert predicted.update_generations == cfg.num_update_generations  # the learning passes' rows per prompt
    ck = cfg.gradient_checkpointing
    assert predicted.micro_batch == (None if ck else cfg.prompts_per_step * cfg.update_generations // 2) and predicted.inputs_require_grad == ck == predicted.recompute
    assert predicted.lora == state.lora == run_lora(cfg) == (None if cfg.lora is None else
                                                             LoRA(cfg.lora.r, tuple(cfg.lora.target_modules)))


def test_the_dry_runs_step_is_the_plans_step_at_the_maxima(tiny_model_dir):
    for engine in ("builtin", "trl"):
        cfg = _cfg(tiny_model_dir, engine=engine, reward="rule")
        plan = run_step_plan(cfg, resolve_shape(cfg.model), reward=reward_system(cfg.reward))
        assert plan.share_prompt == (engine == "builtin") and (plan.micro_batch is not None) == (engine == "builtin")
        n = cfg.prompts_per_step * cfg.num_generations
        step = run_step_flops(cfg)
        assert step == plan.step([cfg.max_prompt_length] * n, [cfg.max_completion_length] * n)
        assert step.total == plan.bound(cfg.prompts_per_step, cfg.max_prompt_length, cfg.max_completion_length)
