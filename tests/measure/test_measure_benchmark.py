"""benchmarks/accounting_error.py runs and its RACE (torch) column is exact everywhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "accounting_error.py"


@pytest.mark.slow
def test_benchmark_table(capsys):
    spec = importlib.util.spec_from_file_location("accounting_error", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--lengths", "64", "--presets", "qwen2.5-0.5b", "--meta-new-tokens", "4",
                     "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if r.startswith("| ") and "measured FLOPs" not in r]
    assert len(rows) == 3 * 4  # three models x four phases at one length
    col = out.splitlines()[2].split(" | ").index("RACE (torch)")
    assert all(r.split(" | ")[col] == "0 (exact)" for r in rows)
