"""benchmarks/race_designs.py in a reduced form: two learning worlds of the tuning and the test
generator (K = 4 and K = 12), every design of race.analysis.designs on the same world, compute
in units of T, the paired table and the cost-quality figure."""

import json

import numpy as np
import pytest

RULE = json.dumps({"n_boot": 40})


@pytest.fixture(scope="module")
def rd(load_script):
    return load_script("benchmarks/race_designs.py")


@pytest.fixture(scope="module")
def records(rd):
    out = []
    for gen, first, k in (("tune", 1000, 4), ("test", 0, 12)):
        seeds = iter(range(first, first + 20))
        while sum(r["generator"] == gen for r in out) < 2:
            r = rd.world_record(gen, next(seeds), walk=0.5 if gen == "test" else 0.0, k=k, rule_json=RULE,
                                candidates={"trend": {"rank": "trend"}})
            if r is not None:
                out.append(r)
    return out


def test_every_design_on_the_same_world(rd, records):
    from race.analysis.designs import DESIGNS
    from race.analysis.racing import RacingRule

    for r in records:
        w = rd.make_world(r["generator"], r["seed"], r["walk"], r["k"])
        K, S, T = len(w.allocations), len(w.seeds), w.target_budget
        assert r["k"] == K == (4 if r["generator"] == "tune" else 12)
        d = r["designs"]
        assert set(d) == set(DESIGNS) | {"trend"}
        assert all(v["pick"] in r["truth"] for v in d.values())
        # the flat grid: every allocation x seed at every budget; keep-all: every allocation once, one seed
        assert d["flat"]["pilot"] == pytest.approx(K * S * sum(w.budgets) / T, rel=1e-12)
        assert d["keep-all"]["pilot"] == pytest.approx(K * d["keep-all"]["reused"], rel=1e-12)
        assert d["keep-all"]["pilot"] - d["keep-all"]["reused"] <= RacingRule().max_unreused + 1e-9
        for name in ("default", "trend", "halving", "top-k"):
            v = d[name]
            assert set(v["alive_last"]) <= set(r["truth"]) and v["alive_n"][0] == K
            assert all(a >= b for a, b in zip(v["alive_n"], v["alive_n"][1:]))  # never more than the rung below
            if v["fits"]:  # a schedule that fits never spends more than the cap beyond the reused run
                assert v["pilot"] - v["reused"] <= RacingRule().max_unreused + 1e-9
        for name in ("default", "trend"):  # the racing code's pick carries its interval and odds
            v = d[name]
            assert v["lo"] <= v["point"] <= v["hi"] and 0.0 <= v["p_best"] <= v["p_near_best"] <= 1.0
        assert r["rule"]["n_boot"] == 40 and r["walk"] == (0.5 if r["generator"] == "test" else 0.0)


def test_table_is_paired_and_the_figure_is_drawn(rd, records, tmp_path):
    rows = {r["design"]: r for r in rd.design_rows(records)}
    base = np.array([rd.regret(r, r["designs"]["flat"]["pick"]) for r in records])
    ref = np.array([rd.regret(r, r["designs"]["default"]["pick"]) for r in records])
    trend = np.array([rd.regret(r, r["designs"]["trend"]["pick"]) for r in records])
    assert rows["default"]["regret"] == pytest.approx(ref.mean(), rel=1e-12)
    assert rows["default"]["diff"] == pytest.approx((ref - base).mean(), abs=1e-12)
    assert rows["trend"]["vs"] == pytest.approx((trend - ref).mean(), abs=1e-12)
    for key in ("diff", "vs"):
        lo, hi = rows["trend"][f"{key}_ci"]
        assert lo <= rows["trend"][key] <= hi
    assert 0.0 <= rows["default"]["coverage"] <= 1.0 and rows["default"]["width"] >= 0.0
    # near-ties at T count as found: never below the strict winner-alive share; keep-all finds all
    for row in rows.values():
        assert row["alive"] <= row["near_alive"] <= 1.0
    assert rows["keep-all"]["near_alive"] == 1.0
    r0 = records[0]
    best = max(r0["truth"], key=r0["truth"].get)
    others = [a for a in r0["truth"] if a != best]
    near = [a for a in others if r0["truth"][a] >= r0["truth"][best] - 0.01]
    far = [a for a in others if r0["truth"][a] < r0["truth"][best] - 0.01]
    assert rd.near_best_alive(r0, [best]) and rd.near_best_alive(r0, near[:1]) == bool(near)
    assert not rd.near_best_alive(r0, far) and not rd.near_best_alive(r0, [])
    text = rd.table(records, "reduced")
    assert "| default |" in text and "| flat |" in text and "not reused / T" in text
    png = tmp_path / "cq.png"
    rd.plot({"a": records}, str(png))
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_the_noise_free_ceiling_ranks_by_truth_on_the_defaults_schedule(rd, records):
    """``--ceiling``: the default's schedule (the same rungs, keep counts and compute), every cut by
    the true scores at the rung budgets; its pick is the true best among its finalists at the last
    rung, and the records it is added to keep every other design."""
    from race.analysis.designs import schedule_for
    from race.analysis.racing import RacingRule
    from race.analysis.synthetic_race import WorldSource

    before = {r["seed"]: set(r["designs"]) for r in records}
    for r in rd.add_ceiling([json.loads(json.dumps(x)) for x in records]):
        c = r["designs"][rd.CEILING]
        assert set(r["designs"]) == before[r["seed"]] | {rd.CEILING}
        w = rd.make_world(r["generator"], r["seed"], r["walk"], r["k"])
        src = WorldSource(w)
        sched = schedule_for(src, RacingRule(**{**r["rule"]}), c["first_seeds"])
        assert c["alive_n"] == list(sched.keep) and len(c["alive_last"]) == sched.keep[-1]
        assert c["pilot"] == pytest.approx(sched.cost()["pilots_T"], rel=1e-12)
        last = len(sched.budgets) - 1
        at_last = {a: w.truth(src.names.index(a), sched.budget_of(a, last)) for a in c["alive_last"]}
        assert c["pick"] == max(at_last, key=at_last.get)
        # the finalists survived the first cut, so each is among the keep[1] true best at the first rung
        at0 = {a: w.truth(k, sched.budget_of(a, 0)) for k, a in enumerate(src.names)}
        top = sorted(src.names, key=lambda a: -at0[a])[: sched.keep[1]]
        assert all(at0[a] >= at0[top[-1]] - 1e-12 for a in c["alive_last"])


def test_the_geometry_reference_covers_its_grid(load_script):
    """benchmarks/race_geometry_ceiling.py on two learning worlds: every (eta, keep_last, last) of its
    grid a row; the frozen geometry's row is the ceiling design's own answer on those worlds."""
    geo = load_script("benchmarks/race_geometry_ceiling.py")
    rd = load_script("benchmarks/race_designs.py")
    worlds = [w for w in (rd.make_world("tune", s, 0.0, 12) for s in range(100000, 100006)) if not w.tags["flat"]][:2]
    rows = geo.geometry_rows(worlds, etas=(2.0, 3.0), keep_last=(2,), lasts=(1 / 4, 1 / 3))
    assert [(r["eta"], r["keep_last"], r["last"]) for r in rows] == [(2.0, 2, 1 / 4), (2.0, 2, 1 / 3), (3.0, 2, 1 / 4),
                                                                      (3.0, 2, 1 / 3)]
    frozen = rows[3]
    from race.analysis.synthetic_race import allocation_names

    alive = []
    for w in worlds:
        d = rd.ceiling_design(w, {"eta": 3.0, "keep_last": 2, "last": 1 / 3, "max_unreused": 0.9})
        names = allocation_names(w)
        alive.append(names[max(range(len(names)), key=w.truth)] in d["alive_last"])
    assert frozen["fits"] == 1.0 and frozen["alive"] == pytest.approx(np.mean(alive))
    assert all(0.0 <= r["regret"] for r in rows if r["fits"] == 1.0)
    # the naive pick it prints beside them: the flat grid's regret on the same worlds, within each world's spread
    spread = np.mean([max(w.truth(i) for i in range(len(w.allocations))) - min(w.truth(i) for i in range(len(w.allocations)))
                      for w in worlds])
    assert 0.0 <= geo.flat_regret(worlds) <= spread + 1e-12
