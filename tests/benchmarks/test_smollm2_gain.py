"""benchmarks/smollm2_gain.py: the run's gain, the control's, and their difference per
problem, read from run directories as the engines write them."""

from __future__ import annotations

import json

import pytest


def _run_dir(tmp_path, name, first, last, trunc=0.5):
    d = tmp_path / name
    d.mkdir()
    rows = [{"kind": "eval", "target": "greedy", "step": 0, "score": sum(first) / len(first), "per_problem": first}]
    rows += [{"kind": "train", "step": s, "trunc_rate": trunc, "completion_len": 12.0} for s in range(1, 4)]
    rows += [{"kind": "eval", "target": "greedy", "step": 3, "score": sum(last) / len(last), "per_problem": last}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ledger = [{"step": 1, "phase": "rollout", "flops": 5, "seconds": 1.5, "counted": True},
              {"step": 0, "phase": "eval", "flops": 7, "seconds": 2.0, "counted": False}]
    (d / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
    return d


def test_the_gain_against_the_control_is_the_difference_in_differences(load_script, tmp_path, capsys):
    b = load_script("benchmarks/smollm2_gain.py")
    base = [0] * 70 + [1] * 30
    run = _run_dir(tmp_path, "rl", base, [1] * 60 + [0] * 10 + [1] * 30)  # +60 problems
    ctl = _run_dir(tmp_path, "ctl", [1] * 50 + [0] * 50, [0] * 100)       # -50 problems
    rows = {r[0]: r for r in b.gain_rows(b._evals(run), b._evals(ctl))}
    label, before, after, mean, lo, hi, n = rows["RL: first -> last"]
    assert (before, after, n) == (0.3, 0.9, 100) and abs(mean - 0.6) < 1e-12 and 0 < lo < mean < hi <= 1
    assert abs(rows["control: first -> last"][3] + 0.5) < 1e-12
    did = rows["RL gain - control gain"]
    assert abs(did[3] - 1.1) < 1e-12 and did[4] > 0  # 0.6 - (-0.5), not the last scores' 0.9 apart
    assert b.main([str(run), str(ctl)]) == 0
    out = capsys.readouterr().out
    assert "| RL gain - control gain | 0.000 | 0.900 | +1.100 |" in out
    assert "3 steps, 5 counted FLOPs, 4 s in its ledger; last 10 steps: 50.0% of rollouts cut" in out


def test_a_control_on_other_problems_is_refused(load_script, tmp_path):
    b = load_script("benchmarks/smollm2_gain.py")
    run = _run_dir(tmp_path, "rl", [0, 1, 0], [1, 1, 0])
    ctl = _run_dir(tmp_path, "ctl", [0, 1], [0, 0])
    with pytest.raises(SystemExit, match="not paired"):
        b.gain_rows(b._evals(run), b._evals(ctl))
