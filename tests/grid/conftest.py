"""Shared helpers for the grid tests: a small grid on the fake engine, and a snapshot of a
study's stored rows (minus wall-clock fields) for exact comparisons."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py").resolve()
FAKE_CELL_FN = f"{FAKE_ENGINE}:run_engine"

BASE_GRID: dict[str, Any] = {
    "study": "t",
    "budgets": [2e9, 2e10],
    "base": {"prompts_per_step": 4, "max_prompt_length": 16, "max_completion_length": 16,
             "eval": {"n_problems": 16, "n_hard_problems": 8, "n_pass_problems": 8}},
    "axes": {"model": ["tiny-xs", "tiny-s"], "num_generations": [4, 8]},
    "seeds": [0],
    "min_steps": 0,
    "max_retries": 2,
    "cell_fn": FAKE_CELL_FN,
    "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1, "preload_torch": False},
}


def grid(**changes: Any) -> dict[str, Any]:
    """BASE_GRID with top-level keys replaced."""
    g = copy.deepcopy(BASE_GRID)
    g.update(copy.deepcopy(changes))
    return g


def write_grid(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def snapshot(study_dir: Path) -> dict[str, Any]:
    """Every stored row that must not depend on timing or interruptions."""
    from race.grid import Store

    with Store(study_dir, create=False) as s:
        runs = {r["run_id"]: (r["status"], r["budget"], r["seed"], r["model"], r["total_flops"], r["steps"])
                for r in s.runs()}
        # a shared step-0 evaluation (race.engines.eval_share) is computed by whichever run of the
        # base model gets there first and read by the rest (eval/generate there, eval/shared at 0
        # FLOPs here): which run that is depends on timing, so those rows keep only that they exist
        ledger = sorted((r["run_id"], r["step"], r["phase"], "step0", 0.0, 0, r["counted"])
                        if r["phase"] == "eval" and r["step"] == 0 and r["component"] in ("generate", "shared")
                        else (r["run_id"], r["step"], r["phase"], r["component"], r["flops"], r["tokens"], r["counted"])
                        for r in s.rows("ledger"))
        evals = sorted((r["run_id"], r["step"], r["flops"], r["target"], r["score"], r["n"], r["per_problem_json"])
                       for r in s.rows("evals"))
        train = sorted((r["run_id"], r["step"], r["flops"],
                        json.dumps({k: v for k, v in json.loads(r["metrics_json"]).items() if k != "seconds"},
                                   sort_keys=True))
                       for r in s.rows("train_metrics"))
    return {"runs": runs, "ledger": ledger, "evals": evals, "train": train}


@pytest.fixture(autouse=True)
def _no_fake_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RACE_FAKE_STEP_SLEEP", raising=False)
