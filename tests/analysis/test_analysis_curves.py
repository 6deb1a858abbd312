import numpy as np
import pandas as pd
import pytest

from race.analysis import SchemaError, best_reached, final_scores, learning_curves, score_at

from analysis_synth import SMALL, make_study


def _tiny():
    runs, _ = make_study([SMALL], budgets=[100.0], seeds=(0,), n_problems=0)
    evals = pd.DataFrame({
        "run_id": runs["run_id"][0], "step": [3, 1, 2], "flops": [90.0, 10.0, 50.0], "target": "greedy",
        "score": [0.5, 0.0, 1.0], "n": 2,
        "per_problem": [[0.0, 1.0], [0.0, 0.0], [1.0, 1.0]],
    })
    return runs, evals


def test_learning_curves_sorted_and_merged():
    runs, evals = _tiny()
    cur = learning_curves(evals, runs, target="greedy")
    assert list(cur["flops"]) == [10.0, 50.0, 90.0]
    assert {"budget", "allocation", "model_params"} <= set(cur.columns)
    with pytest.raises(SchemaError, match="no rows for target 'hard'"):
        learning_curves(evals, runs, target="hard")


def test_score_at_modes():
    f, s = [10.0, 50.0, 90.0], [0.2, 0.6, 0.4]  # unsorted input is sorted first
    assert score_at(f, s, 30.0) == pytest.approx(0.4)  # halfway 0.2 -> 0.6
    assert score_at(f, s, 200.0) == pytest.approx(0.4)  # clipped
    assert score_at(f, s, 70.0, "step") == pytest.approx(0.6)
    assert np.isnan(score_at(f, s, 5.0, "best"))
    assert score_at(f, s, 95.0, "best") == pytest.approx(0.6)


def test_best_reached_is_running_max():
    runs, evals = _tiny()
    cur = learning_curves(evals, runs, target="greedy")
    br = best_reached(cur, [5.0, 10.0, 60.0, 100.0])
    assert list(br["flops"]) == [10.0, 60.0, 100.0]  # nothing before the first point
    assert list(br["score"]) == [0.0, 1.0, 1.0]


def test_final_scores_last_and_interpolated_at_budget():
    runs, evals = _tiny()
    last = final_scores(evals, runs, "greedy", at="last")
    assert last["score"].iloc[0] == pytest.approx(0.5)
    # budget 100 > last point: clipped to the last point
    assert final_scores(evals, runs, "greedy", at="budget")["score"].iloc[0] == pytest.approx(0.5)
    # budget 60: a quarter of the way from (50, 1.0) to (90, 0.5); per_problem alike
    fin = final_scores(evals, runs.assign(budget=60.0), "greedy", at="budget")
    assert fin["score"].iloc[0] == pytest.approx(0.875)
    assert fin["flops"].iloc[0] == pytest.approx(60.0)
    np.testing.assert_allclose(fin["per_problem"].iloc[0], [0.75, 1.0])
    assert fin["per_problem"].iloc[0].mean() == pytest.approx(fin["score"].iloc[0])


def test_study_matrix_computes_the_learning_curves_once(monkeypatch, crossing_study):
    """Issue 37: study_matrix read the learning curves twice (once inside final_scores); once now,
    with the same matrix."""
    import race.analysis.curves as curves_mod
    import race.analysis.joint as joint_mod

    runs, evals = crossing_study
    before = joint_mod.study_matrix(evals, runs, "greedy")
    calls = []
    real = curves_mod.learning_curves

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(curves_mod, "learning_curves", counted)
    monkeypatch.setattr(joint_mod, "learning_curves", counted)
    sm = joint_mod.study_matrix(evals, runs, "greedy")
    assert len(calls) == 1
    assert np.array_equal(sm.end, before.end) and sm.points.equals(before.points)
    assert np.array_equal(sm.point_pp, before.point_pp) and sm.runs.equals(before.runs)
    # final_scores given the curves reads the same as computing them itself
    curves = real(evals, runs, target="greedy")
    assert final_scores(evals, runs, "greedy", at="equal", curves=curves).equals(final_scores(evals, runs, "greedy", at="equal"))
