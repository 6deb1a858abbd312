"""benchmarks/prefix_vs_short.py's paired interval: exact where the arithmetic is exact,
and it resamples problems and seeds (a difference carried by one problem or one seed is
not certain)."""

from __future__ import annotations

import numpy as np


def test_identical_outcomes_give_a_zero_interval_and_a_constant_shift_its_value(load_script):
    b = load_script("benchmarks/prefix_vs_short.py")
    assert b.paired_interval(np.zeros((3, 50))) == (0.0, 0.0, 0.0)
    # a replicate sums S x P weighted terms whose weights add to 1: rounding below 1e-12
    mean, lo, hi = b.paired_interval(np.full((3, 40), 0.25))
    assert np.allclose([mean, lo, hi], 0.25, rtol=0, atol=1e-12)


def test_one_problem_or_one_seed_does_not_make_a_difference_certain(load_script):
    b = load_script("benchmarks/prefix_vs_short.py")
    d = np.zeros((3, 100))
    d[:, 7] = 1.0  # every seed better on one problem of 100
    mean, lo, hi = b.paired_interval(d)
    assert abs(mean - 0.01) < 1e-12 and abs(lo) < 1e-12 and hi > mean  # resampling problems can drop it
    d = np.zeros((3, 100))
    d[1] = 1.0  # one seed better on every problem
    mean, lo, hi = b.paired_interval(d)
    # resampling seeds: 0 to 3 copies of it
    assert abs(mean - 1 / 3) < 1e-12 and abs(lo) < 1e-12 and abs(hi - 1.0) < 1e-12
