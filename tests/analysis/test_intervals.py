"""How an interval is read from the replicates (race.analysis.standings: INTERVALS,
shortest_interval, equal_tailed_interval, interval_bounds) and which one the racing rule's pick
reads (the fourth freeze: the shortest)."""

import itertools

import numpy as np
import pytest

from race.analysis.decision import ConfidenceRules
from race.analysis.standings import INTERVALS, equal_tailed_interval, interval_bounds, shortest_interval, summarise
from race.analysis.racing import RacingRule


def _held(col: np.ndarray, lo: float, hi: float) -> int:
    return int(np.sum((col >= lo) & (col <= hi)))


def test_the_shortest_interval_is_the_narrowest_window_of_order_statistics_that_holds_the_level():
    rng = np.random.default_rng(0)
    reps = np.column_stack([rng.standard_normal(25), rng.exponential(size=25), rng.uniform(size=25)])
    for level in (0.5, 0.8, 0.95):
        lo, hi = shortest_interval(reps, level)
        m = int(np.ceil(level * 25))
        for j in range(reps.shape[1]):
            col = reps[:, j]
            assert _held(col, lo[j], hi[j]) >= m  # holds at least the level
            # no pair of replicates holding m of them is closer (brute force over all pairs; the
            # bounds are replicates themselves, so the widths compare exactly)
            best = min(b - a for a, b in itertools.combinations(np.sort(col), 2) if _held(col, a, b) >= m)
            assert hi[j] - lo[j] == best
            assert lo[j] in col and hi[j] in col


def test_on_a_skewed_sample_the_shortest_interval_moves_to_the_dense_side_and_is_narrower():
    rng = np.random.default_rng(1)
    reps = rng.exponential(size=(4000, 1))
    lo, hi = shortest_interval(reps, 0.95)
    elo, ehi = equal_tailed_interval(reps, 0.95)
    assert lo[0] == reps.min()  # the exponential's density is highest at 0
    # population widths: -ln(0.05) = 3.00 against ln(0.975 / 0.025) = 3.66; sampling error of either
    # end at R = 4000 is below 0.1
    assert (hi - lo)[0] < (ehi - elo)[0] - 0.4
    # a constant column: a width of 0, not an error
    lo, hi = shortest_interval(np.ones((10, 2)), 0.95)
    np.testing.assert_array_equal(hi - lo, 0.0)


def test_interval_bounds_and_summarise_read_the_named_interval():
    rng = np.random.default_rng(2)
    reps = np.column_stack([rng.beta(8, 2, 500), rng.beta(2, 8, 500)])
    for name, fn in (("equal-tailed", equal_tailed_interval), ("shortest", shortest_interval)):
        want = fn(reps, 0.9)
        got = interval_bounds(reps, 0.9, name)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        table = summarise(["a", "b"], np.array([0.8, 0.2]), reps, 0.9, name)
        np.testing.assert_array_equal(table["lo"].to_numpy(), want[0])
        np.testing.assert_array_equal(table["hi"].to_numpy(), want[1])
    # the default stays the equal-tailed interval (flat and nested grids)
    np.testing.assert_array_equal(summarise(["a", "b"], np.array([0.8, 0.2]), reps, 0.9)["lo"].to_numpy(),
                                  equal_tailed_interval(reps, 0.9)[0])


def test_an_unknown_interval_is_refused_with_the_choices():
    assert INTERVALS == ("equal-tailed", "shortest")
    with pytest.raises(ValueError, match="interval must be one of"):
        interval_bounds(np.ones((5, 1)), 0.9, "hpd")
    with pytest.raises(ValueError, match="ConfidenceRules.interval must be one of"):
        ConfidenceRules(interval="hpd")
    with pytest.raises(ValueError, match="RacingRule.interval must be one of"):
        RacingRule(interval="central")
    with pytest.raises(ValueError, match="non-empty"):
        shortest_interval(np.ones(5), 0.9)
    assert ConfidenceRules().interval == "equal-tailed"
    assert RacingRule().confidence_rules().interval == "shortest"
    assert RacingRule(interval="equal-tailed").confidence_rules().interval == "equal-tailed"


def test_the_racing_pick_reads_the_shortest_interval_of_its_replicates():
    """On a racing study the recommendation's interval is the shortest interval of the pick's
    mixed replicates with the frozen rule, their equal-tailed one when the rule says so."""
    from analysis_synth import rising_power_world
    from race.analysis.synthetic_race import simulate_race

    w, design = rising_power_world()
    for rule, fn in ((RacingRule(), shortest_interval), (RacingRule(interval="equal-tailed"), equal_tailed_interval)):
        pick = simulate_race(w, design, rule)["pick"]
        lo, hi = fn(pick.replicates, rule.level)
        assert (pick.predicted_lo, pick.predicted_hi) == (lo[0], hi[0])
        assert pick.predictions.iloc[0]["allocation"] == pick.allocation
