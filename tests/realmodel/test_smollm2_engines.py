"""Both engines train SmolLM2-135M-Instruct, and charge what executes: each step's ledger
equals ``FlopCounterMode``'s count of it under ``conventions="torch"`` (eager attention).
Small on purpose: a few sequences of 4-5 new tokens (the model's step then takes seconds)."""

from __future__ import annotations

import pytest

from race.spec.run import run_config_from_dict

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]
DATA = "configs/data/arith-qa"


def _cfg(model_dir, **over):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    d = dict(model=str(model_dir), budget_flops=1e15, max_steps=1, prompts_per_step=2, num_generations=2,
             max_completion_length=4, max_prompt_length=64, reward="rule", learning_rate=1e-4, seed=0,
             lora={"r": 8, "lora_alpha": 16}, torch_threads=1, device="cpu", conventions="torch",
             attn_implementation="eager",
             task={"name": "dataset", "train_path": str(root / DATA / "train.jsonl"),
                   "test_path": str(root / DATA / "test.jsonl"), "chat_template": True,
                   "prompt_template": "{question} Give only the final number."},
             eval={"n_problems": 2, "n_hard_problems": 0, "n_pass_problems": 0, "num_points": 1,
                   "targets": ["greedy"]})
    d.update(over)
    return run_config_from_dict(d)


def test_builtin_step_charges_what_executes(smollm2_dir, tmp_path, load_script):
    """One built-in step (LoRA, gradient checkpointing, 2 prompts x G=4): its ledger's
    rollout and learning FLOPs equal the counter's count of them (the harness of
    benchmarks/gpu_check.py's built-in check, on the real model)."""
    gc = load_script("benchmarks/gpu_check.py")
    import gpu_check_trl

    ctx = gc.Ctx(reduced=True, device="cpu", dtype="float32", sizes=gc.Sizes.of(True), work=tmp_path,
                 args=gc.parse_args(["--reduced"]), _model_dir=smollm2_dir)
    out = gpu_check_trl.check_builtin_step(ctx)
    assert out["ok"] and out["rel"] == {"rollout": 0.0, "learning": 0.0}, out["headline"]
    assert out["keys"]["recompute/forward"] > 0 and out["ledger"]["rollout"] > 0


def test_trl_steps_charge_what_executes(smollm2_dir, tmp_path, load_script):
    """TRL's GRPOTrainer with the RACE callback, 3 steps: LoRA, checkpointing, old-policy
    and reference log-probs; each step's ledger equals the counter's count of TRL's stages
    (the tiny-model test's harness, tests/engines/test_trl_measured.py, on the real model)."""
    pytest.importorskip("trl")
    harness = load_script("tests/engines/test_trl_measured.py")
    trainer, cb, ledger = harness._run_measured(smollm2_dir, tmp_path, peft=True, beta=0.04, num_iterations=2,
                                                gradient_checkpointing=True, max_completion_length=4)
    harness._assert_ledger_equals_measured(trainer, cb, ledger)


def test_trl_engine_run(smollm2_dir, tmp_path):
    """``engine: trl`` writes the same run directory on the real model."""
    from race.engines import run_engine

    out = run_engine(_cfg(smollm2_dir, engine="trl"), tmp_path / "t")
    assert out["status"] == "complete" and out["steps"] == 1 and out["engine"] == "trl"
    assert 0 < out["total_flops"] <= 1e15 and (tmp_path / "t" / "adapter" / "adapter_model.safetensors").exists()
