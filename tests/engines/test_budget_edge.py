"""The budget edge: a step whose bound was low never fails the run and never takes the
ledger past the budget. What it executed is recorded apart (the uncounted ``overrun``
phase) and the run ends as a clean ``budget`` stop; a reward model charged through the
TRL callback is bounded."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from race.spec.run import run_config_from_dict


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=3e9, prompts_per_step=4, num_generations=4,
             max_completion_length=12, reward="random", learning_rate=1e-3, seed=3, checkpoint_every=2,
             eval={"n_problems": 8, "n_hard_problems": 4, "n_pass_problems": 4, "pass_k": 2, "num_points": 2},
             torch_threads=1)
    d.update(over)
    return run_config_from_dict(d)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("where", ["bound", "ledger"])
def test_a_low_step_bound_ends_as_a_clean_budget_stop(tiny_model_dir, tmp_path, monkeypatch, where):
    """``bound``: the engine's bound is forced to 1 FLOP, so only the guard's exact check
    before the update stops the run. ``ledger``: the guard is blinded (everything "fits"),
    so the ledger refuses the charge (``BudgetExceededError``) after the update ran and the
    guard records it as overrun; the run still ends cleanly."""
    from race.accounting import BudgetGuard
    from race.engines import run_engine
    from race.engines.builtin import BuiltinEngine

    monkeypatch.setattr(BuiltinEngine, "step_bound", lambda self, prompt_len, problems=None: 1)
    if where == "ledger":
        monkeypatch.setattr(BudgetGuard, "fits", lambda self, flops: True)
    cfg = _cfg(tiny_model_dir)
    out = run_engine(cfg, tmp_path / "run")
    assert out["status"] == "complete" and out["stop_reason"] == "budget" and out["error"] is None
    ledger = _lines(tmp_path / "run" / "ledger.jsonl")
    counted = sum(r["flops"] for r in ledger if r["counted"])
    assert 0 < counted == out["total_flops"] <= cfg.budget_flops
    over = [r for r in ledger if r["phase"] == "overrun"]
    assert over and not any(r["counted"] for r in over)
    assert {r["step"] for r in over} == {out["steps"] + 1}  # the step that did not fit, and nothing after it
    assert out["phase_flops"]["overrun"] == sum(r["flops"] for r in over) > 0
    # the step did not fit: with the exact check nothing but its rollout and reward ran
    comps = {r["component"] for r in over}
    if where == "bound":
        assert comps <= {"rollout_prefill", "rollout_decode", "rollout_merge", "reward_score"}
    else:  # the update ran before the ledger refused its charge
        assert "update_forward" in comps
    assert max(r["step"] for r in ledger if r["counted"]) == out["steps"]
    rows = _lines(tmp_path / "run" / "metrics.jsonl")
    assert max(r["step"] for r in rows if r["kind"] == "train") == out["steps"]
    card = json.loads((tmp_path / "run" / "report_card.json").read_text())
    assert card["total_flops"] == out["total_flops"]
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").exists()


def _trl_run(tiny_model_dir, tmp_path, charge_of_call, budget=2e8, **cb_kw):
    """A TRL run whose reward function charges a reward model's FLOPs through the callback
    (``charge_of_call(i)`` FLOPs at its i-th call)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from race.engines.trl_callback import RaceFlopCallback
    from race.models import load_policy

    model, tok = load_policy(str(tiny_model_dir), device="cpu")
    ds = Dataset.from_dict({"prompt": ["Q:1+2\nA:", "Q:33-4+5\nA:"] * 8})
    args = GRPOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=5, max_steps=50, report_to="none", disable_tqdm=True,
                      save_strategy="no")
    cb = RaceFlopCallback(budget, **cb_kw)
    calls = []

    def reward(completions, **_):
        cb.charge({"reward/forward": int(charge_of_call(len(calls)))})
        calls.append(1)
        return [float(len(c)) for c in completions]

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[cb], peft_config=LoraConfig(r=2, task_type="CAUSAL_LM"))
    trainer.train()
    return cb, trainer


def test_a_reward_model_charged_through_the_callback_is_bounded(tiny_model_dir, tmp_path):
    """No ``reward_step_bound``: the bound takes the largest charge seen (with a warning),
    so the run stops before the reward model's FLOPs take it past the budget (with a
    bound of 0 for the reward it would have run into the ledger's refusal)."""
    with pytest.warns(UserWarning, match="no reward_step_bound"):
        cb, trainer = _trl_run(tiny_model_dir, tmp_path, lambda i: 5e7)
    assert cb.stop_reason == "budget" and cb.overrun_flops == 0
    assert 0 < cb.ledger.total <= 2e8
    per_step = cb.ledger.totals_by_phase(counted_only=True)
    assert per_step["reward"] == 5e7 * trainer.state.global_step
    assert cb.ledger.total + cb.next_step_bound(trainer.state) > 2e8
    # the next step's bound holds the reward model's charge (it held 0 before)
    with_reward = cb.next_step_bound(trainer.state)
    cb._reward_seen = 0
    assert with_reward - cb.next_step_bound(trainer.state) == 5e7


def test_a_given_reward_step_bound_is_used_and_does_not_warn(tiny_model_dir, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"(?!race).*")
        cb, trainer = _trl_run(tiny_model_dir, tmp_path, lambda i: 5e7,
                               reward_step_bound=lambda n, p, t: int(5e7))
    assert cb.stop_reason == "budget" and cb.overrun_flops == 0 and cb.ledger.total <= 2e8


def test_a_reward_charge_beyond_its_bound_ends_as_a_budget_stop(tiny_model_dir, tmp_path):
    """A charge larger than anything the bound knew of: the ledger refuses it, the callback
    records the step as overrun and stops training; nothing raises."""
    with pytest.warns(UserWarning, match="no reward_step_bound"):
        cb, trainer = _trl_run(tiny_model_dir, tmp_path, lambda i: 1e3 if i < 2 else 1.5e8)
    assert cb.stop_reason == "budget" and cb.overrun_flops > 1.5e8 - 1
    assert 0 < cb.ledger.total <= 2e8
    over = [r for r in cb.ledger if r.phase == "overrun"]
    assert over and not any(r.counted for r in over) and "reward_forward" in {r.component for r in over}
    assert not any(r.counted for r in cb.ledger if r.step == over[0].step)
