"""Synthetic studies with known ground truth for the analysis tests.

Each allocation follows a known saturating curve R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B);
a run adds a constant seed offset (normal, ``seed_sd``) and evaluates ``n_problems``
Bernoulli problems at each evaluation point, so per-problem vectors exist for the
problem bootstrap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from race.analysis import RUNS_COLUMNS, saturating_curve


@dataclass(frozen=True)
class Alloc:
    model: str
    model_params: float
    r0: float
    a: float
    b: float
    c_mid: float
    num_generations: int = 8
    prompts_per_step: int = 16
    num_iterations: int = 1
    learning_rate: float = 1e-5
    reward: str = "rule"
    zero_var_frac: float = 0.2
    trunc_rate: float = 0.05

    def truth(self, c):
        return saturating_curve(c, self.r0, self.a, self.b, self.c_mid)

    @property
    def key(self) -> str:
        lr = f"{self.learning_rate:g}"
        return (f"{self.model}|G={self.num_generations}|P={self.prompts_per_step}|it={self.num_iterations}"
                f"|lr={lr}|{self.reward}")


def make_study(allocs, budgets, seeds=(0, 1, 2), n_points=8, n_problems=400, seed_sd=0.01,
               rng=0, target="greedy", first_fraction=1 / 32, truth_override=None, step0=True):
    """(runs, evals) for every allocation x budget x seed.

    ``truth_override(alloc, budget, flops) -> scores`` replaces the allocation's curve
    (used to plant budget-specific outcomes). ``step0`` adds the step-0 evaluation (flops 0,
    the curve's start R0) that real runs record.
    """
    gen = np.random.default_rng(rng)
    gen0 = np.random.default_rng([rng, 7919])  # step-0 draws apart, so the other draws keep their values
    run_rows, eval_rows = [], []
    for ai, al in enumerate(allocs):
        for budget in budgets:
            for seed in seeds:
                run_id = f"r{ai:02d}-{budget:.0e}-s{seed}"
                offset = gen.normal(0.0, seed_sd)
                flops = budget * np.geomspace(first_fraction, 1.0, n_points)
                true = truth_override(al, budget, flops) if truth_override else al.truth(flops)
                p = np.clip(true + offset, 0.0, 1.0)
                if step0:  # the base model before training: the curve's start R0, no seed offset
                    per0 = (gen0.random(n_problems) < al.r0).astype(float) if n_problems else None
                    eval_rows.append(dict(run_id=run_id, step=0, flops=0.0, target=target,
                                          score=float(per0.mean()) if n_problems else al.r0, n=n_problems,
                                          per_problem=None if per0 is None else list(per0)))
                for step, (c, pi) in enumerate(zip(flops, p)):
                    per = (gen.random(n_problems) < pi).astype(float) if n_problems else None
                    score = float(per.mean()) if n_problems else float(pi)
                    eval_rows.append(dict(run_id=run_id, step=(step + 1) * 10, flops=float(c), target=target,
                                          score=score, n=n_problems, per_problem=None if per is None else list(per)))
                row = {k: None for k in RUNS_COLUMNS}
                row.update(
                    run_id=run_id, study="synthetic", budget=float(budget), model=al.model,
                    model_params=al.model_params, num_generations=al.num_generations,
                    prompts_per_step=al.prompts_per_step, num_iterations=al.num_iterations,
                    learning_rate=al.learning_rate, reward=al.reward, seed=seed, status="complete",
                    total_flops=float(budget), rollout_flops=0.7 * budget, learning_flops=0.25 * budget,
                    feedback_flops=0.05 * budget, steps=10 * n_points, wall_s=1.0,
                    zero_var_frac=al.zero_var_frac, trunc_rate=al.trunc_rate,
                )
                run_rows.append(row)
    return pd.DataFrame(run_rows), pd.DataFrame(eval_rows)


# Three sizes whose curves cross: the small model wins at small budgets, the large model
# at large budgets (a planted regime change along the size axis).
SMALL = Alloc("s", 1e6, r0=0.05, a=0.45, b=1.5, c_mid=3e13)
MEDIUM = Alloc("m", 4e6, r0=0.05, a=0.60, b=1.5, c_mid=1e14)
LARGE = Alloc("l", 1.6e7, r0=0.05, a=0.80, b=1.5, c_mid=6e14)


def rising_power_world():
    """A known world for the racing tests (``race.analysis.synthetic.World``, T = 4e12) whose
    best allocation, small G=4, follows a power law still rising in logit at T/3 (which the
    joint model's saturating family bends down), beside three saturating or flat rivals; and
    the frozen racing design (``race.analysis.racing.RACE_RUNGS``, ``RACE_FIRST_SEEDS``)."""
    from race.analysis.racing import RACE_FIRST_SEEDS, RACE_RUNGS
    from race.analysis.synthetic import Curve, World
    from race.analysis.synthetic_race import RaceDesign

    T = 4e12
    curves = {("small", 4): Curve("power", 0.2, 0.5, 2e12, 0.5), ("small", 8): Curve("sigmoid", 0.25, 0.3, 5e10, 1.5),
              ("large", 4): Curve("flat", 0.15, 0.0, 1e11), ("large", 8): Curve("sigmoid", 0.3, 0.25, 2e11, 1.2)}
    w = World(name="power", models={"small": 1e5, "large": 4e5},
              allocations=[{"model": m, "num_generations": g, "curve": c} for (m, g), c in curves.items()],
              budgets=[T / 100, T / 30, T / 10], seeds=[0, 1, 2], target_budget=T, n_problems=500, seed_sd=0.05, seed=3)
    return w, RaceDesign(rungs=RACE_RUNGS, first_seeds=RACE_FIRST_SEEDS)
