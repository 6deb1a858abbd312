"""benchmarks/design_information.py: pilot designs compared on the same worlds (paired), on a few
test-generator worlds run through decision_quality.py's fast path with --design."""

import numpy as np
import pytest


@pytest.fixture(scope="module")
def records(load_script):
    dq = load_script("benchmarks/decision_quality.py")
    seeds = range(4)
    return {d: [dq.fast_world("test", s, n_boot=40, design=d) for s in seeds] for d in ("flat", "nested")}


def test_records_carry_the_design(records):
    for d, recs in records.items():
        assert all(r["design"] == d for r in recs)
    for f, n in zip(records["flat"], records["nested"]):
        assert f["seed"] == n["seed"] and f["truth"] == n["truth"]  # the same world, another design
        assert n["pilot_compute"] < f["pilot_compute"] and n["n_seeds"] == f["n_seeds"]


def test_compare_is_paired_and_matches_the_records(load_script, records):
    di = load_script("benchmarks/design_information.py")
    point, ci = di.compare(records, n_boot=200)
    for d, recs in records.items():
        learn = [r for r in recs if not r["tags"]["flat"]]
        regret = np.mean([max(r["truth"].values()) - r["truth"][r["chosen"]] for r in learn])
        assert point[d]["mean regret, learning worlds"] == pytest.approx(regret, rel=1e-12)
    assert point["flat"]["pilot compute / reference"] == 1.0
    assert 0.5 < point["nested"]["pilot compute / reference"] < 0.75  # max / sum of 3 budgets spanning 4-10x
    lo, hi = ci["nested"]["chosen forecast: mean abs(score - truth)"]
    diff = point["nested"]["chosen forecast: mean abs(score - truth)"] - point["flat"]["chosen forecast: mean abs(score - truth)"]
    assert lo <= diff + 1e-12 and diff <= hi + 1e-12
    # a design compared with itself differs by exactly 0 in every resample
    same_point, same_ci = di.compare({"a": records["flat"], "b": records["flat"]}, n_boot=50)
    assert all(v == (0.0, 0.0) or np.isnan(v[0]) for v in same_ci["b"].values())
    assert "| mean regret, learning worlds |" in di.table(point, ci)
    with pytest.raises(ValueError, match="other worlds"):
        di.compare({"a": records["flat"], "b": records["nested"][1:]}, n_boot=10)


def test_width_parts_table(load_script):
    di = load_script("benchmarks/design_information.py")
    text = di.width_parts(["flat", "nested"], "test", worlds=3)
    rows = [r for r in text.splitlines() if r.startswith("| flat |") or r.startswith("| nested |")]
    assert len(rows) == 2
    for r in rows:
        cells = [float(c) for c in r.strip("|").split("|")[1:]]
        assert cells[0] >= 1 and all(c >= 0 for c in cells[1:])  # worlds, SDs, scales, pairs
