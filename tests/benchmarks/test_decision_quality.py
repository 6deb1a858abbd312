"""benchmarks/decision_quality.py in a reduced form: two tuning worlds through the real grid and
report, the fast path on the same worlds (same call), test-generator worlds, and the table."""

import json

import numpy as np
import pytest

from race.analysis.synthetic import random_world
from race.analysis.synthetic_rl import rl_world


@pytest.fixture(scope="module")
def dq(load_script):
    return load_script("benchmarks/decision_quality.py")


def _seed(flat: bool) -> int:
    return next(s for s in range(50) if random_world(s).tags["flat"] == flat)


def test_two_worlds_through_grid_and_report(dq, tmp_path):
    flat, learning = _seed(True), _seed(False)
    results = [dq.run_world(s, tmp_path, n_boot_fit=60) for s in (flat, learning)]
    by_seed = {r["seed"]: r for r in results}
    assert all(r["failed"] == 0 for r in results)
    assert by_seed[flat]["confidence"] == "no learning detected"
    assert by_seed[learning]["confidence"] != "no learning detected"
    # the study went through the grid store and the report, with the world's truth beside it
    w = random_world(learning)
    report = json.loads((tmp_path / w.name / "report" / "report.json").read_text())
    rec = report["sections"]["recommendation"]["data"]["recommendation"]
    assert "|".join(rec["allocation"].split("|")[:2]) == by_seed[learning]["chosen"]
    assert len(by_seed[learning]["predictions"]) == 4
    # the fast path (recommend on the tables) makes the same call as grid + report
    for s in (flat, learning):
        fast = dq.fast_world("tune", s)
        grid = by_seed[s]
        names = {v: k for k, v in dq.MODEL_NAMES.items()}
        assert fast["chosen"] == "|".join([names[grid["chosen"].split("|")[0]], grid["chosen"].split("|")[1]])
        assert fast["confidence"] == grid["confidence"]
    text = dq.summarise(results)
    assert "null worlds labelled 'no learning detected' | 1 | 100.0%" in text
    assert "| RACE |" in text and "| oracle | 0.0000 |" in text
    picks = dq.naive_picks(by_seed[learning])
    assert picks["largest model"].startswith("tiny-s|") and picks["most steps (smallest model)"].startswith("tiny-xs|")


def test_test_generator_world_through_grid_and_report(dq, tmp_path):
    s = next(s for s in range(40) if not rl_world(s).tags["flat"])
    grid = dq.run_world(s, tmp_path, n_boot_fit=60, generator="test")
    fast = dq.fast_world("test", s, n_boot=60)
    names = {v: k for k, v in dq.MODEL_NAMES.items()}
    assert grid["failed"] == 0 and grid["tags"]["crossover"] == fast["tags"]["crossover"]
    assert fast["chosen"] == "|".join([names[grid["chosen"].split("|")[0]], grid["chosen"].split("|")[1]])
    assert fast["confidence"] == grid["confidence"]


def test_test_generator_worlds_and_table(dq):
    seeds = [s for s in range(40) if rl_world(s).tags["flat"]][:1] + \
            [s for s in range(40) if rl_world(s).tags["crossover"] == "after"][:2]
    results = [dq.fast_world("test", s, n_boot=60) for s in seeds]
    assert [r["tags"]["flat"] for r in results] == [True, False, False]
    for r in results:
        assert set(r["truth"]) == {p["allocation"] for p in r["predictions"]}
        assert all(0 <= p["lo"] <= p["hi"] <= 1 and 0 <= p["score"] <= 1 for p in r["predictions"])
    text = dq.summarise(results)
    for line in ("crossover after the last pilot (n=2)", "RACE / observed winner in these worlds",
                 "always 1/k", "Winkler", "gate false passes", "RACE - rule [95% paired]"):
        assert line in text, line


def test_wilson_and_paired_interval(dq):
    lo, hi = dq.wilson(0, 10)
    assert lo == pytest.approx(0.0, abs=1e-12) and 0.2 < hi < 0.35  # Wilson upper bound for 0/10: 0.278
    lo, hi = dq.wilson(5, 10)
    assert lo + hi == pytest.approx(1.0) and lo == pytest.approx(0.2366, abs=1e-3)
    d = np.r_[np.full(50, 0.1), np.full(50, -0.1)]
    lo, hi = dq.paired_interval(d)
    assert lo < 0 < hi and dq.paired_interval(d + 1.0)[0] > 0.9


def test_hindsight_ceiling_is_the_better_of_its_two_picks(dq):
    r = {"observed": {"a": 0.6, "b": 0.5, "c": 0.4}, "params": {"a": (1e5, 4), "b": (1e6, 4), "c": (1e6, 8)},
         "chosen": "a", "truth": {"a": 0.5, "b": 0.7, "c": 0.6},
         "predictions": [{"allocation": "a", "score": 0.55}, {"allocation": "b", "score": 0.52},
                         {"allocation": "c", "score": 0.58}]}
    # highest forecast c (0.6) is truly better than the observed winner a (0.5): the ceiling takes c, not b
    assert dq.naive_picks(r)[dq.HINDSIGHT] == "c"
    r["truth"]["c"] = 0.45  # now it is worse: the ceiling keeps the observed winner
    assert dq.naive_picks(r)[dq.HINDSIGHT] == "a"
    assert dq.regret(r, "a") <= min(dq.regret(r, "a"), dq.regret(r, "c"))


def test_pilot_ratio_moves_the_pilots_of_the_same_world(dq):
    s = next(s for s in range(40) if not rl_world(s).tags["flat"])
    near = dq.fast_world("test", s, n_boot=40, pilot_ratio=1.5)
    far = dq.fast_world("test", s, n_boot=40)
    assert near["truth"] == far["truth"]  # the same world, judged at the same target
    assert near["tags"]["target_ratio"] == 1.5 and far["tags"]["target_ratio"] != 1.5
