import dataclasses

import numpy as np
import pandas as pd
import pytest

from race.analysis import overoptimisation, random_control, waste_table

from analysis_synth import MEDIUM, Alloc, make_study


def test_waste_table_arithmetic():
    wasteful = dataclasses.replace(MEDIUM, num_generations=4, zero_var_frac=0.5, trunc_rate=0.2)
    runs, _ = make_study([MEDIUM, wasteful], budgets=[1e15], n_problems=0)
    wt = waste_table(runs)
    row = wt[wt["allocation"] == wasteful.key].iloc[0]
    assert row["n_runs"] == 3
    assert row["zero_var_frac"] == pytest.approx(0.5) and row["trunc_rate"] == pytest.approx(0.2)
    # wasted = 0.5 x rollout (0.7 x 1e15) = 3.5e14, i.e. 35% of the total
    assert row["wasted_rollout_flops"] == pytest.approx(3.5e14)
    assert row["wasted_share"] == pytest.approx(0.35)
    assert row["rollout_share"] + row["learning_share"] + row["feedback_share"] == pytest.approx(1.0)
    with pytest.raises(Exception, match="trunc_rate"):
        waste_table(runs.drop(columns=["trunc_rate"]))


def _overopt_tables():
    runs, _ = make_study([dataclasses.replace(MEDIUM, reward="prm:prm-s"), MEDIUM], budgets=[1e15],
                         seeds=(0,), n_problems=0)
    prm_id, rule_id = runs["run_id"]
    x = np.linspace(0.1, 1.0, 10) * 1e15
    train = pd.concat([
        pd.DataFrame({"run_id": prm_id, "step": range(10), "flops": x, "reward_mean": np.linspace(0.3, 0.9, 10)}),
        pd.DataFrame({"run_id": rule_id, "step": range(10), "flops": x, "reward_mean": np.linspace(0.3, 0.6, 10)}),
    ])
    evals = pd.concat([
        pd.DataFrame({"run_id": prm_id, "step": range(10), "flops": x, "target": "greedy",
                      "score": np.linspace(0.5, 0.3, 10), "n": 100}),
        pd.DataFrame({"run_id": rule_id, "step": range(10), "flops": x, "target": "greedy",
                      "score": np.linspace(0.5, 0.6, 10), "n": 100}),
    ])
    return runs, train, evals, prm_id, rule_id


def test_overoptimisation_flags_proxy_up_verified_down():
    runs, train, evals, prm_id, rule_id = _overopt_tables()
    oo = overoptimisation(runs, train, evals).set_index("run_id")
    assert oo.loc[prm_id, "overoptimised"] and not oo.loc[rule_id, "overoptimised"]
    # slope over the run fraction x = flops / max: verified 0.5 -> 0.3 over x 0.1 -> 1.0
    assert oo.loc[prm_id, "verified_slope"] == pytest.approx(-0.2 / 0.9)
    assert oo.loc[prm_id, "proxy_slope"] == pytest.approx(0.6 / 0.9)
    assert oo.loc[prm_id, "source"] == "tables"
    # a high threshold silences the flag
    assert not overoptimisation(runs, train, evals, threshold=0.5)["overoptimised"].any()


def test_overoptimisation_uses_trend_columns_when_present():
    runs, _, _, prm_id, rule_id = _overopt_tables()
    runs["proxy_reward_trend"] = [0.1, 0.1]
    runs["verified_trend"] = [-0.05, 0.01]
    oo = overoptimisation(runs).set_index("run_id")
    assert oo.loc[prm_id, "overoptimised"] and oo.loc[prm_id, "source"] == "runs"
    assert not oo.loc[rule_id, "overoptimised"]


def test_random_control_separates_real_from_false_gains():
    control = dataclasses.replace(MEDIUM, reward="random", a=0.30)
    real = dataclasses.replace(MEDIUM, a=0.60)
    fake = dataclasses.replace(MEDIUM, num_generations=4, a=0.30)  # no better than random
    runs, evals = make_study([control, real, fake], budgets=[1e15], n_problems=400, rng=9)
    rc = random_control(evals, runs, "greedy", n_boot=300, rng=0).set_index("allocation")
    assert rc.loc[real.key, "beats_control"] and rc.loc[real.key, "lo"] > 0
    assert not rc.loc[fake.key, "beats_control"]
    assert rc.loc[real.key, "control"] == "random@m"
    assert rc["beats_control"].any()


def test_random_control_falls_back_to_pooled_and_handles_absence():
    control = Alloc("other", 1e6, 0.05, 0.2, 1.0, 1e14, reward="random")
    real = dataclasses.replace(MEDIUM, a=0.6)
    runs, evals = make_study([control, real], budgets=[1e15], n_problems=0, rng=1)
    rc = random_control(evals, runs, "greedy", n_boot=50, rng=0)
    assert list(rc["control"]) == ["random@all"] and rc["beats_control"].all()
    runs2, evals2 = make_study([real], budgets=[1e15], n_problems=0)
    assert random_control(evals2, runs2, "greedy").empty
