"""How close the pilots must run for an interval of a given width (race.analysis.pilot_reach)."""

import math

import numpy as np
import pytest

from race.analysis.pilot_reach import advice_text, pilot_advice, reach_for_width, sd_for_width, width_at

Z = 1.959964


@pytest.mark.parametrize("q", [-2.0, 0.0, 0.7, 3.0])
@pytest.mark.parametrize("goal", [0.05, 0.25, 0.6])
def test_sd_for_width_inverts_the_width(q, goal):
    s = sd_for_width(q, goal, Z)
    # bisection to 100 halvings: the width is continuous in s, so it matches the goal to rounding
    assert width_at(q, s, Z) == pytest.approx(goal, abs=1e-9)
    assert width_at(q, 0.99 * s, Z) < goal < width_at(q, 1.01 * s, Z)
    with pytest.raises(ValueError, match="between 0 and 1"):
        sd_for_width(q, 1.2, Z)


def test_reach_for_width_closes_the_error_model():
    q, rep, S, f, rm, goal = 0.8, 0.1, 1.6, 0.15, 0.7, 0.25
    d = reach_for_width(q, rep, S, f, rm, goal, Z)
    s = math.sqrt(rep**2 + (S * f) ** 2 * (rm**2 + d**2))
    assert width_at(q, s, Z) == pytest.approx(goal, abs=1e-9)
    # a larger error scale or slope factor needs the pilots closer; a wider goal allows them further
    assert reach_for_width(q, rep, 1.5 * S, f, rm, goal, Z) < d
    assert reach_for_width(q, rep, S, 1.5 * f, rm, goal, Z) < d
    assert reach_for_width(q, rep, S, f, rm, 0.4, Z) > d
    # the replicates' spread alone wider than the goal: no pilot distance reaches it
    assert reach_for_width(q, sd_for_width(q, goal, Z) * 1.01, S, f, rm, goal, Z) is None
    # nor the misfit alone (d = 0 leaves S f r_m)
    assert reach_for_width(q, 0.0, S, f, 10.0, goal, Z) is None


def test_pilot_advice_statuses():
    kw = dict(q=0.8, rep_sd=0.1, scale=1.6, factor=0.2, misfit_reach=0.7)
    d = reach_for_width(goal=0.25, z=Z, **{k: v for k, v in zip(("q", "rep_sd", "scale", "factor", "misfit_reach"),
                                                                 kw.values())})
    target = 1e15
    far = pilot_advice(**kw, target_budget=target, largest_pilot=target / 10.0)
    assert far["status"] == "move" and far["ratio"] == pytest.approx(math.exp(d))
    assert far["pilot_budget"] == pytest.approx(target / math.exp(d))
    assert far["times_largest"] == pytest.approx(far["pilot_budget"] / (target / 10.0))
    near = pilot_advice(**kw, target_budget=target, largest_pilot=target / (0.9 * math.exp(d)))
    assert near["status"] == "met" and near["pilot_budget"] is None
    hopeless = pilot_advice(0.8, 5.0, 1.6, 0.2, 0.7, target, target / 10.0)
    assert hopeless["status"] == "not by pilots"
    fmt = lambda x: f"{x:.1e} FLOPs"  # noqa: E731
    assert "within" in advice_text(far, fmt) and fmt(far["pilot_budget"]) in advice_text(far, fmt)
    assert "already" in advice_text(near, fmt) and "no pilot distance" in advice_text(hopeless, fmt)


def test_the_recommendation_carries_advice_consistent_with_its_own_interval():
    from race.analysis import recommend
    from race.analysis.synthetic import random_world, world_tables

    w = next(w for w in (random_world(s, flat=False) for s in range(7200, 7230)) if w.tags["target_ratio"] > 8)
    runs, evals = world_tables(w)
    rec = recommend(evals, runs, "greedy", w.target_budget, n_boot=100, rng=0)
    assert rec.forecast_made and rec.pilot_advice is not None
    a = rec.pilot_advice
    assert a["goal"] == 0.25 and a["status"] in ("met", "move", "not by pilots")
    width = rec.predicted_hi - rec.predicted_lo
    if a["status"] == "move":  # the interval today is wider than the goal, at a reach the advice shortens
        assert width > 0.25 and 1.0 <= a["ratio"] < rec.extrapolation_ratio
        assert a["pilot_budget"] == pytest.approx(w.target_budget / a["ratio"])
    elif a["status"] == "met":
        assert a["ratio"] >= rec.extrapolation_ratio
    top = rec.predictions.iloc[0]
    assert np.isfinite(top["rep_sd"]) and top["factor"] > 0
    assert rec.to_dict()["pilot_advice"]["status"] == a["status"]


def test_widths_at_other_pilot_distances():
    from race.analysis.pilot_reach import width_with_pilots

    args = (0.8, 0.1, 1.6, 0.15, 0.7)
    a = pilot_advice(*args, target_budget=1e15, largest_pilot=1e15 / 3.0)
    assert list(a["widths"]) == ["1.5", "2"]  # only distances closer than today's 3x
    w15, w2 = a["widths"]["1.5"], a["widths"]["2"]
    assert w15 < w2 < width_with_pilots(*args, 3.0, Z)
    d = reach_for_width(*args, goal=w2, z=Z)  # the inverse: a width of w2 needs the pilots within 2x
    assert math.exp(d) == pytest.approx(2.0, rel=1e-6)
    assert "1.5x / 2x below the target" in advice_text(a, lambda x: f"{x:g}")
