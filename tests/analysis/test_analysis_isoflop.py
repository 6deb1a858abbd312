import numpy as np
import pandas as pd
import pytest

from race.analysis import fit_isoflop, isoflop_table, optimal_size_trend

from analysis_synth import Alloc, make_study

SIZES = [1e6 * 2**k for k in range(5)]  # 1e6 .. 1.6e7
ALLOCS = [Alloc(f"n{k}", n, r0=0.0, a=0.5, b=1.0, c_mid=1e14) for k, n in enumerate(SIZES)]


def n_opt(budget):
    """Planted optimum: N*(C) = 4e6 (C / 1e15)^0.5."""
    return 4e6 * (budget / 1e15) ** 0.5


def peak(alloc, budget, flops):
    x = np.log(alloc.model_params) - np.log(n_opt(budget))
    return np.full_like(flops, 0.6 - 0.04 * x**2)


@pytest.fixture(scope="module")
def profiles():
    runs, evals = make_study(ALLOCS, budgets=[1e14, 1e15, 1e16, 1e17], n_points=2, n_problems=1000,
                             seed_sd=0.005, rng=7, truth_override=peak)
    return isoflop_table(evals, runs, "greedy", n_boot=300, rng=0)


def test_vertex_recovered_with_interval_when_grid_is_centred(profiles):
    row = profiles[profiles["budget"] == 1e15].iloc[0]
    assert row["n_sizes"] == 5 and row["condition"] == "rule"
    assert row["opt_params"] == pytest.approx(4e6, rel=0.15)
    assert row["ci_low"] <= 4e6 <= row["ci_high"]
    assert row["warnings"] == ""


def test_edge_and_outside_warnings(profiles):
    by_budget = profiles.set_index("budget")["warnings"]
    assert "edge of the grid" in by_budget[1e14]  # N* = 1.26e6, next to the smallest size
    assert "edge of the grid" in by_budget[1e16]  # N* = 1.26e7, next to the largest size
    assert "outside the grid" in by_budget[1e17]  # N* = 4e7 > 1.6e7
    assert "above the largest" in by_budget[1e17]


def test_optimal_size_trend_recovers_planted_exponent(profiles):
    trend = optimal_size_trend(profiles[profiles["budget"] <= 1e16])
    assert trend["n_budgets"] == 3
    assert trend["exponent"] == pytest.approx(0.5, abs=0.1)


def _finals(sizes, scores):
    return pd.DataFrame({"budget": 1e15, "model_params": sizes, "allocation": [f"a{i}" for i in range(len(sizes))],
                         "run_id": [f"r{i}" for i in range(len(sizes))], "score": scores})


def test_upward_parabola_and_too_few_sizes_warn():
    up = fit_isoflop(_finals([1e6, 1e7, 1e8], [0.10, 0.15, 0.50]), n_boot=20)
    assert up.opens_upward and up.opt_params is None
    assert any("opens upward" in w and "largest" in w for w in up.warnings)
    two = fit_isoflop(_finals([1e6, 1e7], [0.1, 0.2]), n_boot=20)
    assert two.coef is None and "needs >= 3" in two.warnings[0]
    with pytest.raises(ValueError, match="one budget"):
        fit_isoflop(_finals([1e6, 1e7, 1e8], [0.1, 0.2, 0.1]).assign(budget=[1.0, 2.0, 3.0]))


def test_best_allocation_per_size_is_used():
    fin = _finals([1e6, 1e6, 1e7, 1e8], [0.1, 0.3, 0.4, 0.3])
    fit = fit_isoflop(fin, n_boot=20)
    assert fit.scores == [0.3, 0.4, 0.3]
    assert fit.opt_params == pytest.approx(1e7, rel=1e-6)
    assert fit.to_dict()["n_sizes"] == 3


def test_three_sizes_bracket_but_do_not_locate():
    fit = fit_isoflop(_finals([1e6, 1e7, 1e8], [0.30, 0.40, 0.35]), n_boot=50)
    assert fit.located is False and fit.opt_score is None  # no peak above every observation
    assert (fit.ci_low, fit.ci_high) == (1e6, 1e8)
    assert any("bracketed between 1e+06 and 1e+08, not located" in w for w in fit.warnings)


def test_misfit_widens_the_vertex_interval():
    # five sizes on a profile that is not a parabola: the residuals must widen the interval
    sizes = [1e6, 2e6, 4e6, 8e6, 1.6e7]
    exact = _finals(sizes, [0.32, 0.38, 0.40, 0.38, 0.32])  # 0.40 - 0.02 k^2: a parabola in ln N
    bumpy = _finals(sizes, [0.32, 0.40, 0.40, 0.36, 0.32])
    a, b = fit_isoflop(exact, n_boot=200), fit_isoflop(bumpy, n_boot=200)
    assert a.located and b.located
    assert a.ci_high / a.ci_low < 1.0 + 1e-6  # one run per size, no problems: no noise but the misfit
    assert b.ci_high / b.ci_low > 1.2
