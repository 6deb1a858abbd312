"""Seed offsets that wander along a trajectory (World.seed_walk): the random-walk variant of both
generators, for the racing benchmark; fixed offsets (seed_walk 0) are drawn exactly as before."""

import numpy as np
import pytest

from race.analysis.synthetic import random_world
from race.analysis.synthetic_rl import rl_world


def test_walk_is_stationary_with_the_stated_correlation():
    """OU in ln C: N(0, 1) at every point, corr exp(-d / L). Over 4,000 runs the sample correlation
    at d = 1 with L = 0.5 (exp(-2) = 0.135) is within 0.05 (its SE is about 0.016)."""
    w = random_world(1001)
    w.seed_walk = 0.5
    flops = [np.e**20, np.e**21, np.e**23]
    z = np.array([w.offsets(float(z0), flops, k % 4, k) for k, z0 in enumerate(np.random.default_rng(0).standard_normal(4000))])
    assert np.std(z, axis=0) == pytest.approx([1.0, 1.0, 1.0], abs=0.05)
    assert np.corrcoef(z[:, 0], z[:, 1])[0, 1] == pytest.approx(np.exp(-2.0), abs=0.05)
    assert np.corrcoef(z[:, 1], z[:, 2])[0, 1] == pytest.approx(np.exp(-4.0), abs=0.05)
    w.seed_walk = 0.0
    assert np.array_equal(w.offsets(0.7, flops, 0, 0), np.full(3, 0.7))


@pytest.mark.parametrize("make", [random_world, rl_world], ids=["tune", "test"])
def test_walk_changes_a_trajectory_after_its_first_point_only(make):
    w = make(3)
    flops = [0.0, 1e10, 3e10, 1e11, 3e11, 1e12]
    k = 1
    fixed = w.trajectory(k, 0, flops)
    w.seed_walk = 0.5
    walked = w.trajectory(k, 0, flops)
    assert np.array_equal(fixed[0][1], walked[0][1]) and np.array_equal(fixed[1][1], walked[1][1])
    assert any(not np.array_equal(a[1], b[1]) for a, b in zip(fixed[2:], walked[2:]))
    assert w.to_dict()["seed_walk"] == 0.5 and type(w).from_dict(w.to_dict()).seed_walk == 0.5
