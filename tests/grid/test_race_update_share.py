"""The update share p as a racing axis (issue 48, item 4): a ``protocol: race`` grid whose
allocations differ in p through ``num_update_generations`` (the update trains on m of each
prompt's G rollouts: p falls) and ``num_iterations`` (p rises) runs end to end on the tiny
family's warm start (tiny-xs, partial credit) with the real racing rule, through the
driver's public entry ``race.protocol.racing.run_race``: every rung runs and is decided,
the allocations are one line of the update-share analysis, and their measured p is ordered
as the knobs say."""

from __future__ import annotations

import numpy as np
import pytest

from race.grid import load_tables
from race.protocol.racing import run_race
from race.spec.grid import grid_spec_from_dict


T = 1.2e10


def _grid():
    return {"study": "race-p", "protocol": "race", "budgets": [6e8], "seeds": [0, 1], "require_budget_span": False,
            "race": {"target_budget": T, "rungs": ["1/8", "1/3"], "rule": {"floor_steps": 0}},  # the floor: tests/grid/test_grid_race.py
            "base": {"model": "tiny-xs", "prompts_per_step": 4, "num_generations": 4, "max_prompt_length": 24,
                     "max_completion_length": 16, "reward": "rule:partial", "learning_rate": 1e-3,
                     "lora": {"r": 8, "lora_alpha": 8}, "torch_threads": 1,
                     "eval": {"n_problems": 16, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"],
                              "num_points": 1}},
            "axes": {"num_update_generations": [2, 4], "num_iterations": [1, 2]}, "min_steps": 0, "max_retries": 0,
            "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1, "preload_torch": False}}


@pytest.mark.slow
def test_a_race_over_update_shares_runs_end_to_end(tmp_path):
    from race.analysis.update_share import run_shares

    study = tmp_path / "study"
    res = run_race(grid_spec_from_dict(_grid()), study, poll_s=0.1)
    assert res.finished and not res.failed and len(res.decisions) == 2
    runs = load_tables(study)["runs"]
    shares = run_shares(runs)
    assert shares["line"].nunique() == 1  # one model, group and reward: the knobs move p along one line
    first = shares[np.isclose(shares["budget"], T / 8)]
    p = first.groupby("allocation")["p"].mean()
    assert len(p) == 4 and first.groupby("allocation").size().eq(2).all()  # 4 allocations x 2 seeds at rung 0

    def at(m: int, it: int) -> float:
        return float(p[[a for a in p.index if f"it={it}|" in a and f"num_update_generations={m}" in a][0]])

    assert at(2, 1) < at(4, 1) < at(4, 2) and at(2, 1) < at(2, 2) < at(4, 2)
    assert at(2, 1) < 0.7 < at(4, 2)
    assert set(res.decisions[0]["go_on"]) <= set(p.index) and res.pick in set(p.index)
    later = shares[np.isclose(shares["budget"], T / 3)]
    assert set(later["allocation"]) == set(res.decisions[0]["go_on"])  # rung 1 ran the ones that went on
