"""A two-cell grid with ``engine: trl`` through the real grid runner and SQLite store."""

from __future__ import annotations

import pytest


@pytest.mark.trl
def test_two_cell_trl_grid_completes_into_the_store(tiny_model_dir, tmp_path):
    from race.grid import load_tables, run_grid

    spec = {
        "study": "trl-two-cells",
        "budgets": [2.5e9],
        "require_budget_span": False,
        "base": {"model": str(tiny_model_dir), "prompts_per_step": 4, "max_completion_length": 12,
                 "reward": "random", "learning_rate": 1e-3, "lora": {"r": 4, "lora_alpha": 4}},
        "axes": {"num_generations": [2, 4]},
        "seeds": [0],
        "eval": {"n_problems": 8, "n_hard_problems": 4, "n_pass_problems": 4, "pass_k": 2, "num_points": 2},
        "engine": "trl",
        "runner": {"kind": "local", "workers": 1, "threads_per_worker": 1},
        "max_retries": 0,
    }
    result = run_grid(spec, tmp_path / "study")
    assert result.complete == 2 and not result.failed
    tables = load_tables(tmp_path / "study")
    runs = tables["runs"]
    assert len(runs) == 2 and set(runs["status"]) == {"complete"}
    assert (runs["total_flops"] <= 2.5e9).all() and (runs["rollout_flops"] > 0).all()
    assert set(tables["evals"]["target"]) == {"greedy", "pass@k", "hard"}
