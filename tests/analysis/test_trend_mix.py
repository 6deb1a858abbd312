"""The local trend as a second forecaster (race.analysis.spread: trend_forecast, mix_trend,
TrendMix): the trend is a straight line in (ln C, logit) through the last stretch of the
longest runs, the mixture moves a share of the replicates onto it, and with the mix off
nothing changes."""

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit

from race.analysis.backtest import logit
from race.analysis.decision import ConfidenceRules
from race.analysis.spread import TrendMix, mix_trend, trend_forecast
from race.analysis.joint import StudyMatrix
from race.analysis.racing import RacingRule


def _sm(lines: dict[int, tuple[str, float, float, list[float]]]) -> StudyMatrix:
    """A study matrix of runs whose points lie exactly on logit(score) = a + b ln C:
    run -> (allocation, budget, (a, b), the points' ln C)."""
    runs, pts = [], []
    for r, (alloc, budget, (a, b), xs) in lines.items():
        runs.append({"allocation": alloc, "budget": budget, "end_flops": budget})
        pts += [{"run": r, "flops": float(np.exp(x)), "score": float(expit(a + b * x)), "n": 500} for x in xs]
    runs = pd.DataFrame(runs, index=list(lines))
    n = len(runs)
    return StudyMatrix(target="greedy", runs=runs, points=pd.DataFrame(pts), point_pp=None, start=np.full(n, np.nan),
                       start_pp=None, end=np.full(n, 0.5), end_pp=None, n_problems=500)


def test_the_trend_is_the_last_stretch_extrapolated_and_seeds_do_not_tilt_it():
    # two seeds of one allocation at its largest budget, offsets -0.3 and +0.4 logit, slope 0.25 per ln C;
    # their windows cover different ln C, so pooling without removing each run's offset would tilt the slope
    xs0, xs1 = list(np.linspace(24.0, 26.0, 9)), list(np.linspace(24.8, 26.0, 5))
    sm = _sm({0: ("a", 2e11, (-6.3, 0.25), xs0), 1: ("a", 2e11, (-5.6, 0.25), xs1),
              2: ("a", 1e10, (9.0, -1.0), [20.0, 21.0, 22.0])})  # a shorter run: not the trend's
    x_t = 27.0  # reach 1: the window is ln C in [25, 26]
    win0 = [x for x in xs0 if x >= 25.0]
    level = np.mean([-6.3 + 0.25 * x for x in win0] + [-5.6 + 0.25 * x for x in xs1 if x >= 25.0])
    xbar = np.mean(win0 + [x for x in xs1 if x >= 25.0])
    want = level + 0.25 * (x_t - xbar)
    got = trend_forecast(sm, "a", x_t)
    # the points pass through expit and back (logit clips at 1e-3, far from these scores): a few ulps of logit
    assert got == pytest.approx(want, abs=1e-9)
    # points before the window do not count: a different slope there changes nothing
    sm2 = _sm({0: ("a", 2e11, (-6.3, 0.25), xs0 + [20.0, 21.0]), 1: ("a", 2e11, (-5.6, 0.25), xs1)})
    sm2.points.loc[sm2.points["flops"] < np.exp(22.0), "score"] = 0.9
    assert trend_forecast(sm2, "a", x_t) == pytest.approx(want, abs=1e-9)


def test_no_trend_without_points_or_reach():
    sm = _sm({0: ("a", 1e11, (-2.0, 0.2), [24.0, 25.0, 26.0]), 1: ("b", 1e11, (-2.0, 0.2), [25.9, 26.0])})
    assert trend_forecast(sm, "a", 26.0) is None  # no reach
    assert trend_forecast(sm, "a", 25.5) is None  # the target is inside the pilots
    assert trend_forecast(sm, "b", 27.0) is None  # 2 points in the window
    assert trend_forecast(sm, "c", 27.0) is None  # no such allocation
    assert trend_forecast(sm, "a", 28.0) == pytest.approx(-2.0 + 0.2 * 28.0, abs=1e-9)


def test_the_mixture_moves_a_share_of_the_replicates_onto_the_trend():
    rng = np.random.default_rng(0)
    R, points = 4000, np.array([0.5, -1.0, 2.0])
    logits = points + rng.standard_normal((R, 3)) * np.array([0.3, 0.2, 0.4])
    trends = [1.5, None, 1.0]
    # off: the same array back and not one draw from the generator
    gen = np.random.default_rng(5)
    assert mix_trend(logits, points, trends, TrendMix(), gen) is logits
    assert gen.random() == np.random.default_rng(5).random()
    # weight 1: every replicate of a column with a trend sits around it, its deviation scaled
    out = mix_trend(logits, points, trends, TrendMix(1.0, 1.5), np.random.default_rng(1))
    np.testing.assert_array_equal(out[:, 1], logits[:, 1])
    for i in (0, 2):
        np.testing.assert_allclose(out[:, i], trends[i] + 1.5 * (logits[:, i] - points[i]), rtol=0, atol=1e-12)
    # weight 0.5: about half of each column moved, independently per column (binomial: 5 SD is 0.04)
    out = mix_trend(logits, points, trends, TrendMix(0.5, 1.0), np.random.default_rng(2))
    moved = out != logits
    assert not moved[:, 1].any()
    for i in (0, 2):
        assert abs(moved[:, i].mean() - 0.5) < 5 * np.sqrt(0.25 / R)
    assert abs(np.mean(moved[:, 0] == moved[:, 2]) - 0.5) < 5 * np.sqrt(0.25 / R)


def test_bad_mixtures_say_what_to_change():
    for bad in ({"weight": 1.5}, {"weight": -0.1}, {"scale": 0.0}):
        with pytest.raises(ValueError, match="trend"):
            TrendMix(**bad)
    for bad in ({"trend_weight": 2.0}, {"trend_scale": -1.0}):
        with pytest.raises(ValueError, match="RacingRule: .*trend"):
            RacingRule(**bad)
    rules = RacingRule(trend_weight=0.25, trend_scale=2.0).confidence_rules()
    assert (rules.trend_weight, rules.trend_scale) == (0.25, 2.0)
    assert (ConfidenceRules().trend_weight, ConfidenceRules().trend_scale) == (0.0, 1.0)


def test_a_racing_pick_still_rising_gets_an_interval_that_reaches_toward_its_trend():
    """A racing study whose leader follows a power law (still rising in logit at T/3, which the
    joint model's saturating family bends down): with the frozen rule the pick's interval
    spans the trend too; with the trend off it stops short (docs/analysis.md, the freezes'
    record: the third freeze)."""
    from analysis_synth import rising_power_world
    from race.analysis.synthetic_race import simulate_race

    w, design = rising_power_world()
    # the third freeze's geometry (keep by the cap, rank by the forecast) carries small G=4 to the last
    # rung here; the sixth freeze's schedule keeps 4, 4, 2 and ranks by the observed score, which cuts it
    # at T/8 (0.439 against 0.457), so the trend's effect on the pick's interval is read with the former
    old = {"geometry": "cap", "rank": "forecast"}
    off = simulate_race(w, design, RacingRule(trend_weight=0.0, **old))["pick"]
    on = simulate_race(w, design, RacingRule(**old))["pick"]
    assert on.allocation == off.allocation and on.allocation.startswith("small|G=4")
    assert "trend" not in off.predictions and "trend" in on.predictions
    top = on.predictions.iloc[0]
    assert top["allocation"] == on.allocation and top["trend"] > top["score"]  # the trend runs above the joint model
    truth = w.truth(0)
    assert off.predicted_hi < truth  # the joint model alone bends down too early
    # the mixture's upper end moves up toward the truth, past the trend's own point (half of its replicates
    # are spread around that point)
    assert on.predicted_hi > max(off.predicted_hi, top["trend"])
    assert on.predicted_lo <= on.predicted_score <= on.predicted_hi
