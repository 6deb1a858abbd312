"""The report states the measured prefix-vs-shorter-run comparison (the JSON shipped with
the package, written by benchmarks/prefix_vs_short.py) and says when a study's own runs
are prefixes (a nested grid)."""

from __future__ import annotations

import json

import pandas as pd

from race.report.prefix_note import MEASURED, load_measured, measured_sentence, study_sentence


def test_the_package_ships_the_measured_comparison():
    m = load_measured()
    assert m is not None and MEASURED.exists()
    assert {"constant", "cosine"} <= set(m["pooled"]) and m["command"].startswith("python benchmarks/prefix_vs_short.py")
    for c in m["comparisons"]:
        assert c["lo"] <= c["diff"] <= c["hi"]


def test_sentence_carries_the_measured_figures(tmp_path):
    m = {"budget_B": 1.5e11, "problems": 200, "seeds": [0, 1, 2], "target": "greedy",
         "comparisons": [{"allocation": "tiny-s G=4"}, {"allocation": "tiny-m G=8"}],
         "pooled": {"constant": {"diff": 0.0, "lo": 0.0, "hi": 0.0, "identical": 12, "n": 12},
                    "cosine": {"diff": -0.0213, "lo": -0.041, "hi": -0.004, "identical": 0, "n": 12}},
         "allocation_gaps": [{"gap": 0.21}, {"gap": 0.25}], "short_gain_range": [-1e-17, 0.0267]}
    (tmp_path / "m.json").write_text(json.dumps(m))
    text = measured_sentence(load_measured(tmp_path / "m.json"))
    assert "constant learning rate +0.000 [+0.000, +0.000] (identical per-problem outcomes in 12 of 12)" in text
    assert "cosine learning rate -0.021 [-0.041, -0.004]" in text and "0.210-0.250" in text
    assert "6e+11-FLOP run against runs of 1.5e+11 and 3e+11 at equal counted FLOPs, reward rule, greedy" in text
    assert "gained +0.000 to +0.027 over their step-0 score" in text
    assert measured_sentence(None) is None and load_measured(tmp_path / "absent.json") is None


def test_study_sentence_only_for_nested_studies():
    runs = pd.DataFrame({"run_id": ["a", "a.p0", "b"], "budget": [3e12, 3e11, 3e12],
                         "prefix_of": [None, "a", None]})
    assert "1 of 3 runs of this study are prefixes" in study_sentence(runs)
    assert "3e+11" in study_sentence(runs)
    assert study_sentence(runs.assign(prefix_of=None)) is None
    assert study_sentence(runs.drop(columns="prefix_of")) is None


def test_method_section_states_it(full_report):
    md = full_report.markdown.read_text()
    expected = measured_sentence(load_measured())
    assert expected and " ".join(expected.split()) in " ".join(md.split())
