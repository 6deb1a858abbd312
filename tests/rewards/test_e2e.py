"""End to end through the built-in engine: a learned reward's FLOPs land in the ledger's
``reward`` phase (equal to what its RewardOutputs reported), and runs with an ORM and with
the random control complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from race.spec.run import run_config_from_dict


def _cfg(model_dir: Path, reward: str, **over):
    d = dict(model=str(model_dir), budget_flops=4e9, max_steps=2, prompts_per_step=3, num_generations=4,
             max_completion_length=16, reward=reward, learning_rate=1e-3, seed=1, checkpoint_every=5,
             eval={"n_problems": 4, "n_hard_problems": 2, "n_pass_problems": 2, "pass_k": 2, "num_points": 1},
             torch_threads=1, conventions="torch")
    d.update(over)
    return run_config_from_dict(d)


def _ledger(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("spec", ["prm:prm-xs", "prm:prm-xs:mean+outcome", "orm:orm-xs"])
def test_learned_reward_is_charged_to_the_reward_phase(spec, built_rms, tiny_model_dir, tmp_path, monkeypatch):
    from race.engines import run_engine
    from race.rewards.learned import LearnedReward

    outputs = []
    real = LearnedReward.score

    def recording(self, problems, completions):
        out = real(self, problems, completions)
        outputs.append(out)
        return out

    monkeypatch.setattr(LearnedReward, "score", recording)
    out = run_engine(_cfg(tiny_model_dir, spec), tmp_path / "run")
    assert out["status"] == "complete" and out["steps"] == 2 and len(outputs) == 2
    reported = sum(o.flops for o in outputs)
    ledger = _ledger(tmp_path / "run")
    charged = sum(r["flops"] for r in ledger if r["phase"] == "reward")
    assert charged == reported > 0
    assert all(r["counted"] for r in ledger if r["phase"] == "reward")
    assert out["phase_flops"]["reward"] == reported
    assert {r["component"] for r in ledger if r["phase"] == "reward"} == {"forward", "head"}
    assert sum(r["tokens"] for r in ledger if r["phase"] == "reward") == sum(o.tokens for o in outputs)
    assert out["total_flops"] <= out["budget_flops"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("rm_score_mean" in r for r in rows if r["kind"] == "train")


def test_random_control_run_completes_at_zero_reward_cost(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    out = run_engine(_cfg(tiny_model_dir, "random"), tmp_path / "rand")
    assert out["status"] == "complete" and out["phase_flops"]["reward"] == 0


def test_a_prm_reading_prompts_longer_than_max_prompt_length_stays_within_its_bound(
        built_rms, tiny_model_dir, tmp_path, monkeypatch):
    """The policy's prompts are cut to 6 tokens; the PRM reads them whole. The reward bound
    the engine checks before each step covers what the PRM then charges, and the run ends
    within the budget with nothing recorded as overrun."""
    import race.engines.builtin.engine as builtin
    from race.engines import run_engine

    bounds = []
    real = builtin.reward_bound

    def recording(reward, n, P, T, problems=None):
        b = real(reward, n, P, T, problems)
        bounds.append((P, b))
        return b

    monkeypatch.setattr(builtin, "reward_bound", recording)
    out = run_engine(_cfg(tiny_model_dir, "prm:prm-xs", max_prompt_length=6, max_steps=None, budget_flops=2e9),
                     tmp_path / "run")
    assert out["status"] == "complete" and out["stop_reason"] == "budget" and out["steps"] >= 2
    ledger = _ledger(tmp_path / "run")
    assert out["total_flops"] <= 2e9 and not [r for r in ledger if r["phase"] == "overrun"]
    assert all(P == 6 for P, _ in bounds)
    per_step: dict[int, int] = {}
    for r in ledger:
        if r["phase"] == "reward":
            per_step[r["step"]] = per_step.get(r["step"], 0) + r["flops"]
    # bounds[0] planned the schedule (step 1's problems); then one bound before each step
    step_bounds = [b for _, b in bounds[1:]]
    for step, used in per_step.items():
        assert used <= step_bounds[step - 1], (step, used, step_bounds[step - 1])
