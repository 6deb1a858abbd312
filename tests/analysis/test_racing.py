"""The racing protocol's decisions (race.analysis.racing): who goes on at each rung, from the
runs at budgets up to the rung's only, a pure function of the tables and the seed."""

import json

import numpy as np
import pandas as pd
import pytest

from race.analysis.racing import RacingRule, RungDecision, race_pick, rung_decision
from race.analysis.synthetic import Curve, World, world_tables
from race.analysis.tables import allocation_key

T = 4e12


def _world() -> World:
    """Nested pilots at T/32, T/8, T/3 (the rungs), 2 seeds: small G=4 and G=8 learn fast, large
    G=8 learns late and passes them near T, large G=4 learns nothing and stays far below."""
    curves = {("small", 4): Curve("sigmoid", 0.3, 0.35, 4e10, 1.5), ("small", 8): Curve("sigmoid", 0.3, 0.33, 5e10, 1.5),
              ("large", 4): Curve("flat", 0.15, 0.0, 1e11), ("large", 8): Curve("sigmoid", 0.35, 0.55, 6e11, 1.2)}
    allocs = [{"model": m, "num_generations": g, "curve": c} for (m, g), c in curves.items()]
    return World(name="race-test", models={"small": 1e5, "large": 4e5}, allocations=allocs,
                 budgets=[T / 32, T / 8, T / 3], seeds=[0, 1], target_budget=T, n_problems=500, seed_sd=0.05, seed=7)


@pytest.fixture(scope="module")
def tables():
    return world_tables(_world(), design="nested")


RUNGS = [T / 32, T / 8, T / 3]


def key(runs, model, g):
    k = allocation_key(runs)
    return k[(runs["model"] == model) & (runs["num_generations"] == g)].iloc[0]


def test_rung_decision_keeps_who_may_win_and_stops_the_hopeless(tables):
    runs, evals = tables
    d = rung_decision(runs, evals, target_budget=T, rung_budgets=RUNGS, rung=0, seed=3)
    assert isinstance(d, RungDecision)
    assert (d.rung, d.budget, d.next_budget, d.target_budget) == (0, RUNGS[0], RUNGS[1], T)
    flat = key(runs, "large", 4)
    assert flat in d.stopped and flat not in d.go_on and "below the leader's lower end" in d.stopped[flat]
    assert d.go_on[0] == d.leader and len(d.go_on) >= 1
    assert set(d.go_on) | set(d.stopped) == set(allocation_key(runs))
    rows = {r["allocation"]: r for r in d.rows}
    lead = rows[d.leader]
    for a in d.go_on[1:]:  # each one that goes on may still beat the leader at T
        assert rows[a]["forecast_hi"] >= lead["forecast_lo"]
    for a in d.stopped:
        assert rows[a]["forecast_hi"] < lead["forecast_lo"] and rows[a]["decision"] == "stop"
    for r in d.rows:
        assert r["observed_lo"] <= r["observed"] <= r["observed_hi"]
        assert r["forecast_lo"] <= r["forecast"] <= r["forecast_hi"]
    d2 = json.loads(json.dumps(d.as_dict()))  # the driver stores it in SQLite
    assert d2["go_on"] == list(d.go_on) and d2["rule"] == RacingRule().as_dict()


def test_rung_decision_reads_only_the_rung_and_is_pure(tables):
    """A resumed study whose store already holds later rungs' runs decides rung 0 as before."""
    runs, evals = tables
    early = runs[runs["budget"] <= RUNGS[0] * (1 + 1e-9)]
    a = rung_decision(runs, evals, target_budget=T, rung_budgets=RUNGS, rung=0, seed=3)
    b = rung_decision(early, evals[evals["run_id"].isin(early["run_id"])], target_budget=T, rung_budgets=RUNGS,
                      rung=0, seed=3)
    assert a.as_dict() == b.as_dict()
    shuffled = runs.sample(frac=1.0, random_state=0)
    assert rung_decision(shuffled, evals, target_budget=T, rung_budgets=RUNGS, rung=0, seed=3).as_dict() == a.as_dict()


def test_later_rungs_see_only_who_went_on(tables):
    runs, evals = tables
    gone = key(runs, "large", 4)
    stay = ~((allocation_key(runs) == gone) & (runs["budget"] > RUNGS[0] * 1.001))
    r1 = runs[stay]
    d = rung_decision(r1, evals, target_budget=T, rung_budgets=RUNGS, rung=1, seed=0)
    assert gone not in {r["allocation"] for r in d.rows} and gone not in d.go_on and gone not in d.stopped
    last = rung_decision(r1, evals, target_budget=T, rung_budgets=RUNGS, rung=2, seed=0)
    assert last.next_budget is None and last.go_on == (last.leader,)
    pick = race_pick(r1, evals, target_budget=T, rung_budgets=RUNGS, seed=0)
    assert pick.allocation == last.leader and gone not in set(pick.predictions["allocation"])
    assert pick.largest_pilot_budget == pytest.approx(RUNGS[2], rel=1e-12)


def test_bad_arguments_say_what_to_change(tables):
    runs, evals = tables
    with pytest.raises(ValueError, match="increasing"):
        rung_decision(runs, evals, target_budget=T, rung_budgets=[T / 8, T / 32], rung=0)
    with pytest.raises(ValueError, match="rung must be in 0..2"):
        rung_decision(runs, evals, target_budget=T, rung_budgets=RUNGS, rung=3)
    with pytest.raises(ValueError, match="beyond the target"):
        race_pick(runs, evals, target_budget=T / 10, rung_budgets=RUNGS)
    with pytest.raises(ValueError, match="has not run yet"):
        rung_decision(runs, evals, target_budget=T, rung_budgets=[T / 64, T / 32], rung=0)
    with pytest.raises(ValueError, match="level"):
        RacingRule(level=1.5)
