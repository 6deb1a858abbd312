"""The racing protocol's decisions (race.analysis.racing) on racing studies of known worlds
(race.analysis.synthetic_race): who goes on at each rung (the schedule's keep counts, ranked by
observed score, the step floor), from the runs up to the rung only, a pure function of the tables
and the seed, within the compute cap; the pick's odds over every allocation."""

import json

import numpy as np
import pytest

from race.analysis.racing import RacingRule, RungDecision, rule_from, rung_decision, spent_flops
from race.analysis.synthetic import Curve, World
from race.analysis.synthetic_race import RaceDesign, WorldSource, race_tables, simulate_race

T = 4e12
DESIGN = RaceDesign(rungs=None, first_seeds=3)  # the rule's schedule for 4 allocations: 2 rungs


def _world(seed: int = 7, k6: bool = False) -> World:
    """small G=4 and G=8 learn fast and saturate, large G=8 learns late and passes them near T,
    large G=4 learns nothing and stays far below; 3 seeds (k6: two more flat allocations)."""
    curves = {("small", 4): Curve("sigmoid", 0.3, 0.35, 4e10, 1.5), ("small", 8): Curve("sigmoid", 0.3, 0.33, 5e10, 1.5),
              ("large", 4): Curve("flat", 0.12, 0.0, 1e11), ("large", 8): Curve("sigmoid", 0.35, 0.55, 6e11, 1.2)}
    if k6:
        curves.update({("small", 16): Curve("flat", 0.2, 0.0, 1e11), ("large", 16): Curve("sigmoid", 0.3, 0.2, 1e11, 1.0)})
    allocs = [{"model": m, "num_generations": g, "curve": c} for (m, g), c in curves.items()]
    return World(name="race-test", models={"small": 1e5, "large": 4e5}, allocations=allocs,
                 budgets=[T / 100, T / 30, T / 10], seeds=[0, 1, 2], target_budget=T, n_problems=500, seed_sd=0.05,
                 seed=seed)


@pytest.fixture(scope="module")
def raced():
    return simulate_race(_world(k6=True), RaceDesign(rungs=None, first_seeds=2), RacingRule(), forecast=True)


def test_rungs_keep_the_schedules_count_ranked_by_observed_score(raced):
    sched = raced["decisions"][0]["schedule"]
    assert sched["keep"] == [6, 2] and sched["unreused_T"] <= 0.9 + 1e-9
    for j, dd in enumerate(raced["decisions"][:-1]):
        d = RungDecision(**{**dd, "go_on": tuple(dd["go_on"])})
        assert (d.rung, d.budget, d.next_budget, d.target_budget) == (j, sched["budgets"][j], sched["budgets"][j + 1], T)
        rows = {r["allocation"]: r for r in d.rows}
        assert d.go_on[0] == d.leader and set(d.go_on) | set(d.stopped) == set(rows)
        assert len(d.go_on) == sched["keep"][j + 1]  # no floor in this world: exactly the schedule's count
        ranked = sorted(rows, key=lambda a: (-rows[a]["observed"], a))
        assert list(d.go_on) == ranked[: len(d.go_on)]
        for a, why in d.stopped.items():
            assert "ranked" in why and "by observed" in why
        assert json.loads(json.dumps(d.as_dict()))["rule"] == RacingRule().as_dict()


def test_the_picks_odds_are_over_every_allocation(raced):
    pick = raced["pick"]
    survivors = set(raced["decisions"][-2]["go_on"])
    assert pick.allocation in survivors and pick.allocation == raced["decisions"][-1]["leader"]
    assert len(pick.predictions) == 6  # the stopped ones at their last readings, not only the survivors
    assert pick.predictions["p_best"].sum() == pytest.approx(1.0, abs=1e-9)
    best = np.argmax(pick.replicates, axis=1)
    assert pick.win_probability == pytest.approx(float(np.mean(best == 0)), abs=1e-12)  # the pick is column 0
    assert pick.win_probability <= pick.p_near_best <= 1.0


def test_decisions_are_a_pure_function_of_the_store(raced):
    """A study killed after the last rung and resumed from its store makes every rung's decision
    again, identically, whatever the row order: the store then holds later rungs' runs, and each
    rung's run has become a prefix (another run id) of the run that extended it."""
    runs, evals = raced["runs"], raced["evals"]
    from race.spec.rungs import RungSchedule

    s = raced["decisions"][0]["schedule"]
    sched = RungSchedule(T, tuple(s["budgets"]), tuple(s["keep"]), s["first_seeds"], s["later_seeds"], s["min_budgets"],
                         s["cap"])
    for j, before in enumerate(raced["decisions"]):
        again = rung_decision(runs, evals, schedule=sched, rung=j, rule=RacingRule())
        assert again.as_dict() == before
    again = rung_decision(runs.sample(frac=1.0, random_state=0), evals.sample(frac=1.0, random_state=1),
                          schedule=sched, rung=0, forecast=True)
    assert again.as_dict() == raced["decisions"][0]


def test_the_forecast_never_changes_who_goes_on():
    w = _world(k6=True)
    a = simulate_race(w, RaceDesign(rungs=None, first_seeds=2), RacingRule(), forecast=True)
    b = simulate_race(w, RaceDesign(rungs=None, first_seeds=2), RacingRule(), forecast=False)
    assert [d["go_on"] for d in a["decisions"]] == [d["go_on"] for d in b["decisions"]]
    assert "forecast" in a["decisions"][0]["rows"][0] and "forecast" not in b["decisions"][0]["rows"][0]


class StepWorld(World):
    """_world with a per-step cost and warmup: large G=8 takes 10 warmup + 5 steps of T/200."""

    def step_cost(self, a: dict) -> float:
        return T / 200 if (a["model"], a["num_generations"]) == ("large", 8) else T / 4000

    def warmup_steps(self, a: dict) -> int:
        return 10 if (a["model"], a["num_generations"]) == ("large", 8) else 0


def test_the_step_floor_runs_an_allocation_until_it_is_measured():
    """large G=8 needs 10 warmup + 5 steps of T/200 (3T/40 / 0.8): on a first rung below that it runs to its
    floor's budget and is judged there with the others (RungSchedule.budget_of); where the schedule
    did not know the floor (steps are what the runs report), an allocation short of it goes on
    whatever it scored, and says why."""
    from race.spec.rungs import RungSchedule

    base = _world(k6=True)
    w = StepWorld(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    out = simulate_race(w, RaceDesign(rungs=None, first_seeds=2), RacingRule(), forecast=False)
    d0 = out["decisions"][0]
    late = "large|G=8|P=4|it=1|lr=0.0001|rule"
    floor = 15 * T / 200 / w.spend[0]  # a run spends 80-100% of its budget
    assert d0["schedule"]["min_budgets"][late] == pytest.approx(floor) and d0["budget"] < floor
    row = next(r for r in d0["rows"] if r["allocation"] == late)
    assert row["budget"] == pytest.approx(floor) and row["steps"] >= 15 and row["measured"]
    assert not d0["exempt"] and len(d0["go_on"]) == d0["schedule"]["keep"][1]
    assert out["pilot_T"] - out["reused_T"] <= 0.9 + 1e-9  # the worst case counted its floor
    # a schedule that does not know the floor: the steps the runs report decide
    blind = RungSchedule(T, tuple(d0["schedule"]["budgets"]), tuple(d0["schedule"]["keep"]), 2, 1, {}, 0.9)
    runs, evals = WorldSource(w).tables({(k, s): 0 for k in range(6) for s in (0, 1)}, list(blind.budgets))
    d = rung_decision(runs, evals, schedule=blind, rung=0, forecast=False)
    row = next(r for r in d.rows if r["allocation"] == late)
    assert late in d.exempt and late in d.go_on and not row["measured"]
    assert row["steps"] < 15 == row["steps_needed"] and "the step floor keeps it" in row["reason"]
    assert len(d.go_on) == blind.keep[1] + 1  # the ranked ones and the one the floor kept


def test_the_compute_cap_holds_in_every_world():
    """Not reused by the target run stays within max_unreused x T whatever goes on."""
    from race.analysis.synthetic import random_world

    for s in (1001, 1003, 1004, 5126):
        out = simulate_race(random_world(s), DESIGN, RacingRule(max_unreused=0.9), forecast=False)
        assert out["pilot_T"] - out["reused_T"] <= 0.9 + 1e-9
    out = simulate_race(_world(), RaceDesign(rungs=(1 / 32, 1 / 8, 1 / 3), first_seeds=3),
                        RacingRule(geometry="cap", rank="forecast", max_unreused=0.4), forecast=False)
    assert [len(a) for a in out["alive"]] == [4, 1, 1]
    assert "compute cap" in " ".join(out["decisions"][0]["stopped"].values())


def test_spent_flops_counts_a_continued_run_once(raced):
    runs, alive = raced["runs"], raced["alive"]
    b = raced["decisions"][0]["schedule"]["budgets"]
    want = 6 * 2 * b[0] + len(alive[1]) * (b[1] - b[0])
    assert spent_flops(runs, b[1]) == pytest.approx(want, rel=1e-12)
    assert raced["pilot_flops"] == pytest.approx(want, rel=1e-12)


def test_bad_arguments_say_what_to_change(raced):
    runs, evals = raced["runs"], raced["evals"]
    sched = RacingRule().schedule([f"a{i}" for i in range(6)], T, first_seeds=2)
    with pytest.raises(ValueError, match="rung must be in 0..1"):
        rung_decision(runs, evals, schedule=sched, rung=2)
    far = RacingRule().schedule([f"a{i}" for i in range(6)], T, first_seeds=2, rungs=[T / 1000, T / 900])
    with pytest.raises(ValueError, match="has not run yet"):
        rung_decision(runs, evals, schedule=far, rung=0)
    for bad in ({"level": 1.5}, {"p_keep": 1.0}, {"max_unreused": -1.0}, {"later_seeds": 0}, {"rank": "luck"},
                {"pick": "first"}, {"floor_steps": -1}, {"eta": 1.0}):
        with pytest.raises(ValueError, match="RacingRule"):
            RacingRule(**bad)
    with pytest.raises(ValueError, match="unknown setting"):
        rule_from({"p_kep": 0.1})


def test_a_continued_run_reads_as_the_shorter_run_did():
    """race_tables: a run continued to a later rung keeps the earlier rung's readings exactly (the
    store's prefix rows), and the nested readings on the first rung are prefixes too."""
    w = _world()
    rungs = [T / 32, T / 8, T / 3]
    design = RaceDesign(rungs=(1 / 32, 1 / 8, 1 / 3))
    first = {(k, s): 0 for k in range(4) for s in range(3)}
    later = {**first, (0, 0): 2}
    r0, e0 = race_tables(w, design, first)
    r2, e2 = race_tables(w, design, later)
    rid = "small-G4-lr0.0001-s0"
    short = e0[e0["run_id"] == rid].sort_values("step")
    as_prefix = e2[e2["run_id"] == f"{rid}.r0"].sort_values("step")
    assert np.array_equal(short["flops"].to_numpy(), as_prefix["flops"].to_numpy())
    assert np.array_equal(np.vstack(short["per_problem"].tolist()), np.vstack(as_prefix["per_problem"].tolist()))
    long = r2[r2["run_id"] == rid].iloc[0]
    assert long["budget"] == pytest.approx(rungs[2]) and not isinstance(long["prefix_of"], str)
    assert sorted(r2.loc[r2["prefix_of"] == rid, "budget"]) == pytest.approx(
        [rungs[0] / 4, rungs[0] / 2, rungs[0], rungs[1]], rel=1e-12)
    src = WorldSource(w)
    assert src.tables(first, rungs)[0].equals(race_tables(w, RaceDesign(rungs=None), first, {}, rungs)[0])
