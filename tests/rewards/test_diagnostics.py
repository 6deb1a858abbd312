"""Over-optimisation diagnostic: a pure function over a run's metric rows."""

from __future__ import annotations

import pytest

from race.rewards.diagnostics import overoptimisation, slope


def train(rewards, verified):
    return [{"kind": "train", "step": i + 1, "reward_mean": r, "verified_mean": v}
            for i, (r, v) in enumerate(zip(rewards, verified))]


def evals(steps, scores, target="greedy"):
    return [{"kind": "eval", "step": s, "target": target, "score": x} for s, x in zip(steps, scores)]


def test_slope_is_least_squares():
    assert slope([0, 1, 2], [1, 3, 5]) == pytest.approx(2.0)
    assert slope([1, 1], [0, 5]) == 0.0 and slope([1], [2]) == 0.0


def test_proxy_up_verified_down_is_flagged():
    n = 20
    rows = train([0.3 + 0.03 * i for i in range(n)], [0.5] * n)
    ev = evals([0, 5, 10, 12, 14, 16, 18, 20], [0.50, 0.52, 0.50, 0.45, 0.40, 0.36, 0.33, 0.30])
    out = overoptimisation(rows, ev)
    assert out["flag"] and out["verified_source"] == "eval:greedy"
    # slopes are per whole run over the second half: proxy +0.03/step x 20 steps = +0.6
    assert out["proxy_slope"] == pytest.approx(0.6, abs=1e-6)
    assert out["verified_slope"] < -0.3 and "over-optimisation" in out["reason"]


def test_falls_back_to_train_verified_without_enough_evals():
    n = 20
    rows = train([0.3 + 0.02 * i for i in range(n)], [0.6 - 0.02 * i for i in range(n)])
    out = overoptimisation(rows, evals([0, 20], [0.5, 0.3]))
    assert out["flag"] and out["verified_source"] == "train"
    assert out["verified_slope"] == pytest.approx(-0.4, abs=1e-6)


@pytest.mark.parametrize("reward, verified, why", [
    ([0.3 + 0.02 * i for i in range(20)], [0.3 + 0.02 * i for i in range(20)], "did not fall"),  # real gains
    ([0.5] * 20, [0.6 - 0.02 * i for i in range(20)], "did not rise"),  # collapse, proxy flat
    ([0.5 + 0.001 * i for i in range(20)], [0.5 - 0.001 * i for i in range(20)], "no trend"),  # noise-sized
])
def test_not_flagged(reward, verified, why):
    out = overoptimisation(train(reward, verified), [])
    assert not out["flag"] and why in out["reason"]


def test_early_climb_is_ignored_and_short_runs_give_no_verdict():
    # verified rose early then stayed; proxy kept rising: second half has no fall
    v = [0.2 + 0.04 * i for i in range(10)] + [0.6] * 10
    out = overoptimisation(train([0.2 + 0.03 * i for i in range(20)], v), [])
    assert not out["flag"]
    short = overoptimisation(train([0.1, 0.9], [0.9, 0.1]), [])
    assert not short["flag"] and "too few points" in short["reason"]
    assert overoptimisation([], [])["flag"] is False


def test_garbage_values_are_skipped():
    rows = train([0.3 + 0.03 * i for i in range(20)], [0.6 - 0.02 * i for i in range(20)])
    rows += [{"kind": "train", "step": 21, "reward_mean": float("nan"), "verified_mean": None},
             {"kind": "train", "step": "x", "reward_mean": 1.0}]
    assert overoptimisation(rows, [])["flag"]
