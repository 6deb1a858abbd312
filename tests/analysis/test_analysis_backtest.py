"""Rolling-origin back-tests (race.analysis.backtest) and how the recommendation uses them."""

import numpy as np
import pandas as pd
import pytest

from race.analysis.backtest import (
    PRIOR_PAIRS,
    PRIOR_SCALE,
    SLOPE_CAP,
    SLOPE_FLOOR,
    BackTest,
    at_ratio,
    error_scale,
    logit,
    open_ends,
    run_backtest,
    slope_norm,
)


def _rows(errors, reach=1.0, obs_var=0.0, origin=1.0, budget=2.0, norm=1.0, ratio=0.5):
    return [dict(origin=origin, budget=budget, allocation=f"a{i}", forecast=0.5, observed=0.5, reach=reach, error=e,
                 obs_var=obs_var, norm=norm, ratio=ratio) for i, e in enumerate(errors)]


def test_error_scale_splits_shared_and_specific():
    # two pairs; errors per unit reach: (1, 1, 1), then (2, 0, -2); the specific scale comes from the
    # spread around each pair's mean, and its share s_sp^2 / K of each mean's square is not shared
    t = pd.DataFrame(_rows([1.0, 1.0, 1.0]) + _rows([4.0, 0.0, -4.0], reach=2.0, budget=3.0))
    sh, sp, n = error_scale(t)
    assert n == 2
    assert sp == pytest.approx(np.sqrt((0.0 + 8.0 / 2) / 2))
    assert sh == pytest.approx(0.0)  # mean of (1 - 2/3, 0 - 2/3) is below 0
    t = pd.DataFrame(_rows([3.0, 3.0, 3.0]) + _rows([4.0, 0.0, -4.0], reach=2.0, budget=3.0))
    assert error_scale(t)[0] == pytest.approx(np.sqrt(((9.0 - 2.0 / 3) + (0.0 - 2.0 / 3)) / 2))
    # observation noise is removed, never below 0
    noisy = pd.DataFrame(_rows([1.0, 1.0, 1.0], obs_var=3.0))
    assert error_scale(noisy)[0] == pytest.approx(0.0)
    # errors are per unit of (|slope| + c0): a curve rising twice as fast halves the same error
    assert error_scale(pd.DataFrame(_rows([2.0, 2.0], norm=2.0)))[0] == pytest.approx(1.0)


def _pairs(n_pairs, k, shared_sd, specific_sd, rng, noise=None):
    """Back-test rows of ``n_pairs`` (origin, budget) pairs of ``k`` allocations at unit effective reach."""
    rows = []
    for p in range(n_pairs):
        e = shared_sd * rng.standard_normal() + specific_sd * rng.standard_normal(k)
        if noise is not None:
            e = e + noise[p]
        rows += _rows(list(e), budget=2.0 + p)
    return pd.DataFrame(rows)


def test_shared_scale_is_not_the_specific_errors_share_of_the_mean():
    """Issue 34 (backtest.py:155): the pair mean u_bar carries s_specific^2 / K of specific error;
    subtracting only the observation noise called that share shared. Errors purely specific
    (s_specific 1, nothing shared, K = 4, 400 pairs): the shared scale must come out near 0, not
    near sqrt(1/4) = 0.5. With 400 pairs mean(u_bar^2) has SE 0.25 sqrt(2/400) = 0.018, so the
    estimate of s_shared^2 stays below 4 SE = 0.07 (s_shared < 0.27) but for a 1-in-30,000 draw."""
    t = _pairs(400, 4, 0.0, 1.0, np.random.default_rng(0))
    sh, sp, _ = error_scale(t)
    assert sp == pytest.approx(1.0, abs=0.1)  # SE of s_sp^2 about sqrt(2 / 1200) = 0.04
    assert sh < 0.27
    # and a real shared part is still found: s_shared 0.8 -> 0.8 (SE of s_sh^2 about 0.08)
    sh2, _, _ = error_scale(_pairs(400, 4, 0.8, 1.0, np.random.default_rng(1)))
    assert sh2 == pytest.approx(0.8, abs=0.15)


def test_observation_noise_shared_by_the_allocations_cancels_in_the_specific_part():
    """Issue 34 (backtest.py:157): the observed means are read on the same problems, so most of
    their noise is common to the allocations and cancels in u_k - u_bar; subtracting each mean's
    whole variance from the specific part removed noise that is not there. Noise fully shared (one
    draw per pair for every allocation, variance 1, its replicates showing that), specific errors
    0.5: the specific scale must stay near 0.5 (before: max(0, 0.25 - 1) = 0)."""
    rng = np.random.default_rng(2)
    n_pairs, k, R = 300, 4, 400
    common = rng.standard_normal(n_pairs)
    t = _pairs(n_pairs, k, 0.0, 0.5, rng, noise=[np.full(k, c) for c in common])
    t["obs_var"] = 1.0
    reps = {}
    for p in range(n_pairs):
        z = rng.standard_normal(R)  # the replicates: one problem draw shared by the allocations
        for i in range(k):
            reps[(2.0 + p, f"a{i}")] = z
    sh, sp, _ = error_scale(t, obs_reps=reps)
    assert sp == pytest.approx(0.5, abs=0.08)  # SE of s_sp^2 about 0.25 sqrt(2 / 900) = 0.012
    # the shared part: u_bar carries the whole common noise (variance 1), removed from u_bar^2
    assert sh < 0.25
    # independent noise (no replicates): the variances alone, as before
    ind = _pairs(n_pairs, k, 0.0, 0.5, np.random.default_rng(3),
                 noise=list(np.random.default_rng(4).standard_normal((n_pairs, k)) * 0.5))
    ind["obs_var"] = 0.25
    assert error_scale(ind)[1] == pytest.approx(0.5, abs=0.08)


def test_only_pairs_at_the_targets_ratio_count():
    t = pd.DataFrame(_rows([1.0, 1.0], ratio=0.5) + _rows([9.0, 9.0], ratio=2.0, origin=0.5))
    assert len(at_ratio(t, 0.75)) == 2 and (at_ratio(t, 0.75)["ratio"] == 0.5).all()
    assert len(at_ratio(t, 0.1)) == 2  # none qualifies: the pair with the smallest ratio
    assert len(at_ratio(t, None)) == 4


def test_noise_is_correlated_across_allocations_and_scales_with_reach():
    bt = BackTest(table=pd.DataFrame(), s_shared=1.0, s_specific=0.0, n_pairs=3, picked_right=True)
    z = bt.noise(np.array([1.0, 2.0]), 4000, 2, np.random.default_rng(0))
    assert np.std(z[:, 1]) / np.std(z[:, 0]) == pytest.approx(2.0, rel=0.05)
    # the prior pulls the shared and specific scales: S^2 = (n s^2 + n0 s0^2 / 2) / (n + n0)
    sh = np.sqrt((3 * 1.0 + PRIOR_PAIRS * PRIOR_SCALE**2 / 2) / (3 + PRIOR_PAIRS))
    sp = np.sqrt((PRIOR_PAIRS * PRIOR_SCALE**2 / 2) / (3 + PRIOR_PAIRS))
    assert np.std(z[:, 0]) == pytest.approx(np.hypot(sh, sp), rel=0.1)
    assert np.corrcoef(z[:, 0], z[:, 1])[0, 1] == pytest.approx(sh**2 / (sh**2 + sp**2), abs=0.05)


def test_run_backtest_on_a_straight_line():
    # every allocation is a straight line in ln C: a linear forecaster's back-test errors are 0
    budgets = [1.0, 2.0, 4.0]
    lines = {"a": (0.3, 0.05), "b": (0.4, 0.02)}

    def score(a, x):
        return lines[a][0] + lines[a][1] * x

    def fit_at(a, origin, xt):
        return float(score(a, xt)), float(np.log(origin)), float(np.log(origin)) - 1.0

    def observed_at(a, b):
        return float(score(a, np.log(b))), float(np.log(b)), 0.0

    bt = run_backtest(budgets, ["a", "b"], fit_at, observed_at)
    assert len(bt.table) == 6 and bt.n_pairs == 3
    assert bt.s_shared == pytest.approx(0.0, abs=1e-12) and bt.s_specific == pytest.approx(0.0, abs=1e-12)
    assert bt.picked_right is True
    assert (bt.table["reach"] > 0).all()
    assert logit(1.0) == pytest.approx(np.log(999.0))
    # a target ratio of 0.5 keeps the pairs of ratio <= 0.75: 1 -> 2 and 2 -> 4 (ln 2 over a range
    # of 1), not 1 -> 4 (ln 4)
    near = run_backtest(budgets, ["a", "b"], fit_at, observed_at, target_ratio=0.5)
    assert near.table["used"].sum() == 4 and near.n_pairs == 2
    assert not near.table.loc[near.table["budget"] - near.table["origin"] == 3.0, "used"].any()


def test_slope_norm():
    assert slope_norm(np.array([0.0]), np.array([0.5])) == SLOPE_FLOOR
    lnc = np.array([0.0, 1.0, 2.0])
    assert slope_norm(lnc, 1 / (1 + np.exp(-(0.3 * lnc)))) == pytest.approx(0.3 + SLOPE_FLOOR)
    # a curve rising faster in logit than SLOPE_CAP - c0 per ln C is capped (near its ceiling)
    assert SLOPE_CAP - SLOPE_FLOOR < 1.5
    assert slope_norm(lnc, 1 / (1 + np.exp(-(1.5 * lnc)))) == pytest.approx(SLOPE_CAP)


def test_open_ends_follow_the_data_not_a_blanket_flag():
    z, top = 1.96, float(logit(1 - 1e-3))  # the interval's end reaches 0.999 when logit(point) + z sd >= top
    # bounded: a saturated forecast whose back-tested error stays inside the scale
    assert open_ends(0.5, 1.0, z, not_located=False, rising=True, ln_reach=1.4) == (False, False, "")
    # the same forecast with an error that reaches the top (and, symmetric at 0.5, the bottom)
    sd = top / z + 0.01
    above, below, why = open_ends(0.5, sd, z, not_located=False, rising=True, ln_reach=1.4)
    assert above and below and "open above" in why and "open below" in why and "1.40 ln C" in why
    # just short of the top: bounded (the rule is the arithmetic of the interval, not a margin)
    assert open_ends(0.5, top / z - 0.01, z, not_located=False, rising=True, ln_reach=1.4)[:2] == (False, False)
    # no midpoint located and the forecast still rises: open above, whatever the error's size
    above, below, why = open_ends(0.6, 0.2, z, not_located=True, rising=True, ln_reach=2.0)
    assert above and not below and why.startswith("no sign of saturation yet: the interval is open above")
    # not located but flat or falling: the data (the last observation) bound it
    assert open_ends(0.6, 0.2, z, not_located=True, rising=False, ln_reach=2.0) == (False, False, "")
    # at the margin, the interval's own replicate quantiles reaching the end open it too
    assert open_ends(0.5, top / z - 0.01, z, False, True, 1.4, lo=0.01, hi=0.9992)[:2] == (True, False)
    assert open_ends(0.5, top / z - 0.01, z, False, True, 1.4, lo=0.0008, hi=0.99)[:2] == (False, True)
    assert open_ends(0.5, top / z - 0.01, z, False, True, 1.4, lo=0.01, hi=0.99) == (False, False, "")
    # a low forecast whose error reaches the bottom only
    q = float(logit(0.05))
    above, below, why = open_ends(0.05, (q - float(logit(1e-3))) / z + 0.01, z, False, False, 1.0)
    assert below and not above and why.startswith("the interval is open below")


def test_pooled_sd_is_what_the_noise_draws():
    bt = BackTest(table=pd.DataFrame(), s_shared=0.5, s_specific=0.3, n_pairs=2, picked_right=None, prior_scale=1.0)
    sh, sp = bt.pooled()
    assert sh == pytest.approx(np.sqrt((2 * 0.25 + PRIOR_PAIRS * 0.5) / (2 + PRIOR_PAIRS)))
    assert sp == pytest.approx(np.sqrt((2 * 0.09 + PRIOR_PAIRS * 0.5) / (2 + PRIOR_PAIRS)))
    reach = np.array([0.5, 2.0])
    assert bt.sd(reach) == pytest.approx(reach * np.hypot(sh, sp))
    z = bt.noise(reach, 20000, 2, np.random.default_rng(1))
    # sample SD of 20000 normal draws: relative standard error 1 / sqrt(2 * 20000) = 0.005; 5 of them
    assert np.std(z, axis=0) == pytest.approx(bt.sd(reach), rel=0.025)


def test_effective_reach_keeps_an_error_at_zero_reach():
    from race.analysis.backtest import JOINT_MISFIT_REACH, effective_reach

    d, f = np.array([0.0, 0.5, 2.0, -1.0]), np.array([0.2, 0.2, 0.5, 0.3])
    assert effective_reach(d, f) == pytest.approx(f * np.maximum(d, 0.0))  # r_m = 0: the reach alone
    r = 0.7
    got = effective_reach(d, f, r)
    assert got == pytest.approx(f * np.sqrt(r**2 + np.maximum(d, 0.0) ** 2))
    assert got[0] == pytest.approx(0.2 * r) and got[3] == pytest.approx(0.3 * r)  # at or inside the pilots: misfit only
    # far out the misfit fades: D / (f d) -> 1
    assert effective_reach(50.0, 1.0, r) / 50.0 == pytest.approx(1.0, abs=1e-3)
    assert JOINT_MISFIT_REACH > 0
    # the back-test normalises its errors by the same effective reach: an error of f sqrt(r^2 + d^2) is one unit
    t = pd.DataFrame(_rows([0.5 * np.hypot(r, 1.0)] * 2, reach=1.0, norm=0.5))
    assert error_scale(t, r)[0] == pytest.approx(1.0)
    assert error_scale(t)[0] == pytest.approx(np.hypot(r, 1.0))
    bt = BackTest(table=pd.DataFrame(), s_shared=0.0, s_specific=0.0, n_pairs=0, picked_right=None, misfit_reach=r)
    assert bt.effective(d, f) == pytest.approx(got)
