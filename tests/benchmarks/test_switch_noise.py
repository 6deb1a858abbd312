"""benchmarks/switch_noise.py on a few worlds: the rows are the switch rule's own replicates and
the true differences, and the summary counts every pair once per slope bin."""

import numpy as np
import pytest


@pytest.fixture(scope="module")
def sn(load_script):
    return load_script("benchmarks/switch_noise.py")


def test_pairs_measure_the_replicates_against_the_truth(sn):
    rows = []
    for seed in range(20000, 20010):
        rows += sn.world_pairs("test", seed, "flat")
        if len(rows) >= 6:
            break
    assert len(rows) >= 3
    for r in rows:
        assert r["where"] == "flat" and r["sd"] > 0 and np.isfinite(r["err"]) and 0 < r["f"] <= 0.5 + 1e-12
    table = sn.summary(rows)
    all_row = [line for line in table if line.startswith("| flat | all |")]
    assert len(all_row) == 1 and int(all_row[0].split("|")[3]) == len(rows)
    binned = sum(int(line.split("|")[3]) for line in table[2:] if "| all |" not in line)
    assert binned == len(rows)
