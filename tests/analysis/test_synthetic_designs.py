"""Pilot designs of the known worlds (race.analysis.synthetic.world_tables): flat runs unchanged,
nested runs read at their prefixes as the grid store writes them, the equal-compute seeds."""

import numpy as np
import pytest

from race.analysis.joint import seed_clusters, study_matrix
from race.analysis.synthetic import (DESIGNS, World, design_compute, equal_compute_seeds, nested_tables,
                                     random_world, world_tables)
from race.analysis.synthetic_rl import rl_world

# A hard copy of the flat tables as the code before the designs were added wrote them (run id,
# step, counted FLOPs, problems solved): the benchmark's past runs depend on these draws.
FLAT_ROWS = {
    "world-3": (36, 144, [("small-G4-7.6e+10-s0", 0, 0.0, 183), ("small-G4-7.6e+10-s1", 3, 75781727251.46825, 190),
                          ("large-G8-4.45e+11-s2", 3, 405977411208.83026, 215)]),
    "rlworld-5": (24, 96, [("small-G4-6.58e+10-s0", 0, 0.0, 271), ("small-G4-6.58e+10-s1", 3, 53596979845.36587, 344),
                           ("large-G8-5.38e+11-s1", 3, 527114046861.7222, 428)]),
}


@pytest.mark.parametrize("world", [random_world(3), rl_world(5)], ids=lambda w: w.name)
def test_flat_tables_unchanged(world):
    runs, evals = world_tables(world)
    n_runs, n_evals, rows = FLAT_ROWS[world.name]
    assert (len(runs), len(evals)) == (n_runs, n_evals)
    assert "prefix_of" not in runs.columns
    for i, (rid, step, flops, solved) in zip((0, 7, len(evals) - 1), rows):
        r = evals.iloc[i]
        assert (r.run_id, r.step, sum(r.per_problem)) == (rid, step, solved)
        assert r.flops == pytest.approx(flops, rel=1e-12, abs=0.0)
    runs2, evals2 = world_tables(world, design="flat")  # the explicit default is the same call
    assert runs.equals(runs2) and evals.equals(evals2)


@pytest.mark.parametrize("world", [random_world(3), rl_world(5), rl_world(11)], ids=lambda w: w.name)
def test_nested_prefix_rows_are_the_long_runs_points(world):
    runs, evals = world_tables(world, design="nested")
    budgets = sorted(world.budgets)
    longs = runs[runs["prefix_of"].isna()]
    prefixes = runs[runs["prefix_of"].notna()]
    assert len(longs) == len(world.allocations) * len(world.seeds)
    assert np.allclose(longs["budget"].to_numpy(float), budgets[-1], rtol=0.0)
    assert len(prefixes) == len(longs) * (len(budgets) - 1)
    pts = {rid: g.sort_values("step") for rid, g in evals.groupby("run_id")}
    for _, p in prefixes.iterrows():
        i = int(p["run_id"].rsplit(".p", 1)[1])
        assert p["run_id"] == f"{p['prefix_of']}.p{i}" and p["budget"] == budgets[i]
        long, short = pts[p["prefix_of"]], pts[p["run_id"]]
        stop = short["flops"].iloc[-1]
        assert 0.0 < stop <= p["budget"] and p["total_flops"] == stop
        head = long[long["flops"] <= stop]
        # the prefix's points ARE the long run's points up to where the smaller budget stops
        assert len(head) == len(short) and stop in set(long["flops"])
        assert np.array_equal(head["flops"].to_numpy(), short["flops"].to_numpy())
        assert np.array_equal(head["step"].to_numpy(), short["step"].to_numpy())
        assert np.array_equal(np.vstack(head["per_problem"].tolist()), np.vstack(short["per_problem"].tolist()))
        assert long.iloc[-1]["flops"] > stop  # the long run goes on past it
    # the long run: step 0, its own n_points and one stopping point per smaller budget
    assert all(len(pts[rid]) == 1 + world.n_points + len(budgets) - 1 for rid in longs["run_id"])


def test_trajectory_is_one_run():
    w = random_world(3)
    own, stops = w.nested_schedule(0, 1)
    flops = [0.0] + sorted(own + stops)
    full, head = w.trajectory(0, 1, flops), w.trajectory(0, 1, flops[:3])
    for (c1, o1), (c2, o2) in zip(head, full):  # evaluating it further does not change its past
        assert c1 == c2 and np.array_equal(o1, o2)
    # one seed offset for the whole run: across seeds, a run's score at the smallest budget's
    # stop and at its end move together when the seed spread dominates; a flat design's runs
    # of the two budgets are independent draws
    big = World(**{**w.to_dict(), "seed_sd": 1.0, "n_problems": 300})
    nested, flat = [], []
    for s in range(40):
        o, st = big.nested_schedule(0, s)
        t = big.trajectory(0, s, [0.0] + sorted(o + st))
        nested.append((t[1][1].mean(), t[-1][1].mean()))
        a, b = big.run_outcomes(0, big.budgets[0], s), big.run_outcomes(0, big.budgets[-1], s)
        flat.append((a[-1][1].mean(), b[-1][1].mean()))
    r_nested = np.corrcoef(np.array(nested).T)[0, 1]
    r_flat = np.corrcoef(np.array(flat).T)[0, 1]
    assert r_nested > 0.7 and abs(r_flat) < 0.6, (r_nested, r_flat)


def test_rl_trajectory_bonus_only_at_the_end():
    from race.analysis.synthetic_rl import rl_mean

    w = next(rl_world(s) for s in range(200) if rl_world(s).allocations[0]["spec"]["bonus"] > 0.025)
    w.seed_sd, w.collapse_p, w.n_problems = 0.0, 0.0, 20000  # no seed spread: the means show the bonus
    own, stops = w.nested_schedule(0, 0)
    flops = [0.0] + sorted(own + stops)
    spec = w.allocations[0]["spec"]
    means = np.array([float(rl_mean(spec, c, end_of_run=(i == len(flops) - 1))) for i, c in enumerate(flops)])
    assert means[-1] - float(rl_mean(spec, flops[-1])) == pytest.approx(spec["bonus"], abs=1e-12)
    got = np.array([o.mean() for _, o in w.trajectory(0, 0, flops)])
    # a 20,000-problem mean is within 0.012 of its population mean (sd about 0.005 with the model's
    # shared latent z); a bonus (> 0.025) at every point, or at none, would put a point 0.013+ off
    assert np.all(np.abs(got - means) < 0.012), got - means


def test_equal_compute_seeds_arithmetic():
    assert equal_compute_seeds(2, [1.0, 2.0, 4.0]) == 3  # floor(2 x 7 / 4 = 3.5)
    assert equal_compute_seeds(2, [1.0, 1.0, 2.0]) == 4  # 2 x 4 / 2 exactly: not rounded down to 3
    assert equal_compute_seeds(3, [1.0, 10**0.5, 10.0]) == 4  # floor(3 x 14.16 / 10 = 4.25)
    assert equal_compute_seeds(3, [1e11, 1e11 * 4**0.5, 4e11]) == 5  # floor(3 x 7 / 4 = 5.25)
    with pytest.raises(ValueError, match="n_seeds >= 1"):
        equal_compute_seeds(0, [1.0, 2.0])
    for s in range(20):
        w = rl_world(s)
        m = equal_compute_seeds(len(w.seeds), w.budgets)
        runs, _ = world_tables(w, "nested-equal-compute")
        assert runs["seed"].nunique() == m and len(runs) == 4 * m * 3
        flat, nested = design_compute(w, "flat"), design_compute(w, "nested-equal-compute")
        assert nested <= flat * (1 + 1e-12) and flat - nested < 4 * max(w.budgets)  # within one seed's run each
        assert design_compute(w, "nested") == pytest.approx(flat * max(w.budgets) / sum(w.budgets), rel=1e-12)
    with pytest.raises(ValueError, match="design must be one of"):
        world_tables(rl_world(0), "staggered")
    assert DESIGNS == ("flat", "nested", "nested-equal-compute", "nested-split", "flat-trajectory", "nested-dense")
    assert design_compute(rl_world(0), "nested-split") == design_compute(rl_world(0), "nested")


def test_nested_tables_resampled_as_one_trajectory():
    """The joint bootstrap draws a seed's prefix rows and long run together (joint.seed_clusters)."""
    w = rl_world(7)
    runs, evals = nested_tables(w, [0, 1, 2])
    sm = study_matrix(evals, runs, "greedy")
    clusters = seed_clusters(sm, sm.strata())
    assert len(clusters) == len(w.allocations)
    for cl in clusters:
        assert len(cl) == 3  # the three budgets of one allocation
        rows = [sm.runs.loc[idx] for idx in cl]
        assert all(list(r["seed"]) == [0, 1, 2] for r in rows) and len({r["allocation"].iloc[0] for r in rows}) == 1


def test_nested_split_holds_each_point_once():
    """The diagnostic design: the same runs, each trajectory point after step 0 in one row only."""
    w = rl_world(5)
    runs, evals = world_tables(w, "nested")
    runs_s, evals_s = world_tables(w, "nested-split")
    assert list(runs["run_id"]) == list(runs_s["run_id"]) and runs["total_flops"].equals(runs_s["total_flops"])
    pos, pos_s = evals[evals["flops"] > 0], evals_s[evals_s["flops"] > 0]
    longs = set(runs.loc[runs["prefix_of"].isna(), "run_id"])
    # split: no point repeated; together the rows hold exactly the long runs' points
    assert not pos_s.duplicated(["flops"]).any()
    assert sorted(pos_s["flops"]) == sorted(pos.loc[pos["run_id"].isin(longs), "flops"])
    assert len(pos) > len(pos_s)  # the store's layout repeats the prefix points
    for rid, g in evals_s.groupby("run_id"):  # each row still starts at the base model and ends where it stopped
        full = evals[evals["run_id"] == rid]
        assert g["flops"].iloc[0] == 0.0 and g["flops"].iloc[-1] == full["flops"].iloc[-1]
        assert set(g["step"]) <= set(full["step"])


def test_flat_trajectory_is_a_real_flat_grid():
    """Every budget x seed a run with its own n_points, the runs of a seed one trajectory, stopping
    where the nested design's prefixes stop; the flat design's compute."""
    w = random_world(3)
    runs, evals = world_tables(w, "flat-trajectory")
    nested_runs, _ = world_tables(w, "nested")
    assert len(runs) == len(w.allocations) * len(w.budgets) * len(w.seeds) and "prefix_of" not in runs.columns
    assert evals.groupby("run_id").size().eq(1 + w.n_points).all()
    assert np.allclose(np.sort(runs["total_flops"].to_numpy()), np.sort(nested_runs["total_flops"].to_numpy()),
                       rtol=1e-12, atol=0.0)
    assert design_compute(w, "flat-trajectory") == design_compute(w, "flat")
    # one seed offset through the budgets: the smallest and largest budgets' runs move together
    big = World(**{**w.to_dict(), "seed_sd": 1.0, "n_problems": 300, "seeds": list(range(40))})
    runs, evals = world_tables(big, "flat-trajectory")
    end = evals.sort_values("step").groupby("run_id").last()["score"]
    r = runs.assign(end=runs["run_id"].map(end))
    r = r[(r["model"] == w.allocations[0]["model"]) & (r["num_generations"] == w.allocations[0]["num_generations"])]
    small = r[r["budget"] == min(w.budgets)].sort_values("seed")["end"].to_numpy()
    large = r[r["budget"] == max(w.budgets)].sort_values("seed")["end"].to_numpy()
    assert np.corrcoef(small, large)[0, 1] > 0.7


def test_nested_dense_reads_more_budget_points_at_the_nested_compute():
    from race.analysis.synthetic import DENSE_BUDGETS

    w = rl_world(5)
    runs, _ = world_tables(w, "nested-dense")
    b = np.sort(runs["budget"].unique())
    assert len(b) == DENSE_BUDGETS and b[0] == pytest.approx(min(w.budgets), rel=1e-12)
    assert b[-1] == pytest.approx(max(w.budgets), rel=1e-12)
    assert np.allclose(np.diff(np.log(b)), np.log(b[-1] / b[0]) / (DENSE_BUDGETS - 1), rtol=1e-9, atol=0.0)
    assert runs["prefix_of"].isna().sum() == len(w.allocations) * len(w.seeds)  # one real run per allocation and seed
    assert design_compute(w, "nested-dense") == design_compute(w, "nested")


@pytest.mark.parametrize("world", [random_world(7), rl_world(11)], ids=lambda w: w.name)
def test_move_pilots_keeps_the_world_and_moves_the_budgets(world):
    from race.analysis.synthetic import move_pilots
    from race.analysis.synthetic_rl import crossover_class

    moved = move_pilots(world, 2.0)
    b0, b1 = np.array(world.budgets), np.array(moved.budgets)
    assert moved.target_budget == world.target_budget
    np.testing.assert_allclose(moved.target_budget / b1.max(), 2.0, rtol=1e-12)
    np.testing.assert_allclose(b1 / b0, b1[0] / b0[0], rtol=1e-12)  # one factor: the span is kept
    assert moved.seeds == world.seeds and moved.allocations == world.allocations
    assert moved.tags["target_ratio"] == 2.0 and world.tags["target_ratio"] != 2.0  # the original is untouched
    for k in range(len(world.allocations)):  # the same curves: truth at the target unchanged
        assert moved.truth(k) == world.truth(k)
    if "crossover" in world.tags:
        assert moved.tags["crossover"] == crossover_class(moved)
    runs, _ = world_tables(moved)
    np.testing.assert_allclose(sorted(runs["budget"].unique()), sorted(b1), rtol=1e-12)
    with pytest.raises(ValueError, match="target_ratio"):
        move_pilots(world, 0.5)
