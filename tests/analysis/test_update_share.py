"""The update share p = C_learning / C_total in the analysis (race.analysis.update_share): p
and p_policy from the counted FLOP columns, the best p per reward system located with an
interval where the response has an interior maximum, the pilot-best fallback (bracketed or
on the grid's edge) where it does not, and the regime in the seed's terms, "not identified"
where the response is flat within the noise."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from analysis_synth import SMALL, make_study

from race.analysis.update_share import (
    MIN_LEVELS,
    Regime,
    best_shares,
    regime_of,
    run_shares,
    share_shift,
    share_table,
)

BUDGET = 1e12


def _study(lines: dict[str, dict[int, tuple[float, float, float]]], seeds=(0, 1, 2), n_problems=3000, rng=0):
    """(runs, evals): per reward spec, per num_iterations k, an allocation with update share
    p, feedback share f and true final score s (read at every evaluation point), p / f set
    on the runs' counted FLOP columns."""
    allocs, truth, split = [], {}, {}
    for reward, pts in lines.items():
        for k, (p, f, s) in pts.items():
            al = dataclasses.replace(SMALL, reward=reward, num_iterations=k, r0=0.3)
            allocs.append(al)
            truth[al.key], split[al.key] = s, (p, f)

    def score(al, budget, flops):
        return np.full(len(flops), truth[al.key])

    runs, evals = make_study(allocs, budgets=[BUDGET], seeds=seeds, n_points=2, n_problems=n_problems, rng=rng,
                             seed_sd=0.002, truth_override=score)
    keys = [f"{r.model}|G={r.num_generations}|P={r.prompts_per_step}|it={r.num_iterations}|lr={r.learning_rate:g}"
            f"|{r.reward}" for r in runs.itertuples()]
    p = np.array([split[k][0] for k in keys])
    f = np.array([split[k][1] for k in keys])
    runs = runs.assign(learning_flops=p * BUDGET, feedback_flops=f * BUDGET, rollout_flops=(1 - p - f) * BUDGET)
    return runs, evals


def test_p_is_the_learning_share_of_the_counted_flops():
    runs, _ = _study({"rule": {1: (0.6, 0.0, 0.5), 2: (0.8, 0.0, 0.5)}, "prm:prm-s": {1: (0.45, 0.3, 0.5)}},
                     seeds=(0,))
    runs.loc[0, ["rollout_flops", "learning_flops", "feedback_flops"]] = [3e11, 5e11, 2e11]
    sh = run_shares(runs).set_index("run_id")
    r0 = sh.loc[runs.loc[0, "run_id"]]
    assert r0["p"] == pytest.approx(5 / 10, rel=1e-12) and r0["p_policy"] == pytest.approx(5 / 8, rel=1e-12)
    assert r0["search_share"] == pytest.approx(0.3) and r0["feedback_share"] == pytest.approx(0.2)
    prm = sh[sh["reward"] == "prm:prm-s"].iloc[0]
    assert prm["p"] == pytest.approx(0.45) and prm["p_policy"] == pytest.approx(0.45 / 0.70)


def test_an_interior_maximum_is_located_with_its_interval():
    """Five p levels, score 0.6 - 5 (p - 0.72)^2, 3,000 problems x 3 seeds: the vertex is
    located inside the range, its interval covers 0.72, the regime is update-heavy."""
    pts = {k: (p, 0.0, 0.6 - 5 * (p - 0.72) ** 2) for k, p in enumerate((0.5, 0.6, 0.7, 0.8, 0.9), start=1)}
    runs, evals = _study({"rule": pts})
    table, boot = share_table(evals, runs, "greedy", n_boot=400, rng=0)
    [b] = best_shares(table, boot)
    assert b.status == "located" and b.method == "local fit" and b.frac_valid >= 0.9
    assert 0.5 < b.lo <= 0.72 <= b.hi < 0.9 and abs(b.p - 0.72) < 0.05
    assert b.regime is Regime.UPDATE_HEAVY and not b.flat
    assert b.text().startswith(f"{b.p:.2f} [")


def test_best_at_the_edge_falls_back_to_the_pilot_best_and_a_bracket_is_named():
    """Score falling with p (best at the smallest p): on the grid's edge, pilot-best
    fallback. Three levels with the middle best: bracketed between its neighbours (three
    points cannot locate a vertex). A PRM line below p = 0.5 with more reward than rollout:
    feedback-heavy."""
    falling = {k: (p, 0.0, 0.7 - 0.5 * (p - 0.5)) for k, p in enumerate((0.5, 0.6, 0.7, 0.8), start=1)}
    peaked = {k: (p, 0.0, s) for k, (p, s) in enumerate(((0.6, 0.50), (0.7, 0.62), (0.8, 0.50)), start=1)}
    prm = {k: (p, 0.4, s) for k, (p, s) in enumerate(((0.35, 0.62), (0.45, 0.52), (0.55, 0.45)), start=1)}
    runs, evals = _study({"rule:outcome": falling, "rule:partial": peaked, "prm:prm-s": prm})
    table, boot = share_table(evals, runs, "greedy", n_boot=300, rng=0)
    best = {b.reward: b for b in best_shares(table, boot)}
    edge = best["rule:outcome"]
    assert (edge.status, edge.method, edge.p, edge.lo) == ("edge", "pilot-best fallback", pytest.approx(0.5), None)
    assert "smallest p tried, 0.50" in edge.text() and edge.regime is Regime.UPDATE_HEAVY
    br = best["rule:partial"]
    assert br.status == "bracketed" and (br.lo, br.hi) == (pytest.approx(0.6), pytest.approx(0.8))
    assert br.text() == "pilot best 0.70, p tried on both sides (0.60, 0.80); not located"
    assert len({0.6, 0.7, 0.8}) < MIN_LEVELS
    assert br.in_p.call == "located" and br.in_p.how == "bracket" and (br.in_p.lo, br.in_p.hi) == pytest.approx((0.6, 0.8))
    low = best["prm:prm-s"]
    assert low.status == "edge" and low.regime is Regime.FEEDBACK_HEAVY  # p 0.35, feedback 0.40, search 0.25
    shift = share_shift(list(best.values()))
    row = shift[shift["reward"] == "rule:outcome"].iloc[0]
    assert row["d_p"] == pytest.approx(0.5 - 0.35) and row["reference"] == best["prm:prm-s"].line


def test_a_flat_response_is_not_identified():
    """Every allocation scores the same true 0.55 (differences are sampling noise): no
    allocation is below the best beyond the noise, so the regime is not identified (the
    pilot best is still named, as the fallback)."""
    flat = {k: (p, 0.0, 0.55) for k, p in enumerate((0.5, 0.6, 0.7, 0.8), start=1)}
    runs, evals = _study({"rule": flat}, n_problems=400, rng=3)
    table, boot = share_table(evals, runs, "greedy", n_boot=300, rng=0)
    [b] = best_shares(table, boot)
    assert b.flat and b.regime is Regime.NOT_IDENTIFIED and b.worse == []
    assert b.best_allocation in set(table["allocation"]) and b.status in ("located", "bracketed", "edge")


def test_regime_thresholds():
    assert regime_of(0.5, 0.5, 0.0) is Regime.UPDATE_HEAVY
    assert regime_of(0.49, 0.3, 0.21) is Regime.SEARCH_HEAVY
    assert regime_of(0.45, 0.25, 0.30) is Regime.FEEDBACK_HEAVY
    assert str(Regime.NOT_IDENTIFIED) == "not identified"


def test_group_size_is_a_knob_of_a_pods_line_only():
    """PODS allocations (num_update_generations set) that differ in n are one line, so m = 2 of
    n = 12 and of n = 24 sit on one p axis; allocations that train on their whole group keep
    their group size in the line's name (a group-size study is two lines), and a study whose
    PODS rows share one n keeps it in the name too."""
    runs, _ = _study({"rule": {1: (0.6, 0.0, 0.5)}}, seeds=(0,))
    row = runs.iloc[[0]]
    pods = [row.assign(num_generations=n, axis_num_update_generations=2.0, run_id=f"p{n}") for n in (12, 24, 48)]
    plain = [row.assign(num_generations=n, axis_num_update_generations=np.nan, run_id=f"g{n}") for n in (4, 8)]
    sh = run_shares(pd.concat(pods + plain, ignore_index=True)).set_index("run_id")
    assert sh.loc["p12", "line"] == sh.loc["p24", "line"] == sh.loc["p48", "line"]
    assert "G=*" in sh.loc["p12", "line"]
    assert sh.loc["g4", "line"] != sh.loc["g8", "line"] and "G=4" in sh.loc["g4", "line"]
    one_n = run_shares(pd.concat([p.assign(num_generations=12) for p in pods], ignore_index=True))
    assert one_n["line"].nunique() == 1 and "G=12" in one_n["line"].iloc[0]
