"""The regime call checked at the target (race.analysis.share_target): the best setting of each
regime taken from the pilots, and the pilots' call judged right, wrong or not decided by the
paired difference of those settings at T, on synthetic tables whose truth is planted."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from analysis_synth import SMALL, make_study

from race.analysis.share_target import regime_check, regime_settings
from race.analysis.update_share import Regime, share_table

PILOT, TARGET = 1e12, 4e12
P = (0.30, 0.40, 0.50, 0.60, 0.70, 0.80, 0.90)


def _study(lines, seeds=(0, 1, 2), n_problems=2000):
    """(runs, evals) at the pilot budget and T: per reward spec, one allocation per p level
    (told apart by num_iterations) with feedback share f and true score ``score(p, budget)``."""
    allocs, truth, split = [], {}, {}
    for reward, (f, score) in lines.items():
        for k, p in enumerate(P, start=1):
            al = dataclasses.replace(SMALL, reward=reward, num_iterations=k, r0=0.3)
            allocs.append(al)
            truth[al.key], split[al.key] = (lambda b, p=p, s=score: s(p, b)), (p, f)
    runs, evals = make_study(allocs, budgets=[PILOT, TARGET], seeds=seeds, n_points=2, n_problems=n_problems, rng=1,
                             seed_sd=0.002, truth_override=lambda al, b, flops: np.full(len(flops), truth[al.key](b)))
    keys = [f"{r.model}|G={r.num_generations}|P={r.prompts_per_step}|it={r.num_iterations}|lr={r.learning_rate:g}"
            f"|{r.reward}" for r in runs.itertuples()]
    p = np.array([split[k][0] for k in keys]) * (1 - np.array([split[k][1] for k in keys]))
    f = np.array([split[k][1] for k in keys])
    b = runs["budget"].to_numpy(float)
    return runs.assign(learning_flops=p * b, feedback_flops=f * b, rollout_flops=(1 - p - f) * b), evals


def test_each_regimes_best_setting_and_the_call_judged_at_the_target():
    """rule:partial peaks at p 0.4 (search-heavy) at the pilots and at T: right. prm peaks at
    p 0.6 x 0.9 = 0.54 (update-heavy) at the pilots, but at T the best search-heavy setting
    of the pilots (p 0.5 x 0.9 = 0.45) is 0.12 ahead: wrong. rule:outcome is peaked at the pilots (update-heavy at
    p 0.7) and its two settings tie at T: not decided. rule:format's two regimes tie at the pilots: no call."""
    lines = {
        "rule:partial": (0.0, lambda p, b: 0.62 if abs(p - 0.4) < 1e-9 else 0.52 if abs(p - 0.5) < 1e-9 else 0.45),
        "prm:prm-s": (0.1, lambda p, b: (0.62 if abs(p - 0.6) < 1e-9 else 0.52 if abs(p - 0.5) < 1e-9 else 0.45)
                      if b == PILOT else (0.72 if abs(p - 0.5) < 1e-9 else 0.60 if abs(p - 0.6) < 1e-9 else 0.5)),
        "rule:format": (0.0, lambda p, b: 0.60 if abs(p - 0.4) < 1e-9 or abs(p - 0.6) < 1e-9 else 0.45),
        "rule:outcome": (0.0, lambda p, b: 0.62 - 1.5 * (p - 0.7) ** 2 if b == PILOT else
                         (0.60 if p in (0.4, 0.7) else 0.5)),
    }
    runs, evals = _study(lines)
    table, boot = share_table(evals, runs, "greedy", n_boot=400, rng=0)
    checks = {c.reward: c for c in regime_check(table, boot, table, boot, pilot_budget=PILOT, target_budget=TARGET)}
    pil = table[table["budget"] == PILOT]
    rule = regime_settings(pil[pil["reward"] == "rule:partial"])
    assert set(rule) == {Regime.UPDATE_HEAVY, Regime.SEARCH_HEAVY}
    p_of = dict(zip(pil["allocation"], pil["p"]))
    assert p_of[rule[Regime.SEARCH_HEAVY]] == pytest.approx(0.4)
    assert p_of[rule[Regime.UPDATE_HEAVY]] == pytest.approx(0.5)
    right, wrong, tie = checks["rule:partial"], checks["prm:prm-s"], checks["rule:outcome"]
    assert (right.call, right.other, right.verdict) == (Regime.SEARCH_HEAVY, Regime.UPDATE_HEAVY, "right")
    assert right.target_diff.lo > 0 and right.pilot_diff.diff > 0
    assert (wrong.call, wrong.other, wrong.verdict) == (Regime.UPDATE_HEAVY, Regime.SEARCH_HEAVY, "wrong")
    assert wrong.pilot[str(Regime.UPDATE_HEAVY)][:2] == pytest.approx((0.54, 0.6))  # p, p_policy
    assert wrong.pilot[str(Regime.SEARCH_HEAVY)][:2] == pytest.approx((0.45, 0.5))
    assert wrong.target_diff.diff == pytest.approx(0.60 - 0.72, abs=0.03) and wrong.target_diff.hi < 0
    assert tie.call == Regime.UPDATE_HEAVY and tie.verdict == "not decided at T"
    assert tie.target_diff.lo < 0 < tie.target_diff.hi
    assert wrong.text().startswith("prm:prm-s: pilots call update-heavy; at T update-heavy - search-heavy = -0.1")
    # p 0.4 and 0.6 tie at the pilots (and at T): the regime is not identified, the pilot best's stands for it
    none = checks["rule:format"]
    assert none.call == Regime.NOT_IDENTIFIED
    assert {none.called, none.other} == {Regime.UPDATE_HEAVY, Regime.SEARCH_HEAVY}
    assert none.verdict == ("no call (the pilots did not identify the regime); the pilot best's regime at T: "
                            "not decided at T")
    assert none.pilot_diff.lo <= 0 <= none.pilot_diff.hi


def test_a_line_with_one_regime_is_not_checked_and_missing_target_runs_are_named():
    lines = {"rule:partial": (0.0, lambda p, b: 0.6 - 0.2 * abs(p - 0.7))}
    runs, evals = _study(lines, n_problems=500)
    high = runs[runs["learning_flops"] / runs["budget"] >= 0.5]
    table, boot = share_table(evals[evals["run_id"].isin(high["run_id"])], high, "greedy", n_boot=200, rng=0)
    assert regime_check(table, boot, table, boot, pilot_budget=PILOT, target_budget=TARGET) == []
    full, fboot = share_table(evals, runs, "greedy", n_boot=200, rng=0)
    pilots = full[full["budget"] == PILOT]
    with pytest.raises(ValueError, match="run it there first"):
        regime_check(pilots, fboot, pilots, fboot, pilot_budget=PILOT, target_budget=TARGET)
