"""What the recommendation section says about its pick and its interval: the default or a
switch, and why an interval reaches the end of the scale ('open above')."""

import dataclasses

from race.analysis import recommend
from race.analysis.synthetic import Curve, World, world_tables
from race.report.sections_decision import headline, interval_note


def _world(curves):
    allocs = [{"model": "small", "num_generations": g, "curve": c} for g, c in zip((4, 8), curves)]
    return World(name="t", models={"small": 1e5}, allocations=allocs, budgets=[1e11, 3e11, 1e12], seeds=[0, 1, 2],
                 target_budget=4e12, n_problems=500, seed_sd=0.03, seed=3)


def test_still_rising_curve_is_open_above_and_says_so():
    # a sigmoid whose midpoint lies far beyond the pilots: the data show no saturation
    w = _world([Curve("sigmoid", 0.1, 0.85, 3e13, 0.8), Curve("weibull", 0.1, 0.02, 1e11, 1.0)])
    runs, evals = world_tables(w)
    rec = recommend(evals, runs, "greedy", w.target_budget, n_boot=100, rng=0)
    assert rec.allocation.startswith("small|G=4") and rec.open_above
    assert "no sign of saturation yet: the interval is open above" in headline(rec)
    assert any("open above" in r for r in rec.reasons)
    assert rec.predictions.iloc[0]["open_above"]


def test_interval_note_names_the_end_of_the_scale():
    w = _world([Curve("weibull", 0.2, 0.4, 1e11, 1.0), Curve("weibull", 0.1, 0.1, 1e11, 1.0)])
    runs, evals = world_tables(w)
    rec = recommend(evals, runs, "greedy", w.target_budget, n_boot=60, rng=0)
    assert not rec.open_above and interval_note(rec) is None  # saturated, narrow: nothing to explain
    assert rec.allocation == rec.default_allocation and "the observed winner" in headline(rec)
    wide = dataclasses.replace(rec, predicted_hi=0.999)
    assert "back-tested extrapolation error" in interval_note(wide) and "Note:" in headline(wide)
