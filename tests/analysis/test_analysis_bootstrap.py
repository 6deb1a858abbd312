import numpy as np
import pandas as pd
import pytest

from race.analysis import bootstrap_cells, difference, final_scores, win_probabilities

from analysis_synth import LARGE, SMALL, make_study


def _finals():
    runs, evals = make_study([SMALL, LARGE], budgets=[1e15], n_problems=600, rng=3)
    return final_scores(evals, runs, "greedy"), runs, evals


def test_same_seed_same_replicates_and_sorted_cells():
    fin, _, _ = _finals()
    a = bootstrap_cells(fin, n_boot=200, rng=7)
    b = bootstrap_cells(fin.sample(frac=1.0, random_state=1), n_boot=200, rng=7)  # row order irrelevant
    np.testing.assert_array_equal(a.reps, b.reps)
    c = bootstrap_cells(fin, n_boot=200, rng=8)
    assert not np.array_equal(a.reps, c.reps)
    assert list(a.cells["allocation"]) == sorted(a.cells["allocation"])


def test_problem_indices_are_shared_across_runs():
    fin, _, _ = _finals()
    twin = fin.iloc[[0]].copy()
    twin["run_id"] = "twin"
    twin["allocation"] = "twin-allocation"
    both = pd.concat([fin, twin])
    bs = bootstrap_cells(both, ["allocation", "run_id"], n_boot=100, rng=0, over=("problems",))
    i = bs.index_of(allocation=fin["allocation"].iloc[0], run_id=fin["run_id"].iloc[0])
    j = bs.index_of(allocation="twin-allocation", run_id="twin")
    np.testing.assert_array_equal(bs.reps[:, i], bs.reps[:, j])  # same problems drawn for both
    assert bs.reps[:, i].std() > 0


def test_seed_bootstrap_without_problems_and_single_seed_note():
    fin, _, _ = _finals()
    one = fin.groupby("allocation").head(1)
    bs = bootstrap_cells(one, n_boot=50, rng=0, over=("seeds",))
    np.testing.assert_allclose(bs.reps.std(axis=0), 0.0, atol=1e-12)
    assert any("single seed" in n for n in bs.notes)


def test_checkpoints_are_not_resampled():
    """Extra intermediate evaluation points change nothing: the unit is the run."""
    fin, runs, evals = _finals()
    extra = evals.assign(flops=evals["flops"] * 0.5, step=evals["step"] - 5, score=0.0)
    extra["per_problem"] = [list(np.zeros(600))] * len(extra)
    fin2 = final_scores(pd.concat([evals, extra]), runs, "greedy")
    a = bootstrap_cells(fin, n_boot=100, rng=0)
    b = bootstrap_cells(fin2, n_boot=100, rng=0)
    np.testing.assert_array_equal(a.reps, b.reps)


def test_interval_contains_truth_and_difference_ties():
    fin, _, _ = _finals()
    bs = bootstrap_cells(fin, n_boot=400, rng=0)
    iv = bs.intervals(0.95)
    for al in (SMALL, LARGE):
        row = iv[iv["allocation"] == al.key].iloc[0]
        assert row["lo"] <= float(al.truth(1e15)) <= row["hi"]
    i, j = bs.index_of(allocation=LARGE.key), bs.index_of(allocation=SMALL.key)
    d = difference(bs.cells["score"][i], bs.cells["score"][j], bs.reps[:, i], bs.reps[:, j])
    assert not d.tie and d.lo > 0 and d.p_greater > 0.97
    same = difference(0.5, 0.5, bs.reps[:, i], bs.reps[:, i] + np.linspace(-0.01, 0.01, 400))
    assert same.tie


def test_win_probabilities_split_ties():
    reps = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(win_probabilities(reps), [0.625, 0.375])
    with pytest.raises(ValueError, match="over"):
        bootstrap_cells(_finals()[0], over=("checkpoints",))
