"""benchmarks/decision_quality.py end to end on two known worlds: the real grid (local runner,
the benchmark's cell function) and the real report, then the summary table."""

import importlib.util
import json
from pathlib import Path

import pytest

from race.analysis.synthetic import random_world

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decision_quality.py"


@pytest.fixture(scope="module")
def dq():
    spec = importlib.util.spec_from_file_location("race_bench_decision_quality", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    text = dq.summarise(results)
    assert "flat worlds labelled 'no learning detected': 100.0% of 1" in text
    assert "| RACE |" in text and "| oracle | 0.0000 |" in text
    picks = dq.naive_picks(by_seed[learning])
    assert picks["largest model"].startswith("tiny-s|") and picks["most steps (smallest model)"].startswith("tiny-xs|")
