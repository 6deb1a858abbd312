"""Synthetic studies for the report tests, built on tests/analysis/analysis_synth.py
(imported by path, so no other test folder's module can shadow it).

:func:`full_study` has every ingredient a report can use: 3 model sizes, a group-size
variant, a process-RM allocation that over-optimises (its proxy reward rises while
verified accuracy falls), a random-reward control, 3 budgets x 2 seeds, two targets,
a train table, a ledger with seconds, wall seconds that disagree with FLOPs, and one
failed cell. :func:`sparse_study` has one budget, one size, no control, no PRM, no
train table, no ledger, no wall seconds and a failed cell.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd

_SYNTH = Path(__file__).resolve().parents[1] / "analysis" / "analysis_synth.py"
_NAME = "race_tests_analysis_synth"
if _NAME in sys.modules:
    synth = sys.modules[_NAME]
else:
    _spec = importlib.util.spec_from_file_location(_NAME, _SYNTH)
    assert _spec is not None and _spec.loader is not None
    synth = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = synth  # dataclasses look their module up while the class is built
    _spec.loader.exec_module(synth)

Alloc, make_study = synth.Alloc, synth.make_study
SMALL, MEDIUM, LARGE = synth.SMALL, synth.MEDIUM, synth.LARGE
MEDIUM_G4 = dataclasses.replace(MEDIUM, num_generations=4, r0=0.04, zero_var_frac=0.35)
MEDIUM_IT2 = dataclasses.replace(MEDIUM, num_iterations=2, r0=0.05, a=0.55)  # more learning per rollout: another p
PRM = dataclasses.replace(SMALL, reward="prm:prm-s", r0=0.30, a=0.12, c_mid=1e14)  # verified accuracy falls
RANDOM = dataclasses.replace(SMALL, reward="random", r0=0.05, a=0.07)
N_BOOT, N_BOOT_FIT = 60, 10  # few replicates: the tests compare with the analysis run with the same settings
FLOPS_PER_SECOND = {"s": 4e13, "m": 2e14, "l": 6e14}  # overhead-bound: small models waste time


def _add_target(allocs, budgets, seeds, rng, target, scale):
    def truth(al, budget, flops):
        return np.clip(scale * al.truth(flops), 0, 1)

    return make_study(allocs, budgets=budgets, seeds=seeds, n_points=6, n_problems=120, rng=rng, target=target,
                      truth_override=truth)


def _train_table(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for r in runs.itertuples():
        x = np.linspace(0.1, 1.0, 8)
        if r.reward == "random":
            proxy = np.full(8, 0.5)
        else:
            proxy = 0.2 + 0.5 * x  # the proxy (training) reward rises for every real reward
        rows.append(pd.DataFrame({"run_id": r.run_id, "step": np.arange(1, 9), "flops": x * r.budget,
                                  "reward_mean": proxy}))
    return pd.concat(rows, ignore_index=True)


def _ledger(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for r in runs.itertuples():
        secs = r.wall_s
        rows += [
            dict(run_id=r.run_id, step=1, phase="rollout", component="decode", flops=r.rollout_flops, tokens=0,
                 seconds=0.8 * secs, counted=True),
            dict(run_id=r.run_id, step=1, phase="update", component="backward", flops=0.8 * r.learning_flops,
                 tokens=0, seconds=0.12 * secs, counted=True),
            dict(run_id=r.run_id, step=1, phase="old_logprobs", component="forward", flops=0.2 * r.learning_flops,
                 tokens=0, seconds=0.05 * secs, counted=True),
            dict(run_id=r.run_id, step=1, phase="reward", component="rule", flops=r.feedback_flops, tokens=0,
                 seconds=0.03 * secs, counted=True),
            dict(run_id=r.run_id, step=1, phase="eval", component="generate", flops=1e9, tokens=0, seconds=0.5,
                 counted=False),
        ]
    return pd.DataFrame(rows)


def _failed_row(runs: pd.DataFrame, al: Alloc, budget: float, seed: int = 9) -> dict:
    row = {c: None for c in runs.columns}
    row.update(run_id=f"failed-{al.model}-{budget:.0e}", study=runs["study"].iloc[0], budget=float(budget),
               model=al.model, model_params=np.nan, num_generations=al.num_generations,
               prompts_per_step=al.prompts_per_step, num_iterations=al.num_iterations,
               learning_rate=al.learning_rate, reward=al.reward, seed=seed, status="failed",
               error="Traceback (most recent call last):\n  ...\nRuntimeError: CUDA out of memory (planted)")
    return row


def full_study() -> dict[str, pd.DataFrame]:
    allocs = [SMALL, MEDIUM, LARGE, MEDIUM_G4, PRM, RANDOM, MEDIUM_IT2]
    budgets, seeds = [1e14, 1e15, 1e16], (0, 1)
    runs, ev_g = _add_target(allocs, budgets, seeds, 1, "greedy", 1.0)
    _, ev_p = _add_target(allocs, budgets, seeds, 2, "pass@k", 1.15)
    size = runs["model"].map({"s": "s", "m": "m", "l": "l"})
    runs["wall_s"] = runs["total_flops"] / size.map(FLOPS_PER_SECOND)
    runs["error"] = None
    it2 = runs["num_iterations"] == MEDIUM_IT2.num_iterations  # a second update share p beside MEDIUM's
    runs.loc[it2, "rollout_flops"], runs.loc[it2, "learning_flops"] = (0.55 * runs.loc[it2, "total_flops"],
                                                                       0.4 * runs.loc[it2, "total_flops"])
    train, ledger = _train_table(runs), _ledger(runs)
    runs = pd.concat([runs, pd.DataFrame([_failed_row(runs, LARGE, 1e14)])], ignore_index=True)
    return {"runs": runs, "evals": pd.concat([ev_g, ev_p], ignore_index=True), "train": train, "ledger": ledger}


def sparse_study() -> dict[str, pd.DataFrame]:
    alloc_g4 = dataclasses.replace(MEDIUM, num_generations=4, r0=0.04)
    runs, evals = make_study([MEDIUM, alloc_g4], budgets=[1e15], seeds=(0, 1), n_points=5, n_problems=0, rng=3)
    runs["wall_s"] = np.nan
    runs["error"] = None
    runs = pd.concat([runs, pd.DataFrame([_failed_row(runs, MEDIUM, 1e15)])], ignore_index=True)
    return {"runs": runs, "evals": evals.drop(columns=["per_problem"])}


def finished_flops(runs: pd.DataFrame) -> float:
    """Total FLOPs the report card must show: every finished run."""
    done = runs[runs["status"].isin(["complete", "diverged"])]
    return float(done["total_flops"].sum())
