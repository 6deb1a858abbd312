"""Figure functions on small hand-made inputs, and the formatting helpers."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from race.report import figures as F
from race.report.fmt import jsonable, short_labels, text_or


def png_wh(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_importing_the_report_does_not_import_matplotlib():
    code = "import sys, race.report, race.cli.study_cmds; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_short_labels_keep_only_the_parts_that_vary():
    keys = ["m|G=4|P=16|it=1|lr=1e-05|rule", "m|G=8|P=16|it=1|lr=1e-05|rule", "l|G=8|P=16|it=1|lr=1e-05|rule"]
    assert short_labels(keys) == {keys[0]: "m G=4", keys[1]: "m G=8", keys[2]: "l G=8"}
    assert short_labels(keys[:1]) == {keys[0]: "m rule"}
    assert short_labels(["a|b", "c"]) == {"a|b": "a|b", "c": "c"}


def test_jsonable_and_text_or():
    payload = jsonable({"a": np.float64("nan"), "b": [np.int64(3), pd.NA], "c": pd.DataFrame({"x": [1.0, np.inf]})})
    assert json.loads(json.dumps(payload, allow_nan=False)) == {"a": None, "b": [3, None], "c": [{"x": 1.0}, {"x": None}]}
    assert text_or(float("nan")) == "-" and text_or(None, "") == "" and text_or("x") == "x"


def test_regime_heatmap_and_split_figures_draw_small_inputs():
    reg = pd.DataFrame({"target": "greedy", "condition": ["rule", "rule", "rule"], "budget": [1e14, 1e15, 1e16],
                        "axes": ["size", "search+size", ""], "tie": [False, True, False],
                        "compared_to": ["a", "b", None], "win_prob": [0.9, 0.55, 1.0]})
    w, h = png_wh(F.regime_heatmap(reg))
    assert w > 200 and h > 150
    split = pd.DataFrame({"allocation": ["m|G=4|rule", "m|G=8|rule"], "rollout_share": [0.7, 0.6],
                          "learning_share": [0.25, 0.3], "feedback_share": [0.05, 0.1], "wasted_share": [0.2, 0.1]})
    assert png_wh(F.compute_split_figure(split))[0] > 300


def test_isoflop_figure_refuses_a_table_without_three_sizes():
    table = pd.DataFrame({"budget": [1e15], "condition": ["rule"], "n_sizes": [2], "sizes": [[1e6, 4e6]],
                          "scores": [[0.3, 0.4]], "coef": [None], "opt_params": [None], "ci_low": [None],
                          "ci_high": [None], "opt_score": [None]})
    with pytest.raises(ValueError, match=">= 3 model sizes"):
        F.isoflop_figure(table)
