"""The joint model of the study (race.analysis.joint_model, race.analysis.joint_forecast)."""

import dataclasses

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import binom

from race.analysis import NO_LEARNING, recommend
from race.analysis.joint import draw_replicates, study_matrix
from race.analysis.joint_forecast import forecast_joint
from race.analysis.joint_model import GLOBAL, JointData, _priors, _sqrt_weights, fit_joint, refit, residuals
from race.analysis.recommend import candidate_allocations
from race.analysis.synthetic_rl import rl_world
from race.analysis.synthetic import world_tables

from analysis_synth import Alloc, make_study

TRUE = {"c": 29.5, "gamma": 1.0, "delta": 0.3, "log_s": np.log(1.5), "a0": 0.5, "eta": 0.4}
N = np.array([1e5, 1e5, 4e5, 4e5])
G = np.array([4.0, 8.0, 4.0, 8.0])
R0 = np.array([0.2, 0.2, 0.3, 0.3])


def _own_family_data(n_problems=2000, seed=0):
    dn, dg = np.log(N) - np.log(N).mean(), np.log(G) - np.log(G).mean()
    x = np.tile(np.linspace(27.0, 33.0, 12), 4)
    k = np.repeat(np.arange(4), 12)
    m = TRUE["c"] + TRUE["gamma"] * dn + TRUE["delta"] * dg
    A = R0 + (1 - R0) * expit(TRUE["a0"] + TRUE["eta"] * dn)
    mu = R0[k] + (A - R0)[k] * expit(np.exp(TRUE["log_s"]) * (x - m[k]))
    y = np.random.default_rng(seed).binomial(n_problems, mu) / n_problems
    return JointData(x, k, y[None], np.full((1, len(x)), float(n_problems)), R0[None], dn, dg), m, A


def test_recovers_known_parameters_of_its_own_family():
    d, m, A = _own_family_data()
    fit = fit_joint(d)
    # standard errors of the penalised fit from its Gauss-Newton curvature: the tolerance is
    # 4 of them (the priors pull by much less than one here: 48 points of 2,000 problems)
    r, J = residuals(fit.theta, d, _sqrt_weights(d, fit.p, fit.phi), fit.tau, _priors(float(np.mean(d.x))))
    se = np.sqrt(np.diag(np.linalg.inv(J[0].T @ J[0])))
    for i, name in enumerate(GLOBAL):
        assert abs(fit.theta[0, i] - TRUE[name]) <= 4 * se[i], (name, fit.theta[0, i], TRUE[name], se[i])
    assert fit.phi == pytest.approx(1.0, abs=0.5)  # binomial data: no overdispersion beyond chance
    np.testing.assert_allclose(fit.midpoint()[0], m, atol=0.15)
    np.testing.assert_allclose(fit.asymptote()[0], A, atol=0.02)
    assert fit.located(d.x_max) == ["own data"] * 4
    # replicates refit from the point fit: identical data give the point fit back
    rep = JointData(d.x, d.alloc, np.repeat(d.y, 3, 0), np.repeat(d.w, 3, 0), np.repeat(d.r0, 3, 0), d.dn, d.dg)
    np.testing.assert_allclose(refit(fit, rep).theta, np.repeat(fit.theta, 3, 0), atol=1e-4)


# three sizes on the assumed trend: midpoint in FLOPs proportional to N (gamma = 1, the
# prior's centre), the same share of the headroom at the asymptote (eta = 0); only the
# smallest model's midpoint lies well inside the pilots
TREND = [Alloc("s", 1e6, r0=0.1, a=0.6, b=1.5, c_mid=1e13), Alloc("m", 4e6, r0=0.1, a=0.6, b=1.5, c_mid=4e13),
         Alloc("l", 1.6e7, r0=0.1, a=0.6, b=1.5, c_mid=1.6e14)]
PILOTS = [1e13, 3e13, 1e14]


def test_locates_a_large_models_late_midpoint_from_the_smaller_ones():
    runs, evals = make_study(TREND, budgets=PILOTS, n_problems=400, seed_sd=0.01, rng=3)
    sm = study_matrix(evals, runs, "greedy")
    allocs = candidate_allocations(sm, None)
    reps = draw_replicates(sm, 100, 0)
    x_t = float(np.log(2e15))
    pt, F, info, fit = forecast_joint(sm, reps, allocs, x_t)
    by = {a.split("|")[0]: (a, i) for i, a in enumerate(allocs)}
    located = {name: info[i]["midpoint"] for name, (_, i) in by.items()}
    assert located["s"] == "own data" and located["l"] == "trend"
    truth_l = float(TREND[2].truth(2e15))
    # the large model is still far below its asymptote at the last pilot
    assert float(TREND[2].truth(1e14)) < truth_l - 0.2
    assert abs(fit.midpoint()[0, by["l"][1]] - np.log(1.6e14)) < 0.5  # ln C_mid of the large model, from the trend
    joint_err = abs(pt[by["l"][0]] - truth_l)
    assert joint_err < 0.08, (pt, truth_l)  # the asymptotes trade off against the slopes: 0.074 here
    # fitted alone, the same data cannot place the large model's midpoint: its own saturating
    # fit sits at a bound in most replicates (the per-allocation method then drops it)
    alone = recommend(evals, runs, "greedy", 2e15 / 0.95, method="curve", n_boot=50, rng=0).predictions
    assert float(alone.set_index("allocation").loc[by["l"][0], "bound_sigmoid"]) > 0.5
    lo, hi = np.quantile(F[:, by["l"][1]], [0.025, 0.975])
    assert lo <= truth_l <= hi + 0.05  # the noise-free replicates already near the truth


def test_no_saturation_inside_the_pilots_is_open_above():
    late = [dataclasses.replace(a, a=0.9, c_mid=a.c_mid * 20) for a in TREND]  # every midpoint beyond 1e14
    runs, evals = make_study(late, budgets=PILOTS, n_problems=400, seed_sd=0.01, rng=4)
    rec = recommend(evals, runs, "greedy", 4e14, method="joint", n_boot=100, rng=0)
    assert rec.method == "joint" and rec.confidence != NO_LEARNING
    joint = rec.predictions[rec.predictions["gate_passed"]]  # the others are forecast flat
    assert len(joint) and (joint["family"] == "joint").all()
    assert (joint["midpoint"] == "not located").all() and joint["unidentified"].all()
    assert rec.predictions.iloc[0]["gate_passed"]
    assert rec.open_above and any("open above" in r for r in rec.reasons)


def test_null_world_gives_no_forecast_through_the_gate():
    flat = [dataclasses.replace(a, a=a.r0) for a in TREND]
    runs, evals = make_study(flat, budgets=PILOTS, n_problems=400, seed_sd=0.01, rng=5)
    rec = recommend(evals, runs, "greedy", 4e14, method="joint", n_boot=100, rng=0)
    assert rec.confidence == NO_LEARNING and rec.method == "observed"
    assert (rec.predictions["family"] == "observed").all()


def test_deterministic_under_a_seed():
    runs, evals = make_study(TREND, budgets=PILOTS, n_problems=200, rng=6)
    a = recommend(evals, runs, "greedy", 4e14, method="joint", n_boot=50, rng=7)
    b = recommend(evals, runs, "greedy", 4e14, method="joint", n_boot=50, rng=7)
    assert a.predictions.equals(b.predictions) and np.array_equal(a.replicates, b.replicates)


WORLDS = range(7000, 7024)


@pytest.fixture(scope="module")
def other_family_calls():
    """The joint method on test-generator worlds (sigmoid / Weibull / log-saturating / power
    shapes, format jumps, rise-then-decline, shared problems): nothing here was tuned on."""
    out = []
    for seed in WORLDS:
        w = rl_world(seed, null=False)
        runs, evals = world_tables(w)
        rec = recommend(evals, runs, "greedy", w.target_budget, method="joint", n_boot=100, rng=0)
        truth = {f"{a['model']}|G={a['num_generations']}": w.truth(k) for k, a in enumerate(w.allocations)}
        out.append((w, rec, truth))
    return out


def test_other_curve_families_run_and_cover_loosely(other_family_calls):
    covered = n = 0
    for w, rec, truth in other_family_calls:
        if rec.confidence == NO_LEARNING:
            continue
        assert np.isfinite(rec.predictions[["score", "lo", "hi"]].to_numpy(float)).all()
        assert ((rec.predictions["lo"] <= rec.predictions["score"] + 1e-9)
                & (rec.predictions["score"] <= rec.predictions["hi"] + 1e-9)).all()
        t = truth["|".join(rec.allocation.split("|")[:2])]
        covered += rec.predicted_lo <= t <= rec.predicted_hi
        n += 1
    assert n >= 12
    # nominal 95%; if the true coverage were only 75%, seeing this many covered or more would
    # have probability < 1%: the interval is not badly anti-conservative off its own family
    assert covered >= binom.ppf(0.99, n, 0.75), (covered, n)


def test_effective_parameters_count_what_the_penalties_leave():
    """Issue 34 (joint_model.py:209): the dispersion's degrees of freedom. Unpenalised, the data
    pay for all 6 + 3K parameters; penalties that pin the parameters leave none."""
    from race.analysis.joint_model import effective_parameters

    rng = np.random.default_rng(0)
    n, P = 30, 18
    Jd = rng.standard_normal((n, P))
    assert effective_parameters(np.vstack([Jd, 1e-6 * np.eye(P)]), n) == pytest.approx(P, rel=1e-6)
    assert effective_parameters(np.vstack([Jd, 1e6 * np.eye(P)]), n) == pytest.approx(0.0, abs=1e-6)
    mid = effective_parameters(np.vstack([Jd, np.eye(P)]), n)
    assert 0 < mid < P


def test_dispersion_recovers_known_overdispersion():
    """Beta-binomial points (true phi 4, 500 problems, 4 allocations x 6 points off the trend):
    phi averaged over 40 data sets within +-20% of 4 (the SE of one estimate on about 14 df is
    4 sqrt(2 / 14) = 1.5, of the mean of 40 about 0.24: the band is 3.3 SE). Counting all 6 + 3K
    = 18 parameters, as if the penalties did not shrink the allocation effects, gives about 8."""
    N4, G4, r0 = np.array([1e5, 1e5, 4e5, 4e5]), np.array([4.0, 8.0, 4.0, 8.0]), np.array([0.2, 0.2, 0.3, 0.3])
    dn, dg = np.log(N4) - np.log(N4).mean(), np.log(G4) - np.log(G4).mean()
    x, k = np.tile(np.linspace(27.0, 33.0, 6), 4), np.repeat(np.arange(4), 6)
    m = 29.5 + dn + 0.3 * dg + np.array([2.0, -2.0, -1.5, 1.5])
    A = r0 + (1 - r0) * expit(0.5 + 0.4 * dn + np.array([-1.5, 1.5, 1.0, -1.0]))
    s = 1.5 * np.exp(np.array([0.4, -0.4, 0.3, -0.3]))
    mu = r0[k] + (A - r0)[k] * expit(s[k] * (x - m[k]))
    P, phi = 500, 4.0
    rho = (phi - 1) / (P - 1)  # beta-binomial: variance P p (1 - p) (1 + (P - 1) rho)
    got = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        y = rng.binomial(P, rng.beta(mu * (1 / rho - 1), (1 - mu) * (1 / rho - 1))) / P
        got.append(fit_joint(JointData(x, k, y[None], np.full((1, len(x)), float(P)), r0[None], dn, dg)).phi)
    assert np.mean(got) == pytest.approx(phi, rel=0.2)


def test_dispersion_counts_the_effective_parameters_where_they_differ_from_6_plus_k():
    """Issue 34 (joint_model.py:209), failing first: the dispersion divides the Pearson sum by n minus
    the parameters the data pay for. With 4 points per allocation (n = 16) and allocation effects
    twice the test above's, the penalties leave about 7.3 effective parameters, so the old count
    6 + K = 10 left 6 degrees of freedom where there are about 8.7, and its phi also reweights
    the fit: over 40 beta-binomial data sets (true phi 4, 500 problems) it averaged 7.56, the
    effective count 4.57 (the fit's misfit adds a little). One estimate on about 8.7 df has SD
    about 4 sqrt(2 / 8.7) = 1.9, the mean of 40 about 0.3: the band +-30% of 4 (1.2) is 4 SE,
    and the old count lands 12 SE above the truth."""
    N4, G4, r0 = np.array([1e5, 1e5, 4e5, 4e5]), np.array([4.0, 8.0, 4.0, 8.0]), np.array([0.2, 0.2, 0.3, 0.3])
    dn, dg = np.log(N4) - np.log(N4).mean(), np.log(G4) - np.log(G4).mean()
    x, k = np.tile(np.linspace(27.0, 33.0, 4), 4), np.repeat(np.arange(4), 4)
    m = 29.5 + dn + 0.3 * dg + 2 * np.array([2.0, -2.0, -1.5, 1.5])
    A = r0 + (1 - r0) * expit(0.5 + 0.4 * dn + 2 * np.array([-1.5, 1.5, 1.0, -1.0]))
    s = 1.5 * np.exp(2 * np.array([0.4, -0.4, 0.3, -0.3]))
    mu = r0[k] + (A - r0)[k] * expit(s[k] * (x - m[k]))
    P, phi = 500, 4.0
    rho = (phi - 1) / (P - 1)
    got = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        y = rng.binomial(P, rng.beta(mu * (1 / rho - 1), (1 - mu) * (1 / rho - 1))) / P
        got.append(fit_joint(JointData(x, k, y[None], np.full((1, len(x)), float(P)), r0[None], dn, dg)).phi)
    assert np.mean(got) == pytest.approx(phi, rel=0.3)


def test_replicate_refits_spread_like_the_seed_mean():
    """Issue 34 (joint_forecast.py:60): refitting on seed-resampled replicates spreads the forecast
    by sqrt((m - 1) / m) of its standard error (2 seeds: a variance half the right one); the
    replicates get the sqrt(m / (m - 1)) correction the cell means have. With 2 seeds at one budget,
    seeds resampled only (4,000 problems: problem noise small) and the forecast read at the last
    pilot, the replicate variance of the logit forecast must match the unbiased variance of a mean
    of two, (f_0 - f_1)^2 / 4, from the joint model fitted on each seed's runs alone: measured
    0.81-1.01 of it over four studies (0.41-0.50 before the correction; a replicate variance
    from 400 replicates is within about 10% of its limit)."""
    from race.analysis.backtest import logit

    allocs_true = [Alloc("s", 1e6, r0=0.1, a=0.6, b=1.5, c_mid=3e13), Alloc("l", 4e6, r0=0.15, a=0.7, b=1.5, c_mid=8e13)]
    x = float(np.log(1e14))
    for rng in range(4):
        runs, evals = make_study(allocs_true, budgets=[1e14], seeds=(0, 1), n_problems=4000, seed_sd=0.03, rng=rng)
        sm = study_matrix(evals, runs, "greedy")
        allocs = candidate_allocations(sm, None)
        _, F, _, _ = forecast_joint(sm, draw_replicates(sm, 400, 0, over=("seeds",)), allocs, x)
        single = []
        for s in (0, 1):
            mine = runs[runs["seed"] == s]
            sm1 = study_matrix(evals[evals["run_id"].isin(mine["run_id"])], mine, "greedy")
            p1, _, _, _ = forecast_joint(sm1, draw_replicates(sm1, 2, 0, over=("seeds",)), allocs, x)
            single.append(logit(p1[allocs[0]]))  # the large model ("l" sorts first), read near its midpoint
        ratio = float(np.var(logit(F[:, 0]))) / ((single[0] - single[1]) ** 2 / 4)
        assert 0.7 <= ratio <= 1.4, (rng, ratio)
