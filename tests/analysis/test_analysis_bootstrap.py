import numpy as np
import pandas as pd
import pytest

from race.analysis import bootstrap_cells, difference, draw_replicates, final_scores, study_matrix, win_probabilities

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
    """The unit is the run: one seed count per run, drawn within its (allocation, budget),
    and adding checkpoints to the runs changes no count."""
    runs, evals = make_study([SMALL, LARGE], budgets=[1e14, 1e15], n_points=4, n_problems=50, rng=3)
    sm = study_matrix(evals, runs, "greedy")
    reps = draw_replicates(sm, 80, 0)
    assert reps.counts.shape == (80, len(sm.runs)) and len(sm.points) == 4 * len(sm.runs)
    for idx in reps.strata.values():
        np.testing.assert_array_equal(reps.counts[:, idx].sum(axis=1), len(idx))
    assert reps.counts.std() > 0
    runs2, evals2 = make_study([SMALL, LARGE], budgets=[1e14, 1e15], n_points=9, n_problems=50, rng=3)
    sm2 = study_matrix(evals2, runs2, "greedy")
    np.testing.assert_array_equal(draw_replicates(sm2, 80, 0).counts, reps.counts)


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


def _seed_trajectory_study(drop_one: bool = False):
    """Two allocations x 3 budgets x 3 seeds, no problem noise, where a seed's offset is
    the same at every budget (one trajectory per seed, as prefixes of one run are)."""
    from analysis_synth import LARGE, SMALL, make_study

    runs, evals = make_study([SMALL, LARGE], [1e12, 1e13, 1e14], seeds=(0, 1, 2), n_problems=0, seed_sd=0.0,
                             step0=False)
    offset = {0: -0.04, 1: 0.01, 2: 0.05}
    seed_of = dict(zip(runs["run_id"], runs["seed"]))
    evals = evals.assign(score=evals["score"] + evals["run_id"].map(seed_of).map(offset))
    if drop_one:
        gone = runs["run_id"].iloc[1]  # SMALL, first budget, seed 1
        runs, evals = runs[runs["run_id"] != gone], evals[evals["run_id"] != gone]
    return study_matrix(evals, runs, "greedy")


def test_a_seed_is_resampled_as_one_trajectory_across_budgets():
    """The seed bootstrap draws seeds per allocation, shared by its budgets: a seed's
    offset common to every budget cancels in a difference between budgets (independent
    draws per budget would give that difference the seeds' spread)."""
    sm = _seed_trajectory_study()
    reps = draw_replicates(sm, 500, 0, over=("seeds",))
    vals = np.tile(sm.end, (reps.n, 1))
    for model in ("s", "l"):
        cells = [sm.runs.index[(sm.runs["model"] == model) & (sm.runs["budget"] == b)].to_numpy()
                 for b in (1e12, 1e13, 1e14)]
        means = [reps.cell_mean(vals, c) for c in cells]
        assert np.std(means[0]) > 0.01  # the seeds do spread each cell's mean
        # the same seeds at every budget: differences are exact up to float rounding
        assert np.max(np.abs((means[2] - means[0]) - (means[2] - means[0]).mean())) < 1e-12


def test_a_cell_with_other_seeds_is_resampled_on_its_own():
    sm = _seed_trajectory_study(drop_one=True)
    reps = draw_replicates(sm, 500, 0, over=("seeds",))
    small = sm.runs.index[(sm.runs["model"] == "s") & (sm.runs["budget"] == 1e12)].to_numpy()
    assert len(small) == 2
    np.testing.assert_array_equal(reps.counts[:, small].sum(axis=1), 2)  # its own 2 seeds
    big = sm.runs.index[(sm.runs["model"] == "s") & (sm.runs["budget"] == 1e14)].to_numpy()
    np.testing.assert_array_equal(reps.counts[:, big].sum(axis=1), 3)
