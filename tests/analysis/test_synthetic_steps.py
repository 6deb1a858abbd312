"""The step generator of known worlds (race.analysis.synthetic_steps): curves in optimizer steps with
warmup and a per-step cost, ill-behaved curves at a base rate, drifting seed effects."""

import json
from collections import Counter

import numpy as np
import pytest

from race.analysis.synthetic import crossover_class, world_tables
from race.analysis.synthetic_race import RaceDesign, simulate_race
from race.analysis.synthetic_steps import (BLOCK, COST_JITTER, ILL_KINDS, ILL_RATE, NULL_RATE, STEP_LAYOUTS, StepWorld,
                                           effective_steps, step_mean, step_world)
from race.analysis.tables import allocation_key

N_WORLDS = 500  # per K in the base-rate tests


@pytest.fixture(scope="module")
def worlds():
    return {k: [step_world(s, k=k) for s in range(N_WORLDS)] for k in (4, 12, 24)}


def binomial_band(n: int, p: float, z: float = 4.0) -> tuple[float, float]:
    """n p +- z sd of a binomial(n, p) count."""
    sd = np.sqrt(n * p * (1 - p))
    return n * p - z * sd, n * p + z * sd


def test_null_share_and_the_base_rate_of_ill_behaved_allocations(worlds):
    every = [w for ws in worlds.values() for w in ws]
    lo, hi = binomial_band(len(every), NULL_RATE)
    assert lo <= sum(w.tags["flat"] for w in every) <= hi
    learning = [w for w in every if not w.tags["flat"]]
    n = sum(len(w.allocations) for w in learning)  # each allocation of a learning world ill with p = ILL_RATE
    lo, hi = binomial_band(n, ILL_RATE)
    ill = sum(w.ill_behaved(k) for w in learning for k in range(len(w.allocations)))
    assert lo <= ill <= hi, (ill, n)
    kinds = Counter(w.spec(k)["kind"] for w in learning for k in range(len(w.allocations)))
    assert all(kinds[x] > 50 for x in ILL_KINDS), kinds
    for w in every:
        assert w.tags["ill"] == sum(w.ill_behaved(k) for k in range(len(w.allocations)))
        assert set(w.tags["kinds"]) == {w.spec(k)["kind"] for k in range(len(w.allocations))} & set(ILL_KINDS)
        if w.tags["flat"]:
            assert all(w.spec(k)["gain"] == 0 and w.spec(k)["kind"] == "flat" for k in range(len(w.allocations)))
        for k, a in enumerate(w.allocations):  # only the highest rate of a learning-rate axis declines for it
            if w.spec(k)["kind"] == "lr_decline":
                assert w.tags["lr_axis"] and a["learning_rate"] == max(b["learning_rate"] for b in w.allocations)


def test_grids_targets_and_pilots(worlds):
    for k, ws in worlds.items():
        layouts = {f"{s}x{g}x{r}" for s, g, r in STEP_LAYOUTS[k]}
        assert {w.tags["layout"] for w in ws} == layouts  # every grid drawn, learning-rate axes included
        for i, w in enumerate(ws[:100]):
            cells = {(a["base_model"], a["num_generations"], a["learning_rate"]) for a in w.allocations}
            assert len(w.allocations) == k and len(cells) == k
            if i < 3 or (w.tags["lr_axis"] and i < 15):
                runs, evals = world_tables(w, "flat")
                assert allocation_key(runs).nunique() == k and runs["run_id"].is_unique
                assert evals.groupby("run_id")["flops"].apply(lambda f: f.is_unique).all()  # one reading a checkpoint
            assert 20 <= w.tags["target_steps"] <= 400 and w.tags["target_steps"] == min(
                w.steps_at(i) for i in range(k))
            assert 4 <= w.target_budget / max(w.budgets) <= 16 and 4 <= max(w.budgets) / min(w.budgets) <= 10
            assert len(w.seeds) in (2, 3) and 200 <= w.n_problems <= 1000 and w.spend == (1.0, 1.0)
    # crossovers are not drawn for, they arise: every class in every K
    for k, ws in worlds.items():
        classes = Counter(crossover_class(w) for w in ws if not w.tags["flat"])
        assert all(classes[c] >= 10 for c in ("within", "after", "beyond", "none")), (k, classes)
        assert all(w.tags["crossover"] == crossover_class(w) for w in ws[:50])


def test_deterministic_under_a_seed():
    for k in (4, 24):
        a, b = step_world(11, k=k), step_world(11, k=k)
        assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
        ra, ea = world_tables(a, "flat-trajectory")
        rb, eb = world_tables(b, "flat-trajectory")
        assert ra.equals(rb) and ea.equals(eb)
    c = StepWorld.from_dict(a.to_dict())
    rc, ec = world_tables(c, "flat-trajectory")
    assert rc.equals(ra) and ec.equals(ea) and c.truth(3) == a.truth(3)
    assert not step_world(12, k=24).to_dict() == a.to_dict()


def test_a_run_takes_whole_steps_and_at_least_one():
    w = step_world(2, k=12)
    for k in (0, 5, 11):
        c = w.spec(k)["cost"]
        for b in (0.3 * c, 1.0, c * 7.5, w.budgets[0], w.target_budget):
            n, f = w.counted(k, 1, b)
            assert n >= 1 and n * c * (1 - COST_JITTER) <= f <= n * c * (1 + COST_JITTER)
            if b < c * (1 - COST_JITTER):  # below one step: that model's minimum, one step, counted in full
                assert n == 1 and f > b
            else:  # the steps that fit: the next one would not
                assert f <= b and w.counted(k, 1, f + c * (1 + COST_JITTER))[0] == n + 1
                assert w.counted(k, 1, f + c * (1 + COST_JITTER))[1] > b
            assert w.counted(k, 1, f) == (n, f) and w.stop_flops(k, 1, b) == f
        assert w.counted(k, 1, 0.0) == (0, 0.0)
        assert w.steps_at(k, 0.3 * c) == 1 and w.steps_at(k) == int(np.floor(w.target_budget / c * (1 + 1e-12)))
    # a long run (the cheapest allocation of a 24-cell grid): its steps cross the blocks its costs are drawn
    # in, and reading it anywhere, in any order, with or without the block cache, counts the same
    w = next(w for w in (step_world(s, k=24) for s in range(20)) if w.steps_at(0) > 3 * BLOCK)
    n, f = w.counted(0, 0, w.target_budget)
    assert n > 3 * BLOCK and w.counted(0, 0, f) == (n, f)
    fresh = StepWorld.from_dict(w.to_dict())
    assert fresh.counted(0, 0, f) == (n, f) and fresh.counted(0, 0, f / 3) == w.counted(0, 0, f / 3)


def test_run_rows_carry_their_steps_and_warmup():
    w = next(w for w in (step_world(s, k=12) for s in range(50)) if w.tags["lr_axis"] and not w.tags["flat"])
    runs, evals = world_tables(w, "flat-trajectory")
    for r in runs.itertuples():
        k = w.index(r.model, r.num_generations, r.learning_rate)
        c = w.spec(k)["cost"]
        assert r.warmup_steps == w.spec(k)["warmup"] and r.learning_rate == w.allocations[k]["learning_rate"]
        assert r.steps >= 1 and r.steps * c * (1 - COST_JITTER) <= r.total_flops <= r.steps * c * (1 + COST_JITTER)
        pts = evals[evals["run_id"] == r.run_id].sort_values("step")
        assert pts["flops"].is_unique and pts["flops"].is_monotonic_increasing  # one reading per checkpoint
        assert pts["flops"].iloc[-1] == r.total_flops
    base = {a["base_model"] for a in w.allocations}
    assert len(base) < len(w.models)  # the model column names the cell; one base model per learning rate ...
    step0 = {}
    for r in runs.itertuples():  # ... and every cell of a base model has that model's step-0 outcomes
        per = tuple(evals[(evals["run_id"] == r.run_id) & (evals["step"] == 0)]["per_problem"].iloc[0])
        step0.setdefault(w.allocations[w.index(r.model, r.num_generations, r.learning_rate)]["base_model"], set()).add(per)
    assert all(len(v) == 1 for v in step0.values())


def test_warmup_slows_early_progress():
    n = np.arange(0, 40)
    for w in (0, 1, 5, 20):
        e = effective_steps(n, w)
        assert np.all(e <= n) and np.all(np.diff(e) > 0)
        if w:
            assert np.allclose(e[: w + 1], n[: w + 1] * (n[: w + 1] + 1) / (2 * w), rtol=1e-12)
            assert np.allclose(e[w:], n[w:] - (w - 1) / 2, rtol=1e-12)  # full rate after, (w - 1) / 2 steps behind
    spec = {"shape": "weibull", "s": 1.0, "r0": 0.2, "gain": 0.5, "tau": 30.0, "warmup": 0, "cost": 1.0, "kind": "regular"}
    slow = {**spec, "warmup": 20}
    assert step_mean(spec, 0) == step_mean(slow, 0) == pytest.approx(0.2)
    early = np.arange(1, 20)
    assert np.all(step_mean(slow, early) < step_mean(spec, early))
    assert step_mean(slow, 2) - 0.2 < 0.1 * (step_mean(spec, 2) - 0.2)  # 2 steps into 20 of warmup: 3/40 of the progress
    assert step_mean(slow, 100) == pytest.approx(float(step_mean(spec, 100 - 9.5)), rel=1e-12)


def test_ill_behaved_shapes():
    base = {"shape": "sigmoid", "s": 1.5, "r0": 0.3, "gain": 0.5, "tau": 50.0, "warmup": 0, "cost": 1.0}
    n = np.array([10.0, 50.0, 200.0, 1000.0, 5000.0])
    regular = step_mean({**base, "kind": "regular"}, n)
    assert np.all(np.diff(regular) > 0)
    late = step_mean({**base, "kind": "late_riser", "onset": 200.0, "early": 0.05}, n)
    assert late[2] - 0.3 <= 0.05 * 0.5 + 1e-12 and late[-1] > late[2] + 0.3  # little until the onset, then the rise
    dec = step_mean({**base, "kind": "decline", "peak": 200.0, "drop": 0.04}, n)
    assert np.allclose(dec[:3], regular[:3]) and dec[-1] < dec[3] < regular[3]
    assert regular[-1] - dec[-1] == pytest.approx(0.04 * np.log(5000 / 200), rel=1e-9)
    col = step_mean({**base, "kind": "collapse", "collapse_at": 200.0, "floor": 0.2}, n)
    assert np.allclose(col[:2], regular[:2]) and np.all(col[2:] == 0.2)


def test_truth_keeps_an_allocations_collapse_and_not_a_runs():
    w = next(w for w in (step_world(s) for s in range(200)) if not w.tags["flat"])
    k = 0
    spec = w.spec(k)
    w.allocations[k]["spec"] = {**spec, "kind": "collapse", "collapse_at": float(w.steps_at(k) // 2), "floor": 0.05}
    assert w.truth(k) == pytest.approx(0.05)  # the allocation itself collapsed before T
    w.allocations[k]["spec"] = spec
    sure = StepWorld.from_dict({**w.to_dict(), "collapse_p": 1.0})
    never = StepWorld.from_dict({**w.to_dict(), "collapse_p": 0.0})
    assert [sure.truth(i) for i in range(4)] == [never.truth(i) for i in range(4)]
    late = [0.0, 2.0 * w.target_budget]  # past every run's collapse step (at most 10^0.2 of its target steps)
    for seed in range(3):
        (_, _, m1), (_, _, m2) = sure.run_means(k, seed, late)[1], never.run_means(k, seed, late)[1]
        assert m1 == pytest.approx(0.5 * m2 + 0.4 * spec["r0"], rel=1e-12)
        o1, o2 = sure.trajectory(k, seed, late)[1][1], never.trajectory(k, seed, late)[1][1]
        assert np.all(o1 <= o2)  # the same problem noise, a lower mean


def test_seed_effects_drift_along_a_run():
    """Without the fixed offset, a run's seed effect is a random walk over its steps: variance drift^2 n / n_T
    at n steps, increments independent. Over 1,500 runs the sample variances are within 4 of their relative
    SE (sqrt(2 / 1500) = 3.7%) of that."""
    w = next(w for w in (step_world(s) for s in range(200)) if not w.tags["flat"] and w.collapse_p == 0)
    w = StepWorld.from_dict({**w.to_dict(), "seed_sd": 0.0, "drift": 0.02})
    k = 0
    n_t = w.target_budget / w.spec(k)["cost"]
    flops = [0.0, w.target_budget / 8, w.target_budget / 2]
    dev = []
    for seed in range(1500):
        read = w.run_means(k, seed, flops)
        dev.append([mu - float(step_mean(w.spec(k), n)) for n, _, mu in read[1:]])
    dev = np.array(dev)
    steps = [n for n, _, _ in w.run_means(k, 0, flops)[1:]]
    assert np.var(dev[:, 0]) == pytest.approx(0.02**2 * steps[0] / n_t, rel=0.15)
    assert np.var(dev[:, 1] - dev[:, 0]) == pytest.approx(0.02**2 * (steps[1] - steps[0]) / n_t, rel=0.15)
    assert abs(np.corrcoef(dev[:, 0], dev[:, 1] - dev[:, 0])[0, 1]) < 4 / np.sqrt(1500)
    assert all(w2.drift > 0 and w2.seed_sd > 0 for w2 in (step_world(s) for s in range(20)))
    spread = [step_world(s).seed_sd for s in range(200)]
    assert min(spread) < 0.006 and max(spread) > 0.035  # seed spread varies per world


def test_a_checkpoint_read_twice_is_one_reading():
    w = step_world(5, k=4)
    k = int(np.argmax([w.spec(i)["cost"] for i in range(4)]))
    c = w.spec(k)["cost"]
    pts = w.trajectory(k, 0, [0.0, 0.2 * c, 0.5 * c, 3.5 * c])
    assert pts[1][0] == pts[2][0] and np.array_equal(pts[1][1], pts[2][1])  # both read step 1
    assert pts[3][0] > pts[2][0]
    head = w.trajectory(k, 0, [0.0, 0.2 * c])
    assert all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(head, pts))  # reading on does not change the past


def test_walk_moves_the_offset_on_top_of_the_drift():
    w = step_world(3, k=4)
    flops = [0.0, w.budgets[0], w.budgets[2], w.target_budget]
    fixed = w.run_means(1, 0, flops)
    w.seed_walk = 0.5
    walked = w.run_means(1, 0, flops)
    assert fixed[:2] == walked[:2] and fixed[2:] != walked[2:]


@pytest.mark.parametrize("k", [4, 12, 24])
def test_keep_all_race_runs_on_step_worlds(k):
    w = next(w for w in (step_world(s, k=k) for s in range(40)) if not w.tags["flat"]
             and w.tags["lr_axis"] == (k == 12))
    out = simulate_race(w, RaceDesign(), None)
    runs = out["runs"]
    keys = set(allocation_key(runs))
    assert len(keys) == k and out["leader"] in keys and out["alive"] == [list(range(k))] * 3
    assert {"steps", "warmup_steps"} <= set(runs.columns) and runs["run_id"].is_unique
    last = runs[runs["prefix_of"].isna()]
    assert len(last) == k * len(w.seeds) and (last["steps"] >= 1).all()


def test_the_step_floor_budget_buys_the_floor_on_every_run():
    """``min_budgets`` prices a step floor at the costliest step (``max_step_cost``), as the plan prices
    real steps at their maximal completions: every run of every allocation and seed has taken its warmup
    + floor steps at that budget, jitter or not. At the nominal cost some runs fall a step short (the
    race then kept them by the floor, beyond the keep counts and over the cap)."""
    from race.analysis.synthetic_race import allocation_names, min_budgets

    short_at_nominal = 0
    for s in range(12):
        w = step_world(300000 + s, k=12)
        mins, names = min_budgets(w, 5), allocation_names(w)
        for k, a in enumerate(w.allocations):
            need = w.warmup_steps(a) + 5
            assert w.max_step_cost(a) == pytest.approx(w.step_cost(a) * (1 + COST_JITTER), rel=1e-12)
            for seed in w.seeds:
                assert w.counted(k, seed, mins[names[k]])[0] >= need
                short_at_nominal += w.counted(k, seed, need * w.step_cost(a))[0] < need
    assert short_at_nominal > 0  # the jitter this guards against is there


def test_a_step_world_race_stays_within_its_schedules_worst_case():
    """The seed whose floor once fell a step short (test phase, K = 4): the race's unreused pilot
    compute is at most its schedule's worst case, so within the cap."""
    from race.analysis.racing import RacingRule
    from race.analysis.synthetic_race import RaceDesign, simulate_race

    w = step_world(310014, k=4)
    rule = RacingRule()
    out = simulate_race(w, RaceDesign(rungs=None, first_seeds=None), rule)
    worst = out["decisions"][0]["schedule"]
    from race.spec.rungs import schedule_from_dict

    cost = schedule_from_dict(worst).cost()
    assert out["pilot_T"] - out["reused_T"] <= cost["unreused_T"] * (1 + 1e-9)
    assert not any(d["exempt"] for d in out["decisions"][1:])
