"""K allocations for the FLOP generators (random_world, rl_world), the generator table (make_world) and the
steps every world's run rows carry: K = 4 draws exactly what the code before K drew."""

import hashlib
import json

import numpy as np
import pytest

from race.analysis.synthetic import crossover_class, random_world, run_row, world_tables
from race.analysis.synthetic_base import LAYOUTS, NOMINAL_TARGET_STEPS, SIZE_NAMES, check_k, group_factor
from race.analysis.synthetic_rl import rl_world
from race.analysis.synthetic_worlds import GENERATORS, make_world


def _fmt(v):
    """Numbers to 10 significant digits (identical draws give identical digits; a different draw does not)."""
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.10g}"
    if isinstance(v, (list, tuple)):
        return [_fmt(x) for x in v]
    if isinstance(v, dict):
        return {str(a): _fmt(b) for a, b in v.items()}
    if isinstance(v, np.integer):
        return int(v)
    return v


def fingerprint(w) -> str:
    """The world's draws and its flat, flat-trajectory and nested tables (every run, FLOPs, problem outcome),
    the runs' ``steps`` and ``warmup_steps`` aside (their nominal steps are new)."""
    h = hashlib.sha256(json.dumps(_fmt(w.to_dict()), sort_keys=True).encode())
    for design in ("flat", "flat-trajectory", "nested"):
        runs, evals = world_tables(w, design)
        for r in evals.itertuples():
            bits = np.asarray(r.per_problem, dtype=np.uint8).tobytes().hex()
            h.update(json.dumps([r.run_id, int(r.step), _fmt(r.flops), bits]).encode())
        cols = [c for c in runs.columns if c not in ("steps", "warmup_steps")]
        for row in runs[cols].itertuples(index=False):
            cells = [None if (isinstance(x, float) and x != x) else x for x in row]
            h.update(json.dumps(_fmt(cells), default=str).encode())
    return h.hexdigest()[:16]


#: computed with the code at 3a24b1a (before K existed): past benchmark seeds must draw these worlds
BEFORE_K = {("tune", 3): "dc30aa99b4a20161", ("tune", 1001): "2482a9fbef36464a", ("tune", 14000): "a45f1bd5c4881d3f",
            ("tune", 18001): "618c6ad1e1a3b3b4", ("test", 5): "036a766db4c8b5a9", ("test", 11): "da2655d5c2fc8c96",
            ("test", 20000): "3b8bbd1f85bc0055", ("test", 54001): "5ddd0a10fc4d8d5e"}


@pytest.mark.parametrize("gen,seed", sorted(BEFORE_K), ids=lambda x: str(x))
def test_k4_draws_the_worlds_drawn_before_k(gen, seed):
    make = random_world if gen == "tune" else rl_world
    assert fingerprint(make(seed)) == BEFORE_K[(gen, seed)]
    assert fingerprint(make(seed, k=4)) == BEFORE_K[(gen, seed)]


def test_the_fingerprint_sees_a_changed_draw():
    w = random_world(3)
    w.allocations[1]["curve"] = w.allocations[1]["curve"].__class__(**{**w.to_dict()["allocations"][1]["curve"],
                                                                      "gain": 0.123})
    assert fingerprint(w) != BEFORE_K[("tune", 3)]


@pytest.mark.parametrize("make", [random_world, rl_world], ids=["tune", "test"])
@pytest.mark.parametrize("k", [12, 24])
def test_more_allocations_are_distinct_and_drawn_as_the_first_two_sizes(make, k):
    n_sizes, groups = LAYOUTS[k]
    for seed in range(6):
        w = make(seed, k=k)
        assert len(w.allocations) == k and len({(a["model"], a["num_generations"]) for a in w.allocations}) == k
        assert list(w.models) == list(SIZE_NAMES[n_sizes]) and sorted({a["num_generations"] for a in w.allocations}) == list(groups)
        params = list(w.models.values())
        assert all(b > a for a, b in zip(params, params[1:]))  # larger models ...
        r0 = {a["model"]: (a["spec"]["r0"] if "spec" in a else a["curve"].r0) for a in w.allocations}
        assert all(r0[b] > r0[a] for a, b in zip(w.models, list(w.models)[1:]))  # ... start higher
        assert w.index(list(w.models)[-1], groups[-1]) == k - 1
        assert w.name.endswith(f"-k{k}")


@pytest.mark.parametrize("make", [random_world, rl_world], ids=["tune", "test"])
def test_k_worlds_are_deterministic_and_their_own(make):
    a, b = make(7, k=12), make(7, k=12)
    ra, ea = world_tables(a, "flat-trajectory")
    rb, eb = world_tables(b, "flat-trajectory")
    assert ra.equals(rb) and ea.equals(eb)
    assert json.dumps(a.to_dict(), sort_keys=True, default=str) == json.dumps(b.to_dict(), sort_keys=True, default=str)
    other = world_tables(make(8, k=12), "flat-trajectory")[1]
    assert len(other) != len(ea) or not np.array_equal(np.vstack(other["per_problem"]), np.vstack(ea["per_problem"]))


def test_tuning_k_worlds_keep_the_seeds_budgets_and_family():
    for seed in range(5):
        w4, w12 = random_world(seed), random_world(seed, k=12)
        assert w12.budgets == w4.budgets and w12.seeds == w4.seeds and w12.target_budget == w4.target_budget
        assert w12.tags["family"] == w4.tags["family"] and w12.tags["flat"] == w4.tags["flat"]


def test_group_factor_is_one_draw_per_doubling():
    assert group_factor(np.random.default_rng(0), 4, 0.7, 1.5) == 1.0
    one = np.random.default_rng(1).uniform(0.7, 1.5)
    assert group_factor(np.random.default_rng(1), 8, 0.7, 1.5) == one  # G = 8: the draw K = 4 always made
    assert group_factor(np.random.default_rng(1), 2, 0.7, 1.5) == pytest.approx(1 / one, rel=1e-15)
    r = np.random.default_rng(2)
    two = r.uniform(0.7, 1.5) * r.uniform(0.7, 1.5)
    assert group_factor(np.random.default_rng(2), 16, 0.7, 1.5) == pytest.approx(two, rel=1e-15)
    with pytest.raises(ValueError, match="power-of-two"):
        group_factor(np.random.default_rng(0), 12, 0.7, 1.5)


@pytest.mark.parametrize("bad", [5, 0, True, "4", 4.0])
def test_k_must_be_one_of_the_grids(bad):
    with pytest.raises(ValueError, match=r"must be one of \(4, 12, 24\)"):
        check_k(bad)
    with pytest.raises(ValueError, match="must be one of"):
        random_world(1, k=bad)


def test_make_world_by_name_and_refuses_unknown_names():
    for g in GENERATORS:
        w = make_world(g, 4, k=12, walk=0.5)
        assert len(w.allocations) == 12 and w.seed_walk == 0.5
        assert w.tags["generator"] == g and w.tags["k"] == 12 and w.tags["crossover"] == crossover_class(w)
    r1, e1 = world_tables(make_world("test", 5), "flat")
    r2, e2 = world_tables(rl_world(5), "flat")
    assert r1.equals(r2) and e1.equals(e2)
    with pytest.raises(ValueError, match="unknown generator 'steep'; choose from tune, test, steps"):
        make_world("steep", 1)
    with pytest.raises(ValueError, match="walk must be"):
        make_world("tune", 1, walk=-1.0)
    with pytest.raises(ValueError, match="must be one of"):
        make_world("steps", 1, k=6)


@pytest.mark.parametrize("make", [random_world, rl_world], ids=["tune", "test"])
def test_flop_worlds_rows_carry_nominal_steps_and_no_warmup(make):
    w = make(3, k=12)
    runs, _ = world_tables(w, "flat-trajectory")
    assert (runs["warmup_steps"] == 0).all() and (runs["steps"] >= 1).all()
    for r in runs.itertuples():
        a = w.allocations[w.index(r.model, r.num_generations)]
        assert r.steps == int(np.floor(r.total_flops / w.step_cost(a) * (1 + 1e-12)))
    cost = [w.step_cost(a) for a in w.allocations]
    costliest = int(np.argmax(cost))
    assert w.steps_at(costliest) == NOMINAL_TARGET_STEPS  # the costliest allocation's target run
    groups = [a["num_generations"] for a in w.allocations]  # cost per step: parameters x G
    assert cost[costliest] / min(cost) == pytest.approx(max(w.models.values()) * max(groups)
                                                        / (min(w.models.values()) * min(groups)), rel=1e-12)
    assert run_row(w, w.allocations[0], "x", 1.0, 0, 0.0)["steps"] == 0  # nothing counted, no step


def test_index_with_a_learning_rate():
    w = random_world(3)
    assert w.index("large", 8) == w.index("large", 8, 1e-4) == 3
    with pytest.raises(KeyError, match="no allocation large G=8 lr=0.0003"):
        w.index("large", 8, 3e-4)
    w.allocations.append({**w.allocations[3], "learning_rate": 3e-4})
    assert w.index("large", 8, 3e-4) == 4
    with pytest.raises(KeyError, match="2 allocations large G=8 .*pass learning_rate"):
        w.index("large", 8)


def test_world_stats_count_what_each_generator_draws():
    from race.analysis.synthetic_worlds import world_stats

    w = make_world("tune", 3)
    s = world_stats(w)
    assert s["k"] == 4 and s["null"] == w.tags["flat"] and s["late"] == (w.tags["crossover"] == "after")
    assert s["ill"] == sum(a["curve"].family == "rise_decline" for a in w.allocations)
    assert s["steps"] == [31, 125, 333, 1000]
    r = next(r for r in (rl_world(x) for x in range(40)) if r.tags["decline"])
    assert world_stats(r)["ill"] == sum(a["spec"]["decline"] > 0 for a in r.allocations) > 0
    st = make_world("steps", 1, k=24)
    costliest = int(np.argmax([a["spec"]["cost"] for a in st.allocations]))
    assert world_stats(st)["steps"] == [st.steps_at(costliest, st.target_budget * f) for f in (1 / 32, 1 / 8, 1 / 3, 1)]
    assert world_stats(st)["steps"][-1] == st.tags["target_steps"]
