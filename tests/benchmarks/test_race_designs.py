"""benchmarks/race_designs.py in a reduced form: two learning worlds per generator, every design on the
same world, compute in units of T, the table and the cost-quality figure."""

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
    for gen, first in (("tune", 1000), ("test", 0)):
        seeds = iter(range(first, first + 20))
        while sum(r["generator"] == gen for r in out) < 2:
            r = rd.world_record(gen, next(seeds), walk=0.5 if gen == "test" else 0.0, rule_json=RULE)
            if r is not None:
                out.append(r)
    return out


def test_every_design_on_the_same_world(rd, records):
    from race.analysis.racing import RacingRule
    from race.analysis.synthetic_race import RaceDesign

    for r in records:
        w = rd.make_world(r["generator"], r["seed"], r["walk"])
        K, S, T = len(w.allocations), len(w.seeds), w.target_budget
        d = r["designs"]
        assert set(d) >= {"flat", "nested", "race", *(n for n, _, _ in rd.KEEP_ALL)}
        assert all(v["pick"] in r["truth"] for v in d.values())
        assert d["flat"]["pilot"] == pytest.approx(K * S * sum(w.budgets) / T, rel=1e-12)
        assert d["nested"]["pilot"] == pytest.approx(K * S * max(w.budgets) / T, rel=1e-12)
        rungs = RaceDesign().rungs
        assert d["keep-all T/32,T/8,T/3"]["pilot"] == pytest.approx(K * (S * rungs[0] + rungs[2] - rungs[0]), rel=1e-12)
        race = d["race"]
        assert race["reused"] == pytest.approx(rd.RACE_RUNGS[-1], rel=1e-12)
        assert race["pilot"] - race["reused"] <= RacingRule().max_unreused + 1e-9
        assert race["lo"] <= race["hi"] and 0.0 <= race["p_best"] <= race["p_near_best"] <= 1.0
        assert r["rule"]["n_boot"] == 40 and r["walk"] == (0.5 if r["generator"] == "test" else 0.0)


def test_table_is_paired_and_the_figure_is_drawn(rd, records, tmp_path):
    rows = {r["design"]: r for r in rd.design_rows(records)}
    base = np.array([rd.regret(r, r["designs"]["flat"]["pick"]) for r in records])
    race = np.array([rd.regret(r, r["designs"]["race"]["pick"]) for r in records])
    assert rows["race"]["regret"] == pytest.approx(race.mean(), rel=1e-12)
    assert rows["race"]["diff"] == pytest.approx((race - base).mean(), abs=1e-12)
    lo, hi = rows["race"]["diff_ci"]
    assert lo <= rows["race"]["diff"] <= hi
    text = rd.table(records, "reduced")
    assert "| race |" in text and "| flat |" in text and "not reused / T" in text
    png = tmp_path / "cq.png"
    rd.plot({"a": records}, str(png))
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
