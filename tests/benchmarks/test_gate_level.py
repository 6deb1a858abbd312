"""benchmarks/gate_level.py in a reduced form: the gate alone on a few null and learning worlds
of both generators, both df rules, the table and the command line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gate_level.py"


@pytest.fixture(scope="module")
def gl(load_script):
    return load_script("benchmarks/gate_level.py")


def test_records_and_table(gl):
    alphas = (0.05, 0.01)
    null = [gl.world_record("test", s, True, alphas) for s in range(3)]
    learning = [gl.world_record("test", s, False, alphas) for s in range(3)]
    tune = gl.world_record("tune", 1000, True, alphas)
    for r in null + learning + [tune]:
        assert set(r["passes"]) == {"welch@0.05", "size-safe@0.05", "welch@0.01", "size-safe@0.01"}
        for a in ("0.05", "0.01"):  # kappa >= 1: the size-safe df are never more, its passes a subset
            assert r["passes"][f"size-safe@{a}"] <= r["passes"][f"welch@{a}"] <= 4
        assert r["passes"]["size-safe@0.01"] <= r["passes"]["size-safe@0.05"]
        assert r["n_seeds"] in (2, 3) and 200 <= r["n_problems"] <= 1000
    assert any(r["passes"]["size-safe@0.05"] > 0 for r in learning)  # these worlds learn
    # the table counts worlds with any pass (null) or none (learning), with a Wilson interval
    fake = [dict(null[0], passes={k: v for k, v in zip(null[0]["passes"], (1, 0, 0, 0))}),
            dict(null[1], passes={k: 0 for k in null[1]["passes"]})]
    all_row = next(line for line in gl.table(fake, alphas, True).splitlines() if line.startswith("| all "))
    lo, hi = gl.wilson(1, 2)
    assert all_row.startswith(f"| all | 2 | 50.0% [{lo:.3f}, {hi:.3f}] | 0.0% [0.000, ")
    all_row = next(line for line in gl.table(fake, alphas, False).splitlines() if line.startswith("| all "))
    assert all_row.startswith("| all | 2 | 50.0% ") and "| 100.0% [" in all_row


def test_command_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(SCRIPT), "--generator", "test", "--null", "--worlds", "3",
                          "--first", "100000", "--jobs", "1", "--alpha", "0.05"],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert "# gate level: 3 null worlds of the test generator, seeds 100000..100002" in out
    assert "| worlds: any allocation passes (false pass) | n | welch@0.05 | size-safe@0.05 |" in out
    assert "| all | 3 |" in out
