import dataclasses

import numpy as np
import pytest

from race.analysis import allocation_scores, final_scores, frontier, frontier_envelope

from analysis_synth import LARGE, SMALL, Alloc, make_study

BASE = Alloc("m", 4e6, r0=0.05, a=0.50, b=1.2, c_mid=1e14)
PLANTED = dataclasses.replace(BASE, num_generations=16, a=0.65)  # the best at every budget
OTHERS = [dataclasses.replace(BASE, learning_rate=3e-5, a=0.45), dataclasses.replace(BASE, num_iterations=2, a=0.52)]


def test_planted_best_allocation_is_found_at_every_budget():
    runs, evals = make_study([BASE, PLANTED, *OTHERS], budgets=[1e14, 1e15, 1e16], n_problems=300, rng=4)
    fr = frontier(evals, runs, "greedy")
    assert list(fr["budget"]) == [1e14, 1e15, 1e16]
    assert set(fr["allocation"]) == {PLANTED.key}
    assert (fr["n_allocations"] == 4).all() and (fr["n_seeds"] == 3).all()
    assert (fr["score"] > fr["runner_up_score"]).all()


def test_frontier_conditions_on_reward_system_and_ignores_random_control():
    prm = dataclasses.replace(BASE, reward="prm:prm-s", a=0.75)
    rnd = dataclasses.replace(BASE, reward="random", a=0.95)
    runs, evals = make_study([BASE, PLANTED, prm, rnd], budgets=[1e15], n_problems=0, rng=5)
    fr = frontier(evals, runs, "greedy")
    by_sys = dict(zip(fr["reward_system"], fr["allocation"]))
    assert by_sys == {"prm": prm.key, "rule": PLANTED.key}
    overall = frontier(evals, runs, "greedy", condition_on=None)
    assert list(overall["allocation"]) == [prm.key]
    with_random = frontier(evals, runs, "greedy", condition_on=None, exclude_random=False)
    assert list(with_random["allocation"]) == [rnd.key]


def test_allocation_scores_aggregate_seeds():
    runs, evals = make_study([SMALL, LARGE], budgets=[1e14], n_problems=0, seed_sd=0.02, rng=6)
    fin = final_scores(evals, runs, "greedy")
    sc = allocation_scores(fin)
    row = sc[sc["allocation"] == SMALL.key].iloc[0]
    vals = fin.loc[fin["allocation"] == SMALL.key, "score"]
    assert row["score"] == np.mean(vals) and row["n_seeds"] == 3
    assert row["sem"] == pytest.approx(np.std(vals, ddof=1) / np.sqrt(3))


def test_envelope_is_monotone_and_switches_from_small_to_large(crossing_study):
    runs, evals = crossing_study
    env = frontier_envelope(evals, runs, "greedy", condition_on=None, n_grid=30)
    assert (np.diff(env["score"].to_numpy()) >= -1e-12).all()
    assert env["allocation"].iloc[0] == SMALL.key
    assert env["allocation"].iloc[-1] == LARGE.key
    # at its end the envelope is the large model's final seed-mean score at 1e16
    fin = final_scores(evals, runs, "greedy")
    top = fin[(fin["allocation"] == LARGE.key) & (fin["budget"] == 1e16)]["score"].mean()
    assert env["score"].iloc[-1] >= top - 1e-12
