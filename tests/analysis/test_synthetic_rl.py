"""The test generator of known worlds (race.analysis.synthetic_rl): what it promises is in it."""

import numpy as np
import pytest

from race.analysis.synthetic import world_tables
from race.analysis.synthetic_rl import CROSSOVERS, RLWorld, crossover_class, rl_mean, rl_world, shape_value


@pytest.fixture(scope="module")
def worlds():
    return [rl_world(s) for s in range(300)]


def test_null_share_and_crossover_classes(worlds):
    null = sum(w.tags["flat"] for w in worlds)
    # 15% null: binomial(300, 0.15) has mean 45, sd 6.2; +-4 sd
    assert 20 <= null <= 70
    learning = [w for w in worlds if not w.tags["flat"]]
    for w in learning:
        assert w.tags["crossover"] == crossover_class(w)
    counts = {c: sum(w.tags["crossover"] == c for w in learning) for c in CROSSOVERS}
    assert all(v >= 20 for v in counts.values()), counts  # every class drawn (about a quarter each)
    for w in worlds:
        if w.tags["flat"]:
            assert all(a["spec"]["gain"] == 0 and a["spec"]["jump"] == 0 and a["spec"]["bonus"] == 0
                       for a in w.allocations)


def test_ranges_the_issue_asks_for(worlds):
    sd = np.array([w.tags["seed_sd_points"] for w in worlds])
    assert sd.max() <= 6.0 and sd.max() > 5.0 and sd.min() >= 0.5
    n = np.array([w.n_problems for w in worlds])
    assert n.min() >= 200 and n.max() <= 1000
    assert {len(w.seeds) for w in worlds} == {2, 3}
    assert any(w.collapse_p > 0 for w in worlds) and any(w.tags["decline"] for w in worlds)
    assert any(w.tags["jump"] > 0.05 for w in worlds) and any(w.tags["bonus"] > 0 for w in worlds)


def test_jump_bonus_and_decline_formulas():
    spec = {"shape": "sigmoid", "r0": 0.2, "gain": 0.4, "c": 1e12, "s": 1.0, "jump": 0.07, "bonus": 0.02,
            "decline": 0.03, "c_dec": 1e13}
    tiny = 1e3  # g(1e-9) ~ 1e-9: only the jump is left
    assert rl_mean(spec, 0.0) == pytest.approx(0.2)
    assert rl_mean(spec, tiny) == pytest.approx(0.27, abs=1e-6)  # step 0 is off the curve by the jump
    assert rl_mean(spec, 1e12, end_of_run=True) - rl_mean(spec, 1e12) == pytest.approx(0.02)
    # past c_dec the score falls by decline * ln(C / c_dec)
    no_dec = dict(spec, decline=0.0)
    assert rl_mean(no_dec, 1e14) - rl_mean(spec, 1e14) == pytest.approx(0.03 * np.log(10), rel=1e-9)
    assert shape_value("logsat", np.array([np.e**4 - 1]), 1.0)[0] == pytest.approx(1.0)


def test_outcomes_deterministic_and_seed_spread_grows():
    w = next(w for w in (rl_world(s) for s in range(200)) if w.seed_growth > 0.3 and not w.tags["flat"])
    assert w.seed_sd_at(w.budgets[0]) < w.seed_sd_at(w.budgets[-1])
    a = w.run_outcomes(0, w.budgets[-1], 1)
    b = w.run_outcomes(0, w.budgets[-1], 1)
    assert all(np.array_equal(x[1], y[1]) and x[0] == y[0] for x, y in zip(a, b))
    # the base model (step 0) is the same for every seed and budget of a model; later points are not
    c = w.run_outcomes(0, w.budgets[0], 0)
    assert np.array_equal(a[0][1], c[0][1]) and not np.array_equal(a[-1][1], c[-1][1])
    runs, evals = world_tables(w)
    assert len(runs) == 4 * 3 * len(w.seeds) and (evals["n"] == w.n_problems).all()
    assert RLWorld.from_dict(w.to_dict()).truth(2) == w.truth(2)
