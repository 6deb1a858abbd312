"""A study where nothing was learned: the report says so and forecasts nothing."""

import json

from race.analysis.synthetic import Curve, World, world_tables
from race.report import build_report


def test_flat_study_report(tmp_path):
    w = World(name="flat", models={"small": 1e5, "large": 4e5}, budgets=[1e11, 3e11, 1e12], seeds=[0, 1],
              target_budget=4e12, n_problems=200, seed_sd=0.05, seed=9,
              allocations=[{"model": m, "num_generations": 4, "curve": Curve("flat", r0, 0.0, 1e11)}
                           for m, r0 in (("small", 0.3), ("large", 0.5))])
    runs, evals = world_tables(w)
    paths = build_report({"runs": runs, "evals": evals}, tmp_path, n_boot=60, n_boot_fit=60)
    md = paths.markdown.read_text()
    data = json.loads(paths.json.read_text())
    assert paths.confidence == "no learning detected"
    assert paths.headline.startswith("No learning detected: no forecast for 4 TFLOP")
    assert "No recommendation: nothing was learned" in md and "Learning gate" in md
    assert "To see learning: larger pilot budgets" in md
    rec = data["sections"]["recommendation"]["data"]
    assert rec["recommendation"]["method"] == "observed" and not any(g["passed"] for g in rec["gate"])
    assert "re-draws" not in rec["resampled"] and "refits" not in rec["resampled"]  # no fits were made
    assert "![Observed score at the largest pilot]" in md
