"""benchmarks/accounting_error.py runs and its RACE (torch) column is exact everywhere."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_benchmark_table(capsys, load_script):
    mod = load_script("benchmarks/accounting_error.py")
    assert mod.main(["--lengths", "64", "--presets", "qwen2.5-0.5b", "--meta-new-tokens", "4",
                     "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if r.startswith("| ") and "measured FLOPs" not in r]
    assert len(rows) == 3 * 4  # three models x four phases at one length
    col = out.splitlines()[2].split(" | ").index("RACE (torch)")
    assert all(r.split(" | ")[col] == "0 (exact)" for r in rows)
