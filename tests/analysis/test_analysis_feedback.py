"""The proxy-vs-verified divergence point (race.analysis.feedback): a series that turns at
a known step is found there, noise and joint rises are not called divergence, and the
per-arm table takes each seed's longest run and names the budgets past the point."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from race.analysis import divergence_point, divergence_table

FLOPS_PER_STEP = 2e9


def _series(n=80, turn=40, noise=0.03, seed=0, proxy_rise=0.4, verified_fall=0.3):
    """Proxy rising throughout; verified rising to ``turn`` then falling by ``verified_fall``."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, n + 1)
    proxy = 0.3 + proxy_rise * steps / n + rng.normal(0, noise, n)
    up = 0.3 + 0.1 * np.minimum(steps, turn) / turn
    verified = up - verified_fall * np.maximum(steps - turn, 0) / (n - turn) + rng.normal(0, noise, n)
    return steps, steps * FLOPS_PER_STEP, proxy, verified


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_turn_is_found_near_where_it_is(seed):
    steps, flops, proxy, verified = _series(seed=seed)
    res = divergence_point(steps, flops, proxy, verified)
    assert res["diverged"]
    # the smoothed verified score peaks at the turn; noise of 0.03 moves the peak a few steps
    assert 32 <= res["step"] <= 48
    assert res["flops"] == res["step"] * FLOPS_PER_STEP
    assert res["proxy_change"] >= 0.05 and res["verified_change"] <= -0.05
    assert res["proxy_z"] >= 2 and res["verified_z"] <= -2
    assert "from step" in res["reason"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noise_alone_is_no_divergence(seed):
    rng = np.random.default_rng(seed)
    steps = np.arange(1, 81)
    res = divergence_point(steps, steps * FLOPS_PER_STEP, 0.5 + rng.normal(0, 0.1, 80), 0.4 + rng.normal(0, 0.1, 80))
    assert not res["diverged"] and res["step"] is None and res["flops"] is None
    assert res["reason"].startswith("no divergence within the run")


def test_both_rising_or_a_falling_proxy_is_no_divergence():
    steps, flops, proxy, _ = _series()
    assert not divergence_point(steps, flops, proxy, proxy - 0.1)["diverged"]  # verified rises with the proxy
    _, _, _, verified = _series()
    assert not divergence_point(steps, flops, 1 - proxy, verified)["diverged"]  # proxy falls too


def test_a_fall_smaller_than_min_change_is_not_called():
    steps, flops, proxy, verified = _series(noise=0.0, verified_fall=0.03)
    assert not divergence_point(steps, flops, proxy, verified)["diverged"]
    assert divergence_point(steps, flops, proxy, verified, min_change=0.02)["diverged"]


def test_too_few_steps_give_no_verdict():
    res = divergence_point([1, 2, 3], [1.0, 2.0, 3.0], [0.1, 0.2, 0.3], [0.3, 0.2, 0.1])
    assert not res["diverged"] and "too few training steps" in res["reason"]


def _study():
    """One PRM arm (2 seeds x budgets 1e11 / 2e11) and one rule arm; the longer runs turn at step 40."""
    runs, train = [], []
    for reward in ("prm:prm-s:min+outcome", "rule:outcome"):
        for seed in (0, 1):
            for budget, n in ((1e11, 30), (2e11, 80)):
                rid = f"{reward[:3]}-{seed}-{n}"
                runs.append(dict(run_id=rid, budget=budget, model="tiny-s", model_params=301200, num_generations=8,
                                 prompts_per_step=4, num_iterations=1, learning_rate=1e-4, reward=reward, seed=seed,
                                 status="complete", total_flops=n * FLOPS_PER_STEP))
                steps, flops, proxy, verified = _series(n=80, seed=seed)
                train.append(pd.DataFrame(dict(run_id=rid, step=steps[:n], flops=flops[:n], rm_score_mean=proxy[:n],
                                               reward_mean=proxy[:n], verified_mean=verified[:n])))
    return pd.DataFrame(runs), pd.concat(train, ignore_index=True)


def test_the_table_reads_each_seeds_longest_run_of_each_learned_arm():
    runs, train = _study()
    table = divergence_table(runs, train)
    assert len(table) == 1  # the rule arm has no proxy to diverge from
    row = table.iloc[0]
    assert row["reward"] == "prm:prm-s:min+outcome" and row["proxy"] == "rm_score_mean"
    assert sorted(row["run_ids"]) == ["prm-0-80", "prm-1-80"] and row["n_seeds"] == 2
    assert row["diverged"] and 32 <= row["step"] <= 48
    assert row["seeds_diverged"] == sum(v["diverged"] for v in row["per_seed"].values())
    assert row["budgets_past"] == [1e11, 2e11]  # both budgets spend more than the ~8e10 FLOPs of the point
    # the seed-mean verdict is divergence_point on the mean series
    t = train[train["run_id"].isin(row["run_ids"])].groupby("step")[["flops", "rm_score_mean", "verified_mean"]].mean()
    direct = divergence_point(t.index, t["flops"], t["rm_score_mean"], t["verified_mean"])
    assert direct["step"] == row["step"] and direct["flops"] == row["flops"]


def test_the_training_reward_is_the_proxy_without_an_rm_score():
    runs, train = _study()
    table = divergence_table(runs, train.drop(columns=["rm_score_mean"]))
    assert table.iloc[0]["proxy"] == "reward_mean" and table.iloc[0]["diverged"]


def _arms_study(n_problems=400, extra=None):
    """tiny-s at one budget, 2 seeds: rule:outcome and prm-s score 0.5 on the same problems,
    prm-m 0.7 (a superset of them), rule:partial 0.9."""
    from race.analysis import feedback_comparisons  # noqa: F401 (import checked here)

    solved = {"rule:outcome": 200, "prm:prm-s:min+outcome": 200, "prm:prm-m:min+outcome": 280, "rule:partial": 360,
              **(extra or {})}
    runs, evals = [], []
    for reward, k in solved.items():
        for seed in (0, 1):
            rid = f"{reward}-{seed}"
            runs.append(dict(run_id=rid, budget=1e11, model="tiny-s", model_params=301200, num_generations=8,
                             prompts_per_step=4, num_iterations=1, learning_rate=1e-4, reward=reward, seed=seed,
                             status="complete", total_flops=1e11))
            for step, flops, n_ok in ((0, 0.0, 150), (50, 1e11, k)):
                pp = [1] * n_ok + [0] * (n_problems - n_ok)
                evals.append(dict(run_id=rid, step=step, flops=flops, target="greedy", score=n_ok / n_problems,
                                  n=n_problems, per_problem=pp))
    return pd.DataFrame(runs), pd.DataFrame(evals)


def test_feedback_comparisons_call_wins_ties_and_losses_with_paired_intervals():
    from race.analysis import feedback_comparisons

    runs, evals = _arms_study()
    strength = {"prm:prm-s:min+outcome": 0.75, "prm:prm-m:min+outcome": 0.93}
    comp = feedback_comparisons(evals, runs, "greedy", strength, n_boot=300, rng=0)
    got = {(r.kind, r.a, r.b): r for r in comp.itertuples()}
    assert set(got) == {
        ("stronger RM", "prm:prm-m:min+outcome", "prm:prm-s:min+outcome"),
        ("RM vs its rule", "prm:prm-m:min+outcome", "rule:outcome"),
        ("RM vs its rule", "prm:prm-s:min+outcome", "rule:outcome"),
        ("RM vs rule:partial", "prm:prm-m:min+outcome", "rule:partial"),
        ("RM vs rule:partial", "prm:prm-s:min+outcome", "rule:partial"),
    }
    stronger = got[("stronger RM", "prm:prm-m:min+outcome", "prm:prm-s:min+outcome")]
    assert stronger.diff == pytest.approx(0.2) and stronger.verdict == "won" and stronger.lo > 0
    # the same problems solved: every paired replicate differs by exactly 0 -> a tie at 0
    same = got[("RM vs its rule", "prm:prm-s:min+outcome", "rule:outcome")]
    assert same.diff == 0 and same.lo == same.hi == 0 and same.verdict == "tied"
    assert got[("RM vs rule:partial", "prm:prm-m:min+outcome", "rule:partial")].verdict == "lost"
    assert set(comp["budget"]) == {1e11} and set(comp["group"]) == {"tiny-s|G=8|P=4|it=1|lr=0.0001|*"}


def test_feedback_comparisons_without_strengths_compare_only_against_rules():
    from race.analysis import feedback_comparisons

    runs, evals = _arms_study()
    comp = feedback_comparisons(evals, runs, "greedy", {}, n_boot=50)
    assert "stronger RM" not in set(comp["kind"]) and len(comp) == 4
    only_rules = runs[runs["reward"].str.startswith("rule")]
    assert feedback_comparisons(evals[evals["run_id"].isin(only_rules["run_id"])], only_rules, "greedy", {}).empty


def test_feedback_comparisons_read_the_typed_reward_columns():
    """The random control is left out, an ORM without rule terms and a PRM mixing in a rule
    no arm runs alone meet only rule:partial; the columns are read as the table gives them."""
    from race.analysis import feedback_comparisons
    from race.analysis.tables import prepare_runs

    runs, evals = _arms_study(extra={"random": 150, "orm:orm-s": 220, "prm:prm-s:min+outcome+format": 240})
    comp = feedback_comparisons(evals, runs, "greedy", {}, n_boot=50)
    pairs = {(r.kind, r.a, r.b) for r in comp.itertuples()}
    assert not any("random" in (a, b) for _, a, b in pairs)
    assert {p for p in pairs if p[1] in ("orm:orm-s", "prm:prm-s:min+outcome+format")} == {
        ("RM vs rule:partial", "orm:orm-s", "rule:partial"),
        ("RM vs rule:partial", "prm:prm-s:min+outcome+format", "rule:partial")}
    # a table whose reward_rule says the ORM mixes in rule:outcome: the comparison follows the column
    typed = prepare_runs(runs, include_failed=True)
    typed.loc[typed["reward"] == "orm:orm-s", "reward_rule"] = "rule:outcome"
    comp = feedback_comparisons(evals, typed.drop(columns="allocation"), "greedy", {}, n_boot=50)
    assert ("RM vs its rule", "orm:orm-s", "rule:outcome") in {(r.kind, r.a, r.b) for r in comp.itertuples()}
