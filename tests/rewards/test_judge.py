"""Generative judge: a causal LM generates a fixed-length verdict; its FLOPs are prefill +
KV-cache decode with the judge's own shape, equal to what FlopCounterMode measures."""

from __future__ import annotations

import pytest
from torch.utils.flop_counter import FlopCounterMode

from race.rewards import make_reward
from race.tasks import solution_text


def test_judge_flops_equal_measured(tiny_model_dir, arith):
    r = make_reward(f"judge:{tiny_model_dir}", device="cpu", conventions="torch")
    assert r.kind == "judge" and r.shape.is_lm
    problems = arith.problems("test", 5, seed=0)
    texts = [solution_text(p) for p in problems[:3]] + ["", "x" * 2000]
    with FlopCounterMode(display=False) as fc:
        out = r.score(problems, texts)
    assert set(out.components) == {"reward/prefill", "reward/decode"}
    assert out.flops == fc.get_total_flops() > 0
    assert len(out.rewards) == 5 and set(out.rewards) <= {0.0, 1.0}
    assert out.verified[:3] == [1.0, 1.0, 1.0] and "judge_yes_frac" in out.extra
    assert out.flops <= r.step_bound(5, 512, 512)


def test_judge_terms_mix_with_rules(tiny_model_dir, arith):
    r = make_reward(f"judge:{tiny_model_dir}:rm+3*outcome", device="cpu")
    p = arith.problems("test", 2, seed=0)
    out = r.score(p, [solution_text(p[0]), "nope"])
    assert out.rewards[0] >= 0.75 and out.rewards[1] <= 0.25


def test_a_run_with_the_judge_warns_that_it_is_not_feedback(tiny_model_dir):
    from race.rewards.hf import JudgeRewardWarning

    with pytest.warns(JudgeRewardWarning, match="cost-and-plumbing check, not feedback"):
        make_reward(f"judge:{tiny_model_dir}", device="cpu")


def test_other_rewards_do_not_warn(built_rms):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_reward("prm:prm-xs", device="cpu")
        make_reward("rule")
    assert not [w for w in caught if "not feedback" in str(w.message)]
