import numpy as np
import pandas as pd
import pytest

from race.analysis import bootstrap_saturating, fit_curves, fit_saturating, holdout_check, saturating_curve
from race.analysis.fits import _linear_box

TRUE = dict(r0=0.10, a=0.70, b=1.2, c_mid=1e14)


def _curves(c_lo=1e12, c_hi=1e16, n_runs=5, n_points=20, sd=0.01, rng=0):
    gen = np.random.default_rng(rng)
    rows = []
    for r in range(n_runs):
        c = np.geomspace(c_lo, c_hi, n_points)
        y = saturating_curve(c, **TRUE) + gen.normal(0, 0.005) + gen.normal(0, sd, n_points)
        rows.append(pd.DataFrame({"run_id": f"run{r}", "flops": c, "score": y}))
    return pd.concat(rows, ignore_index=True)


def test_curve_formula():
    # at C = C_mid the curve is halfway between R0 and A
    assert saturating_curve(1e14, **TRUE) == pytest.approx(0.40)
    assert saturating_curve(1e30, **TRUE) == pytest.approx(0.70)
    assert saturating_curve(1.0, **TRUE) == pytest.approx(0.10, abs=1e-9)


def test_noise_free_fit_is_exact():
    c = np.geomspace(1e12, 1e16, 15)
    fit = fit_saturating(c, saturating_curve(c, **TRUE))
    assert fit.rmse < 1e-6
    assert fit.r0 == pytest.approx(0.10, abs=1e-4) and fit.a == pytest.approx(0.70, abs=1e-4)
    assert fit.b == pytest.approx(1.2, rel=1e-3) and fit.c_mid == pytest.approx(1e14, rel=1e-3)
    assert fit.A_identified


def test_noisy_fit_recovers_parameters_within_bootstrap_intervals():
    ci = bootstrap_saturating(_curves(n_runs=8), n_boot=100, rng=0)
    for k, v in TRUE.items():
        lo, hi = ci.intervals[k]
        assert lo <= v <= hi, (k, v, lo, hi)
    assert ci.fit.A_identified
    p, lo, hi = ci.predict_interval(3e15)
    assert lo <= saturating_curve(3e15, **TRUE) <= hi
    assert len(ci.reps) == 100
    assert ci.intervals["a"][1] - ci.intervals["a"][0] < 0.05  # informative, not vacuous


def test_A_unidentified_when_data_stop_before_c_mid():
    cur = _curves(c_lo=1e11, c_hi=3e13, rng=1)
    fit = fit_saturating(cur["flops"], cur["score"])
    assert fit.c_max < fit.c_mid
    assert not fit.A_identified
    table = fit_curves(cur.assign(allocation="x"))
    assert not table["A_identified"].iloc[0]


def test_bounds_keep_asymptote_in_unit_interval():
    c = np.geomspace(1e12, 1e15, 12)
    y = np.clip(saturating_curve(c, 0.2, 1.6, 1.0, 3e14), 0, 1)  # true A beyond 1
    fit = fit_saturating(c, y)
    assert 0.0 <= fit.r0 <= 1.0 and 0.0 <= fit.a <= 1.0
    unb = fit_saturating(c, y, bounds=None)
    assert unb.rss <= fit.rss + 1e-12


def test_linear_box_matches_brute_force():
    gen = np.random.default_rng(0)
    f = np.sort(gen.random(30))
    y = 1.3 - 1.5 * f + gen.normal(0, 0.05, 30)  # unconstrained optimum outside [0, 1]
    r0, a, rss = _linear_box(f, y, (0.0, 1.0))
    grid = np.linspace(0, 1, 401)
    R0, A = np.meshgrid(grid, grid)
    brute = ((y[None, None, :] - R0[..., None] * (1 - f) - A[..., None] * f) ** 2).sum(-1)
    assert rss <= brute.min() + 1e-9


def test_holdout_check_beats_flat_baseline():
    cur = _curves(n_runs=1, n_points=30, rng=2)
    res = holdout_check(cur["flops"], cur["score"], fit_fraction=0.6)
    assert res.n_fit + res.n_test == 30
    assert res.rmse < 0.05
    assert res.rmse < res.baseline_rmse
    with pytest.raises(ValueError):
        holdout_check(cur["flops"], cur["score"], fit_fraction=1.5)


def test_too_few_points_is_an_error():
    with pytest.raises(ValueError, match="at least 4"):
        fit_saturating([1.0, 2.0, 3.0], [0.1, 0.2, 0.3])


def test_replicate_tolerance_changes_fits_far_less_than_their_bootstrap_spread():
    """Bootstrap replicates fit with a looser Nelder-Mead tolerance (speed); the fitted
    curves move by a tiny fraction of the interval width the replicates produce."""
    from race.analysis.fits import REPLICATE_XATOL

    curves = _curves(n_runs=6, sd=0.03, rng=3)
    tight = fit_saturating(curves["flops"], curves["score"], start=(1.0, 3e13))
    loose = fit_saturating(curves["flops"], curves["score"], start=(1.0, 3e13), xatol=REPLICATE_XATOL)
    c = np.geomspace(1e12, 1e16, 9)
    moved = np.abs(tight.predict(c) - loose.predict(c)).max()
    ci = bootstrap_saturating(curves, n_boot=60, rng=0)
    lo, hi = ci.intervals["a"]
    assert moved < 0.01 * (hi - lo) and moved < 1e-3
