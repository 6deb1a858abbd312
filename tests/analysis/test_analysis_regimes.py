import dataclasses

import numpy as np
import pandas as pd
import pytest

from race.analysis import axes_between, pairwise_decision_accuracy, rank_stability, regime_changes, regimes

from analysis_synth import LARGE, MEDIUM, SMALL, Alloc, make_study


def test_planted_regime_change_is_detected(crossing_study):
    runs, evals = crossing_study
    reg = regimes(evals, runs, "greedy", n_boot=300, rng=0)
    assert list(reg["winner"]) == [SMALL.key, LARGE.key]
    assert reg["decisive"].all() and (reg["win_prob"] > 0.9).all()
    assert (reg["diff_lo"] > 0).all()
    assert list(reg["axes"]) == ["size", "size"]
    assert "smaller model" in reg["detail"].iloc[0] and "larger model" in reg["detail"].iloc[1]
    changes = regime_changes(reg, runs)
    assert len(changes) == 1
    ch = changes.iloc[0]
    assert (ch["from_budget"], ch["to_budget"]) == (1e14, 1e16)
    assert ch["axes"] == "size" and ch["decisive"] and "larger model" in ch["detail"]
    # without runs the key is parsed back: still the size axis
    assert regime_changes(reg)["axes"].iloc[0] == "size"


def test_no_change_when_one_allocation_wins_everywhere():
    best = dataclasses.replace(MEDIUM, a=0.9, c_mid=3e13)
    runs, evals = make_study([SMALL, best], budgets=[1e14, 1e15, 1e16], n_problems=300, rng=2)
    reg = regimes(evals, runs, "greedy", n_boot=200, rng=0)
    assert set(reg["winner"]) == {best.key}
    assert regime_changes(reg).empty


def test_tie_when_allocations_are_the_same_in_truth():
    twin = dataclasses.replace(MEDIUM, learning_rate=2e-5)  # same curve, different lr
    runs, evals = make_study([MEDIUM, twin], budgets=[1e15], n_problems=300, rng=3)
    reg = regimes(evals, runs, "greedy", n_boot=300, rng=0)
    row = reg.iloc[0]
    assert row["tie"] and not row["decisive"]
    assert row["diff_lo"] <= 0 <= row["diff_hi"]
    assert 0.2 < row["win_prob"] < 0.95
    assert row["axes"] == "learning"


def test_baseline_comparison():
    runs, evals = make_study([SMALL, MEDIUM, LARGE], budgets=[1e16], n_problems=0, rng=4)
    reg = regimes(evals, runs, "greedy", baseline=SMALL.key, n_boot=50, rng=0)
    assert reg["compared_to"].iloc[0] == SMALL.key


def test_axes_between_names_each_axis():
    w = dict(model="a", model_params=2e6, num_generations=16, prompts_per_step=8, num_iterations=1,
             learning_rate=1e-5, reward="prm:prm-l")
    assert axes_between(w, dict(w, num_generations=8))[0] == ["search"]
    assert axes_between(w, dict(w, learning_rate=3e-5))[0] == ["learning"]
    assert axes_between(w, dict(w, reward="prm:prm-s"))[0] == ["feedback"]
    axes, detail = axes_between(w, dict(w, model="b", model_params=1e6, num_iterations=2))
    assert axes == ["learning", "size"] and "larger model" in detail
    assert axes_between(w, w) == ([], "")
    axes, detail = axes_between(dict(w, lora_r=8), dict(w, lora_r=16))
    assert axes == ["other"] and detail == "other: lora_r 8 vs 16"


def test_regime_changes_parse_keys_with_optional_columns():
    """Without a runs table, regime_changes reads the allocation back from its key,
    including the optional columns a grid's extra axes add."""
    reg = pd.DataFrame([
        dict(condition="rule", budget=1e14, winner="m|G=8|P=4|it=1|lr=0.0001|rule|lora_r=8", decisive=True),
        dict(condition="rule", budget=1e15, winner="m|G=8|P=4|it=1|lr=0.0001|rule|lora_r=16", decisive=True),
    ])
    ch = regime_changes(reg)
    assert ch["axes"].iloc[0] == "other" and "lora_r 16 vs 8" in ch["detail"].iloc[0]


def test_pairwise_decision_accuracy_by_hand():
    large = pd.Series({"a": 3.0, "b": 2.0, "c": 1.0})
    assert pairwise_decision_accuracy(large, large) == (1.0, 3)
    assert pairwise_decision_accuracy(-large, large) == (0.0, 3)
    # order a > c > b at small: (a,b) right, (a,c) right, (b,c) wrong -> 2/3
    acc, n = pairwise_decision_accuracy(pd.Series({"a": 3.0, "b": 1.0, "c": 2.0}), large)
    assert (acc, n) == (pytest.approx(2 / 3), 3)


def _ranked(a_values_by_budget):
    """Four allocations (different G) whose flat scores per budget are planted."""
    allocs = [Alloc("m", 4e6, 0, 0.5, 1, 1e14, num_generations=g) for g in (2, 4, 8, 16)]

    def truth(al, budget, flops):
        i = [2, 4, 8, 16].index(al.num_generations)
        return np.full_like(flops, a_values_by_budget[budget][i])

    return make_study(allocs, budgets=sorted(a_values_by_budget), n_problems=0, seed_sd=0.0,
                      truth_override=truth)


def test_rank_stability_tau_and_pda():
    stable = {1e14: [0.1, 0.2, 0.3, 0.4], 1e15: [0.2, 0.3, 0.4, 0.5], 1e16: [0.3, 0.4, 0.5, 0.6]}
    runs, evals = _ranked(stable)
    rs = rank_stability(evals, runs, "greedy")
    assert list(rs["budget"]) == [1e14, 1e15]
    assert (rs["kendall_tau"] == 1.0).all() and (rs["pda_vs_largest"] == 1.0).all()
    assert (rs["n_pairs"] == 6).all()
    flipped = {**stable, 1e16: [0.6, 0.5, 0.4, 0.3]}
    runs, evals = _ranked(flipped)
    rs = rank_stability(evals, runs, "greedy")
    assert rs["kendall_tau"].tolist() == [1.0, -1.0]
    assert rs["pda_vs_largest"].tolist() == [0.0, 0.0]
