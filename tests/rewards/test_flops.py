"""Reward-model FLOPs: what score() reports equals what FlopCounterMode measures of it
(conventions="torch", eager attention), the head runs only where it is read, and
step_bound bounds a step."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from race.accounting import RewardSystem, reward_model_flops
from race.models.family import tiny_config_kwargs
from race.rewards import make_reward
from race.tasks import solution_text


def _completions(problems):
    ref = [solution_text(p) for p in problems]
    return [ref[0], ref[1][:-4], "12+3=15;#15.", "", "garbage with é and 😀", ref[5] + ref[5]]


def _measure(reward, problems, texts):
    head = reward.scorer.model.score
    spans = []
    with FlopCounterMode(display=False) as fc:
        h1 = head.register_forward_pre_hook(lambda m, a: spans.append(-fc.get_total_flops()))
        h2 = head.register_forward_hook(lambda m, a, o: spans.append(fc.get_total_flops()))
        try:
            out = reward.score(problems, texts)
        finally:
            h1.remove()
            h2.remove()
    return out, fc.get_total_flops(), sum(spans)


@pytest.mark.parametrize("spec", ["prm:prm-xs", "prm:prm-xs:mean+outcome", "orm:orm-xs"])
def test_components_equal_measured_flops(built_rms, arith, spec):
    r = make_reward(spec, device="cpu", conventions="torch")
    assert r.scorer.model.config._attn_implementation == "eager"
    problems = arith.problems("test", 6, seed=3)
    texts = _completions(problems)
    out, total, head = _measure(r, problems, texts)
    assert out.flops == total > 0
    assert out.components["reward/head"] == head
    assert out.components["reward/forward"] == total - head
    assert len(out.rewards) == len(out.verified) == 6 and out.verified[0] == 1.0
    # the padded width executes for every row
    widths = {len(p.prompt) + len(t) for p, t in zip(problems, texts)}
    assert out.tokens == 6 * max(widths)


def test_prm_head_runs_only_at_the_markers(built_rms, arith):
    r = make_reward("prm:prm-xs", device="cpu", conventions="torch")
    problems = arith.problems("test", 6, seed=3)
    texts = _completions(problems)
    out = r.score(problems, texts)
    markers = sum(min(65, t.count(";") + t.count(".")) for t in texts)
    h = tiny_config_kwargs("tiny-xs")["hidden_size"]
    assert out.components["reward/head"] == markers * 2 * h * 2  # 2 x positions x hidden x 2 labels
    o = make_reward("orm:orm-xs", device="cpu", conventions="torch").score(problems, texts)
    assert o.components["reward/head"] == 6 * 2 * h * 1


def test_unfinished_trajectories_get_no_process_reward(built_rms, arith):
    r = make_reward("prm:prm-xs:min", device="cpu")
    p = arith.problems("test", 1, seed=0)[0]
    ref = solution_text(p)
    out = r.score([p] * 3, [ref, ref[: ref.index("#")], ""])
    assert out.rewards[1] == 0.0 and out.rewards[2] == 0.0
    assert 0.0 < out.rewards[0] < 1.0


def test_step_bound_bounds_the_step(built_rms, arith, char_tokenizer):
    """With the policy's tokenizer the bound is tight (char tokens: k = 1); without it the
    RM's whole window is assumed."""
    problems = arith.problems("test", 8, seed=5)
    P = max(len(p.prompt) for p in problems)
    T = 48
    texts = [(solution_text(p) * 3)[:T] for p in problems]
    for spec in ("prm:prm-xs", "orm:orm-xs"):
        tight = make_reward(spec, device="cpu", tokenizer=char_tokenizer)
        loose = make_reward(spec, device="cpu")
        assert tight.k == 1 and loose.k is None
        used = tight.score(problems, texts).flops
        assert used <= tight.step_bound(8, P, T) <= loose.step_bound(8, P, T)
        shape = tight.scorer.shape
        assert loose.step_bound(8, P, T) == sum(reward_model_flops(
            RewardSystem(tight.kind, shape), [256] * 8,
            head_positions=[65] * 8 if tight.kind == "prm" else "last").values())
