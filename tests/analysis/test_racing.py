"""The racing protocol's decisions (race.analysis.racing) on racing studies of known worlds
(race.analysis.synthetic_race): who goes on at each rung, from the runs up to the rung only, a
pure function of the tables and the seed, within the compute cap."""

import json

import numpy as np
import pytest

from race.analysis.racing import RacingRule, RungDecision, race_pick, rung_decision, spent_flops
from race.analysis.synthetic import Curve, World
from race.analysis.synthetic_race import RaceDesign, race_tables, simulate_race
from race.analysis.tables import allocation_key

T = 4e12
DESIGN = RaceDesign()  # rungs T/32, T/8, T/3; rung 0 read at T/128 and T/64 too
RUNGS = DESIGN.budgets(World(name="x", models={}, allocations=[], budgets=[1.0], seeds=[0], target_budget=T))


def _world(seed: int = 7) -> World:
    """small G=4 and G=8 learn fast and saturate, large G=8 learns late and passes them near T,
    large G=4 learns nothing and stays far below; 3 seeds."""
    curves = {("small", 4): Curve("sigmoid", 0.3, 0.35, 4e10, 1.5), ("small", 8): Curve("sigmoid", 0.3, 0.33, 5e10, 1.5),
              ("large", 4): Curve("flat", 0.12, 0.0, 1e11), ("large", 8): Curve("sigmoid", 0.35, 0.55, 6e11, 1.2)}
    allocs = [{"model": m, "num_generations": g, "curve": c} for (m, g), c in curves.items()]
    return World(name="race-test", models={"small": 1e5, "large": 4e5}, allocations=allocs,
                 budgets=[T / 100, T / 30, T / 10], seeds=[0, 1, 2], target_budget=T, n_problems=500, seed_sd=0.05,
                 seed=seed)


@pytest.fixture(scope="module")
def raced():
    return simulate_race(_world(), DESIGN, RacingRule())


def key(runs, model, g):
    k = allocation_key(runs)
    return k[(runs["model"] == model) & (runs["num_generations"] == g)].iloc[0]


def test_rungs_keep_who_may_win_and_stop_the_hopeless(raced):
    runs, evals = raced["runs"], raced["evals"]
    flat, riser = key(runs, "large", 4), key(runs, "large", 8)
    for j, dd in enumerate(raced["decisions"]):
        d = RungDecision(**{**dd, "go_on": tuple(dd["go_on"])})
        assert (d.rung, d.budget, d.next_budget, d.target_budget) == (j, RUNGS[j], RUNGS[j + 1], T)
        assert d.go_on[0] == d.leader
        rows = {r["allocation"]: r for r in d.rows}
        assert set(d.go_on) | set(d.stopped) == set(rows)
        for a in d.go_on[1:]:  # each one that goes on may still beat the leader at T
            assert rows[a]["p_beats_leader"] >= RacingRule().p_keep
        for a, why in d.stopped.items():  # each one that stops will not win, or the cap has no room for it
            assert rows[a]["p_beats_leader"] < RacingRule().p_keep or "compute cap" in why
        for r in d.rows:
            assert r["observed_lo"] <= r["observed"] <= r["observed_hi"]
            assert r["forecast_lo"] <= r["forecast"] <= r["forecast_hi"]
        assert json.loads(json.dumps(d.as_dict()))["rule"] == RacingRule().as_dict()
    # the non-learner never reaches the last rung; the late riser, behind at the first rung, is not cut there
    assert flat not in raced["decisions"][-1]["go_on"]
    first = {r["allocation"]: r["observed"] for r in raced["decisions"][0]["rows"]}
    assert sorted(first, key=first.get, reverse=True).index(riser) >= 1 and riser in raced["decisions"][0]["go_on"]


def test_decisions_are_a_pure_function_of_the_store(raced):
    """A study killed after the last rung and resumed from its store makes every rung's decision
    again, identically: the store then holds later rungs' runs, and each rung's run has become a
    prefix (another run id) of the run that extended it."""
    runs, evals = raced["runs"], raced["evals"]
    for j, before in enumerate(raced["decisions"]):
        again = rung_decision(runs, evals, target_budget=T, rung_budgets=RUNGS, rung=j, rule=RacingRule())
        assert again.as_dict() == before
    shuffled = runs.sample(frac=1.0, random_state=0)
    again = rung_decision(shuffled, evals.sample(frac=1.0, random_state=1), target_budget=T, rung_budgets=RUNGS, rung=0)
    assert again.as_dict() == raced["decisions"][0]


def test_later_rungs_see_only_who_went_on_and_the_pick_is_among_them(raced):
    runs, evals = raced["runs"], raced["evals"]
    alive = [set(a) for a in raced["alive"]]
    assert alive[0] >= alive[1] >= alive[2] and len(alive[0]) == 4
    d1 = raced["decisions"][1]
    assert {r["allocation"] for r in d1["rows"]} == set(raced["decisions"][0]["go_on"])
    last = rung_decision(runs, evals, target_budget=T, rung_budgets=RUNGS, rung=2)
    assert last.next_budget is None and last.go_on == (last.leader,)
    pick = raced["pick"]
    assert pick.allocation == last.leader and pick.allocation in d1["go_on"]
    assert pick.largest_pilot_budget == pytest.approx(RUNGS[2], rel=1e-12)
    assert set(pick.predictions["allocation"]) == set(d1["go_on"])
    assert pick.win_probability <= pick.p_near_best <= 1.0 and pick.calibration


def test_the_compute_cap_holds_in_every_world():
    """Not reused by the target run (every pilot FLOP but the chosen allocation's continued run)
    stays within max_unreused x T whatever the rule lets go on; a cap with no room keeps the leader alone."""
    from race.analysis.synthetic import random_world

    # 5126: 3 seeds, one allocation stopped at rung 0, three alive at rung 1; counting only the live
    # allocations' compute there let all three go on to T/3 (0.948 T not reused, on 56c47ea)
    for s in (1001, 1003, 1004, 5126):
        w = random_world(s)
        out = simulate_race(w, DESIGN, RacingRule(max_unreused=0.9))
        assert out["pilot_T"] - out["reused_T"] <= 0.9 + 1e-9
    out = simulate_race(_world(), DESIGN, RacingRule(max_unreused=0.4))
    assert [len(a) for a in out["alive"]] == [4, 1, 1]
    assert "compute cap" in " ".join(out["decisions"][0]["stopped"].values())


def test_spent_flops_counts_a_continued_run_once(raced):
    runs = raced["runs"]
    alive = raced["alive"]
    seeds = 3
    want = (4 * seeds * RUNGS[0] + len(alive[1]) * (RUNGS[1] - RUNGS[0]) + len(alive[2]) * (RUNGS[2] - RUNGS[1]))
    assert spent_flops(runs, RUNGS[2]) == pytest.approx(want, rel=1e-12)
    assert raced["pilot_flops"] == pytest.approx(want, rel=1e-12)
    assert spent_flops(runs, RUNGS[0]) == pytest.approx(4 * seeds * RUNGS[0], rel=1e-12)


def test_bad_arguments_say_what_to_change(raced):
    runs, evals = raced["runs"], raced["evals"]
    with pytest.raises(ValueError, match="increasing"):
        rung_decision(runs, evals, target_budget=T, rung_budgets=[T / 8, T / 32], rung=0)
    with pytest.raises(ValueError, match="rung must be in 0..2"):
        rung_decision(runs, evals, target_budget=T, rung_budgets=RUNGS, rung=3)
    with pytest.raises(ValueError, match="beyond the target"):
        race_pick(runs, evals, target_budget=T / 10, rung_budgets=RUNGS)
    with pytest.raises(ValueError, match="has not run yet"):
        rung_decision(runs, evals, target_budget=T, rung_budgets=[T / 1000, T / 900], rung=0)
    for bad in ({"level": 1.5}, {"p_keep": 1.0}, {"max_unreused": -1.0}, {"later_seeds": 0}):
        with pytest.raises(ValueError, match="RacingRule"):
            RacingRule(**bad)


def test_a_continued_run_reads_as_the_shorter_run_did():
    """race_tables: a run continued to a later rung keeps the earlier rung's readings exactly (the
    store's prefix rows), and the nested readings on the first rung are prefixes too."""
    w = _world()
    first = {(k, s): 0 for k in range(4) for s in range(3)}
    later = {**first, (0, 0): 2}
    r0, e0 = race_tables(w, DESIGN, first)
    r2, e2 = race_tables(w, DESIGN, later)
    short = e0[e0["run_id"] == "small-G4-s0"].sort_values("step")
    as_prefix = e2[e2["run_id"] == "small-G4-s0.r0"].sort_values("step")
    assert np.array_equal(short["flops"].to_numpy(), as_prefix["flops"].to_numpy())
    assert np.array_equal(np.vstack(short["per_problem"].tolist()), np.vstack(as_prefix["per_problem"].tolist()))
    long = r2[r2["run_id"] == "small-G4-s0"].iloc[0]
    assert long["budget"] == pytest.approx(RUNGS[2]) and not isinstance(long["prefix_of"], str)
    assert sorted(r2.loc[r2["prefix_of"] == "small-G4-s0", "budget"]) == pytest.approx(
        [RUNGS[0] / 4, RUNGS[0] / 2, RUNGS[0], RUNGS[1]], rel=1e-12)
