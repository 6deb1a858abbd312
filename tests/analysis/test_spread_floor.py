"""A floor on each forecast's replicate spread in logit (race.analysis.spread.floor_spread;
ConfidenceRules.min_logit_sd, RacingRule.min_logit_sd): a column narrower than the floor is
stretched about its point forecast to exactly the floor, wider columns are left alone, and the
racing pick's replicates carry it."""

import numpy as np
import pytest
from scipy.special import expit

from race.analysis.backtest import logit
from race.analysis.decision import ConfidenceRules
from race.analysis.spread import floor_spread
from race.analysis.racing import RacingRule


def _columns() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    r = 200
    logits = np.column_stack([0.4 + 0.05 * rng.standard_normal(r),  # SD ~0.05: under a floor of 0.25
                              1.2 + 0.6 * rng.exponential(size=r),  # skewed, SD ~0.6: above it
                              -0.3 + 1.0 * rng.standard_normal(r)])  # SD ~1: above it
    points = np.array([0.42, 1.5, -0.3])  # point forecasts need not be the replicates' mean
    return logits, points


def test_a_column_under_the_floor_is_stretched_about_its_point_to_exactly_the_floor():
    logits, points = _columns()
    sd = np.std(logits, axis=0, ddof=1)
    assert sd[0] < 0.25 < sd[1] and 0.25 < sd[2]
    out = floor_spread(logits, points, 0.25)
    # scaling deviations from any centre by f scales the SD by f: the floor is met up to float rounding
    np.testing.assert_allclose(np.std(out[:, 0], ddof=1), 0.25, rtol=1e-9)
    ratio = (out[:, 0] - points[0]) / (logits[:, 0] - points[0])
    np.testing.assert_allclose(ratio, 0.25 / sd[0], rtol=1e-9)  # one factor: centre, order and skew kept
    assert np.array_equal(np.argsort(out[:, 0]), np.argsort(logits[:, 0]))
    np.testing.assert_array_equal(out[:, 1:], logits[:, 1:])  # wider columns untouched
    np.testing.assert_array_equal(logits, _columns()[0])  # the input is not modified


def test_no_floor_a_constant_column_and_a_single_replicate_are_left_as_they_are():
    logits, points = _columns()
    np.testing.assert_array_equal(floor_spread(logits, points, 0.0), logits)
    const = np.full((50, 2), 0.7)
    np.testing.assert_array_equal(floor_spread(const, np.array([0.7, 0.0]), 0.3), const)  # no spread to stretch
    np.testing.assert_array_equal(floor_spread(logits[:1], points, 0.3), logits[:1])
    # a floor above every column's SD brings all of them to it
    np.testing.assert_allclose(np.std(floor_spread(logits, points, 5.0), axis=0, ddof=1), 5.0, rtol=1e-9)


def test_bad_floors_say_what_to_change():
    logits, points = _columns()
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="min_logit_sd"):
            floor_spread(logits, points, bad)
        with pytest.raises(ValueError, match="ConfidenceRules.min_logit_sd"):
            ConfidenceRules(min_logit_sd=bad)
        with pytest.raises(ValueError, match="RacingRule.min_logit_sd"):
            RacingRule(min_logit_sd=bad)
    with pytest.raises(ValueError, match="RacingRule.min_logit_sd"):
        RacingRule(min_logit_sd="0.2")
    assert ConfidenceRules().min_logit_sd == 0.0  # off for the flat and nested grids
    assert RacingRule(min_logit_sd=0.4).confidence_rules().min_logit_sd == 0.4
    assert RacingRule().confidence_rules().min_logit_sd == RacingRule().min_logit_sd


def test_the_racing_pick_replicates_carry_the_floor():
    """On a racing study (trend mix off, so the pick's replicates are the curve model's alone)
    the pick's replicates have a logit SD of exactly the floor when the floor is above their own
    spread, and their own spread without it."""
    from analysis_synth import rising_power_world
    from race.analysis.synthetic_race import simulate_race

    w, design = rising_power_world()
    own = simulate_race(w, design, RacingRule(trend_weight=0.0, min_logit_sd=0.0))["pick"]
    own_sd = float(np.std(logit(own.replicates[:, 0]), ddof=1))
    floor = 2 * own_sd + 0.1
    floored = simulate_race(w, design, RacingRule(trend_weight=0.0, min_logit_sd=floor))["pick"]
    assert floored.predictions.iloc[0]["allocation"] == floored.allocation
    # replicates pass through expit and back (relative rounding ~1e-15 per value at these logits)
    np.testing.assert_allclose(np.std(logit(floored.replicates[:, 0]), ddof=1), floor, rtol=1e-6)
    point = float(logit(floored.predicted_score))
    assert floored.predicted_lo < expit(point - floor) and floored.predicted_hi > expit(point + floor)
