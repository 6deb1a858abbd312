"""race.analysis is pure: light imports only, deterministic, inputs left untouched."""

import ast
import subprocess
import sys
from pathlib import Path

import pandas as pd

import race.analysis as analysis
from race.analysis import final_scores, frontier, isoflop_table, rank_stability, recommend, regimes

FORBIDDEN = ("torch", "transformers", "matplotlib", "peft", "trl", "ray", "pydantic")
ALLOWED_TOP = {"numpy", "pandas", "scipy", "__future__", "collections", "dataclasses", "itertools", "json",
               "typing", "math", "enum"}
#: RACE modules the analysis may import: the homes of the vocabularies it reads (stdlib-only
#: budget rule and table layout; the rung schedule; the reward grammar, imported inside the function that
#: reads a reward).
ALLOWED_RACE = {"race.accounting.guard", "race.records", "race.schema", "race.spec.reward", "race.spec.rungs"}


def test_import_does_not_pull_heavy_libraries():
    code = (
        "import sys, race.analysis\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing race.analysis imported {out.stdout.strip()}"


def test_modules_import_only_numpy_pandas_scipy_and_stdlib():
    pkg = Path(analysis.__file__).parent
    for path in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in ALLOWED_TOP or name in ALLOWED_RACE, f"{path.name} imports {name}"


def test_same_input_same_output_and_inputs_untouched(crossing_study):
    runs, evals = crossing_study
    runs0, evals0 = runs.copy(deep=True), evals.copy(deep=True)
    calls = [
        lambda: final_scores(evals, runs, "greedy", at="budget"),
        lambda: frontier(evals, runs, "greedy"),
        lambda: regimes(evals, runs, "greedy", n_boot=100, rng=5),
        lambda: rank_stability(evals, runs, "greedy"),
        lambda: isoflop_table(evals, runs, "greedy", n_boot=50, rng=5),
        lambda: recommend(evals, runs, "greedy", 3e16, n_boot=10, rng=5).predictions,
    ]
    for call in calls:
        pd.testing.assert_frame_equal(call(), call())
    pd.testing.assert_frame_equal(runs, runs0)
    pd.testing.assert_frame_equal(evals, evals0)
    # a different seed changes the bootstrap, so the seed really is the only randomness
    a = regimes(evals, runs, "greedy", n_boot=100, rng=5)["lo"]
    b = regimes(evals, runs, "greedy", n_boot=100, rng=6)["lo"]
    assert not a.equals(b)
