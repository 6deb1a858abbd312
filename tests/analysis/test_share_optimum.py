"""Where the best update share lies (race.analysis.share_optimum.locate_best and its use in
race.analysis.update_share): located inside the range for a concave response whose peak is
inside it, in p and in p_policy, with an interval that holds the true peak; flat for a flat
response, with a spread bound that says so; an edge or not resolved otherwise, and never a
call its intervals do not support."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from analysis_synth import SMALL, make_study

from race.analysis.share_optimum import Call, locate_best, vertex_fit
from race.analysis.update_share import best_shares, share_table

BUDGET = 1e12
P = (0.30, 0.40, 0.50, 0.60, 0.70, 0.80, 0.90)


def _study(lines, seeds=(0, 1, 2), n_problems=3000, rng=0):
    """(runs, evals): per reward spec a line of allocations (one per p level, told apart by
    num_iterations) with update share p, feedback share f and true final score s."""
    allocs, truth, split = [], {}, {}
    for reward, pts in lines.items():
        for k, (p, f, s) in enumerate(pts, start=1):
            al = dataclasses.replace(SMALL, reward=reward, num_iterations=k, r0=0.3)
            allocs.append(al)
            truth[al.key], split[al.key] = s, (p, f)
    runs, evals = make_study(allocs, budgets=[BUDGET], seeds=seeds, n_points=2, n_problems=n_problems, rng=rng,
                             seed_sd=0.002, truth_override=lambda al, budget, flops: np.full(len(flops), truth[al.key]))
    keys = [f"{r.model}|G={r.num_generations}|P={r.prompts_per_step}|it={r.num_iterations}|lr={r.learning_rate:g}"
            f"|{r.reward}" for r in runs.itertuples()]
    p = np.array([split[k][0] for k in keys])
    f = np.array([split[k][1] for k in keys])
    return runs.assign(learning_flops=p * BUDGET, feedback_flops=f * BUDGET, rollout_flops=(1 - p - f) * BUDGET), evals


def test_a_concave_response_with_its_peak_inside_is_located_in_p_and_p_policy():
    """A rule line peaking at p = 0.55 and a PRM line (feedback 10% of the FLOPs) peaking at
    p = 0.45, i.e. p_policy = 0.45 / 0.9 = 0.5: both located inside the range, each interval
    holding its true peak and strictly inside the bracket of points below the best."""
    rule = [(p, 0.0, 0.62 - 1.5 * (p - 0.55) ** 2) for p in P]
    prm = [(p * 0.9, 0.1, 0.60 - 1.5 * (p * 0.9 - 0.45) ** 2) for p in P]
    runs, evals = _study({"rule:partial": rule, "prm:prm-s": prm})
    table, boot = share_table(evals, runs, "greedy", n_boot=400, rng=0)
    got = {b.reward: b for b in best_shares(table, boot)}
    for reward, peak, pol_peak in (("rule:partial", 0.55, 0.55), ("prm:prm-s", 0.45, 0.50)):
        b = got[reward]
        for call, true in ((b.in_p, peak), (b.in_p_policy, pol_peak)):
            assert call.call == Call.LOCATED, call.text()
            assert call.lo <= true <= call.hi and call.x_min < call.lo and call.hi < call.x_max
            assert abs(call.x - true) < 0.06
            assert call.text().startswith(f"located inside the range: best {call.coord} {call.x:.2f} [")
        # the ends are below the best beyond the noise: the calls' brackets come from points the best beats
        assert b.in_p.below is not None and b.in_p.above is not None and b.worse
    d = got["prm:prm-s"].to_dict()
    assert d["in_p"]["call"] == "located" and d["in_p_policy"]["text"].startswith("located inside the range")


def test_a_flat_response_is_called_flat_with_a_spread_bound_inside_the_margin():
    """Every p scores the true 0.55: no point below the best beyond the noise and, with 3
    seeds x 40,000 problems, the 95% bound on the largest difference between points is under
    the 0.02 margin. With 300 problems the same world is not resolved (too wide to say flat)."""
    runs, evals = _study({"rule:partial": [(p, 0.0, 0.55) for p in P]}, n_problems=40000, rng=4)
    table, boot = share_table(evals, runs, "greedy", n_boot=300, rng=0)
    [b] = best_shares(table, boot)
    assert b.in_p.call == Call.FLAT and b.in_p_policy.call == Call.FLAT, b.in_p.text()
    assert b.in_p.spread_hi <= b.in_p.margin and len(b.in_p.plausible) == len(P)
    assert b.in_p.text().startswith("flat across p 0.30-0.90")
    runs, evals = _study({"rule:partial": [(p, 0.0, 0.55) for p in P]}, n_problems=300, rng=4)
    table, boot = share_table(evals, runs, "greedy", n_boot=300, rng=0)
    [wide] = best_shares(table, boot)
    assert wide.in_p.call == Call.UNRESOLVED and wide.in_p.spread_hi > wide.in_p.margin
    assert "not resolved" in wide.in_p.text()


def _reps(y, sd, n=2000, seed=0):
    """Paired replicates of scores ``y``: independent normal noise of ``sd`` per point."""
    y = np.asarray(y, float)
    return y + np.random.default_rng(seed).normal(0.0, sd, size=(n, y.size))


def test_edges_and_resolution_are_called_from_the_intervals():
    x = np.array(P)
    falling = 0.7 - 0.3 * (x - 0.3)  # best at the smallest p, the others below it beyond a 0.005 noise
    e = locate_best(x, falling, _reps(falling, 0.005))
    assert e.call == Call.EDGE_LOW and e.above == pytest.approx(0.4) and e.below is None
    rising = falling[::-1]
    assert locate_best(x, rising, _reps(rising, 0.005)).call == Call.EDGE_HIGH
    # the same peaked response: located with noise 0.005, not with noise 0.2 (nothing beyond the noise)
    peaked = 0.6 - 2 * (x - 0.6) ** 2
    assert locate_best(x, peaked, _reps(peaked, 0.005)).call == Call.LOCATED
    noisy = locate_best(x, peaked, _reps(peaked, 0.2))
    assert noisy.call == Call.UNRESOLVED and noisy.lo is None and len(noisy.plausible) == len(P)
    # three points, middle best: located by its bracket (no fit through three points)
    three = locate_best([0.4, 0.6, 0.8], [0.5, 0.6, 0.5], _reps([0.5, 0.6, 0.5], 0.005))
    assert (three.call, three.how, three.x, three.lo, three.hi) == (Call.LOCATED, "bracket", 0.6, 0.4, 0.8)
    with pytest.raises(ValueError, match="must be"):
        locate_best(x, peaked, _reps(peaked, 0.01)[:, :3])


def test_the_vertex_fit_refits_every_replicate():
    x = np.array(P)
    y = 0.6 - 2 * (x - 0.62) ** 2
    v, lo, hi, frac = vertex_fit(x, y, _reps(y, 0.002))
    assert v == pytest.approx(0.62, abs=1e-9) and lo < 0.62 < hi and frac == 1.0
    assert vertex_fit(x, -y, _reps(-y, 0.002)) is None  # opens upward: no maximum


def test_a_plateau_then_a_drop_is_not_located_by_the_quadratic_alone():
    """Flat at 0.62 up to p 0.6, then falling: a quadratic through the points has its vertex
    inside the range, but nothing below the best's p scores below it beyond the noise, so the
    model-free call is the low edge, the fit's vertex is not called located, and a note names it."""
    shape = (0.62, 0.62, 0.62, 0.62, 0.55, 0.45, 0.30)
    runs, evals = _study({"rule:partial": list(zip(P, (0.0,) * len(P), shape))})
    table, boot = share_table(evals, runs, "greedy", n_boot=400, rng=0)
    [b] = best_shares(table, boot)
    assert b.in_p.call == Call.EDGE_LOW and b.in_p.above is not None
    # the pilot best is one of the plateau's points (noise picks which): the positional fallback, not located
    assert b.status in ("bracketed", "edge") and b.method == "pilot-best fallback" and b.coef[0] < 0
    assert any("quadratic's vertex" in n and "not called located" in n and "its low side" in n for n in b.notes)
