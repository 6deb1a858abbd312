"""Known worlds: synthetic pilot studies whose truth is known, to test RACE's decisions.

A world has a few allocations (model size x group size), each with a true expected score
mu_k(C) after C counted FLOPs from a family the fitter may or may not assume:

- ``sigmoid``       r0 + g expit(s (ln C - ln c))             (the fitter's saturating form)
- ``power``         r0 + g (C / c)^s                           (unbounded growth, clipped)
- ``loglinear``     r0 + g ln(1 + C / c)                       (straight line in log FLOPs late on)
- ``weibull``       r0 + g (1 - exp(-(C / c)^s))               (saturation of another shape)
- ``rise_decline``  r0 + g (C / c) exp(1 - C / c)              (over-optimisation: peak at c)
- ``flat``          r0                                         (nothing is learned)

Evaluation outcomes are per problem and shared across runs: problem j has difficulty
d_j ~ N(0, sd_d^2) (one draw per world), and a run at mean mu solves it with probability
p_j = expit(theta(mu) + delta - d_j), where theta(mu) makes the POPULATION mean equal mu and
delta is the run's seed offset (logit scale, applied after step 0). Outcomes of one model
are correlated across its evaluations through a latent z_j per (model, problem) (a
Gaussian copula with correlation ``rho``), so two checkpoints disagree on some problems but
not on most, as real ones do. The step-0 evaluation is the base model: the same outcomes
for every seed of that model. "Truth" is the population mean mu_k at the FLOPs a run at
the target budget counts (target budget x mean spend share): the quantity a forecast
interval should cover.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from race.accounting.guard import is_budget

from .synthetic_base import (  # Curve and World have their home there (imported from here too)
    CURVE_FAMILIES,
    LEARNING_RATE,
    Curve,
    World,
    group_factor,
    layout,
    size_ladder,
)

#: Pilot designs of :func:`world_tables` (see "Nested designs" below)
DESIGNS = ("flat", "nested", "nested-equal-compute", "nested-split", "flat-trajectory", "nested-dense")
DENSE_BUDGETS = 6  # budget points of ``nested-dense``: log-spaced from the smallest to the largest pilot budget


def equal_compute_seeds(n_seeds: int, budgets: list[float]) -> int:
    """Seeds a nested design buys with a flat design's compute: floor(n_seeds x sum(budgets) / max(budgets)).

    A flat design runs every budget for every seed (sum(budgets) per allocation and seed); a
    nested one runs only the largest (max(budgets)) and reads the others at its prefixes."""
    if n_seeds < 1 or not budgets or not all(is_budget(b) for b in budgets):
        raise ValueError(f"need n_seeds >= 1 and positive budgets, got {n_seeds} and {budgets}")
    return int(np.floor(n_seeds * sum(budgets) / max(budgets) * (1 + 1e-12)))


def crossover_class(world: World) -> str:
    """Where the truly best allocation changes: ``after`` (best at the largest pilot != best at
    the target), ``beyond`` (best at the target != best at 10x the target), ``within`` (best at
    the smallest pilot != best at the largest), else ``none``. Truths are end-of-run means."""
    def best(b: float) -> int:
        return int(np.argmax([world.truth(k, b) for k in range(len(world.allocations))]))
    b1, b3, t = world.budgets[0], world.budgets[-1], world.target_budget
    if best(b3) != best(t):
        return "after"
    if best(t) != best(10 * t):
        return "beyond"
    if best(b1) != best(b3):
        return "within"
    return "none"


def move_pilots(world: World, target_ratio: float) -> World:
    """The same world with its pilot budgets multiplied by m = target / (ratio x largest pilot),
    so that the target is ``target_ratio`` x the largest pilot: the same curves, seeds, span
    and target, pilots run closer to (or further from) it. Tags follow: ``target_ratio``, and
    ``crossover`` re-derived (:func:`crossover_class`) where the world carries one."""
    if not is_budget(target_ratio) or target_ratio < 1:
        raise ValueError(f"target_ratio must be a number >= 1 (the target at or beyond the largest pilot), "
                         f"got {target_ratio!r}")
    m = world.target_budget / (target_ratio * max(world.budgets))
    moved = replace(world, budgets=[float(b * m) for b in world.budgets],
                                tags={**world.tags, "target_ratio": float(target_ratio)})
    if "crossover" in world.tags:
        moved.tags["crossover"] = crossover_class(moved)
    return moved


def design_compute(world: World, design: str = "flat") -> float:
    """Pilot FLOPs: allocations x seeds x (sum(budgets) flat, max(budgets) nested)."""
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")
    n = len(world.allocations)
    if design in ("flat", "flat-trajectory"):
        return n * len(world.seeds) * float(sum(world.budgets))
    seeds = equal_compute_seeds(len(world.seeds), world.budgets) if design == "nested-equal-compute" else len(world.seeds)
    return n * seeds * float(max(world.budgets))


def random_world(seed: int, flat: bool | None = None, families: tuple[str, ...] = CURVE_FAMILIES, k: int = 4) -> World:
    """A world drawn at random: 2 sizes x 2 group sizes (``k`` = 4; 12 and 24 draw 3 sizes x G
    2-16 and 4 sizes x G 2-64, :data:`race.analysis.synthetic_base.LAYOUTS`), 3 pilot budgets
    spanning 4-10x, 2-3 seeds, a target 4-16x beyond the largest pilot; ``flat`` forces (or forbids)
    a world where nothing is learned. Curves of larger models start higher and learn more slowly
    per FLOP, so crossovers between budgets happen in some worlds and not in others. K = 4 draws
    exactly what it drew before K existed; K > 4 draws its sizes and allocations from a stream of
    its own (the world's budgets, seeds, target and family as the K = 4 world of the seed has them)."""
    names, groups = layout(k)
    rng = np.random.default_rng([seed, 99])
    arng = rng if k == 4 else np.random.default_rng([seed, 99, k])
    b1 = 10 ** rng.uniform(10, 12)
    span = rng.uniform(4, 10)
    budgets = [b1, b1 * np.sqrt(span), b1 * span]
    seeds = list(range(int(rng.integers(2, 4))))
    target = budgets[-1] * rng.uniform(4, 16)
    is_flat = bool(rng.random() < 0.2) if flat is None else flat
    learning = [f for f in families if f != "flat"] or ["flat"]
    world_family = "flat" if is_flat else str(rng.choice(learning))
    models = {"small": 1e5, "large": 1e5 * rng.uniform(3, 8)} if k == 4 else size_ladder(arng, names, (2.0, 4.0))
    r0 = r0_small = rng.uniform(0.1, 0.4)
    allocs = []
    for i, model in enumerate(models):
        if k == 4:
            r0 = r0_small + (rng.uniform(0.05, 0.25) if model == "large" else 0.0)
        elif i:
            r0 = r0 + arng.uniform(0.03, 0.15)
        slow = models[model] / 1e5  # per-FLOP learning slows with size
        for g in groups:
            fam = world_family if (is_flat or arng.random() > 0.3) else str(arng.choice(learning))
            gain = 0.0 if fam == "flat" else arng.uniform(0.05, 0.6) * (1 - r0)
            c = b1 * 10 ** arng.uniform(-0.5, 1.5) * slow * group_factor(arng, g, 0.7, 1.5)
            shape = {"sigmoid": arng.uniform(0.6, 2.5), "power": arng.uniform(0.15, 0.7),
                     "weibull": arng.uniform(0.4, 1.5)}.get(fam, 1.0)
            if fam == "loglinear":
                gain /= 3.0
            allocs.append({"model": model, "num_generations": g, "curve": Curve(fam, float(r0), float(gain), float(c),
                                                                                  float(shape))})
    return World(name=f"world-{seed}" + ("" if k == 4 else f"-k{k}"), models=models, allocations=allocs,
                 budgets=[float(b) for b in budgets], seeds=seeds, target_budget=float(target),
                 n_problems=int(rng.choice([200, 500, 1000])), seed_sd=float(rng.uniform(0.02, 0.12)), seed=int(seed),
                 tags={"family": world_family, "flat": is_flat, "span": float(span),
                       "target_ratio": float(target / budgets[-1])})


def run_row(world: World, a: dict, rid: str, budget: float, seed: int, total: float) -> dict:
    """One complete run's row of the runs table (``race.schema`` layout) for allocation ``a`` of ``world``,
    with ``steps`` (:meth:`World.run_steps` at ``total``) and ``warmup_steps`` (:meth:`World.warmup_steps`)."""
    from .tables import RUNS_COLUMNS

    row = {c: None for c in RUNS_COLUMNS}
    row.update(run_id=rid, study=world.name, budget=budget, model=a["model"],
               model_params=world.models[a["model"]], num_generations=a["num_generations"],
               prompts_per_step=4, num_iterations=1, learning_rate=a.get("learning_rate", LEARNING_RATE), reward="rule",
               seed=seed, status="complete", total_flops=total, rollout_flops=0.7 * total,
               learning_flops=0.3 * total, feedback_flops=0.0, steps=world.run_steps(a, seed, total), wall_s=1.0,
               zero_var_frac=0.1, trunc_rate=0.0)
    row["warmup_steps"] = world.warmup_steps(a)  # beside ``steps``: what a step floor needs (not a race.schema column)
    return row


def world_tables(world: World, design: str = "flat") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, evals) of every pilot cell of ``world`` in the analysis schema, without a grid. ``design``:
    ``flat`` (every budget x seed its own run, drawn independently, which a real grid does not);
    ``flat-trajectory`` (a flat grid as the engine runs it at a constant learning rate: each run its
    own ``n_points`` evaluations, a seed's runs at every budget one trajectory, docs/analysis.md
    section 8: :func:`trajectory_tables`); ``nested`` (one run per allocation and seed at the largest
    budget, read at the smaller budgets' stops: :func:`nested_tables`); ``nested-equal-compute``
    (nested with the seeds the flat design's compute buys: :func:`equal_compute_seeds`);
    ``nested-dense`` (nested read at ``DENSE_BUDGETS`` log-spaced budgets: more back-test origins);
    ``nested-split``, a diagnostic: every trajectory point in ONE row (step 0 and the points after
    the previous budget's stop), as if the analysis read the prefix rows without repeats."""
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")
    if design == "flat-trajectory":
        return trajectory_tables(world)
    if design == "nested-dense":
        dense = np.geomspace(min(world.budgets), max(world.budgets), DENSE_BUDGETS)
        return nested_tables(replace(world, budgets=[float(b) for b in dense]), list(world.seeds))
    if design != "flat":
        n = equal_compute_seeds(len(world.seeds), world.budgets) if design == "nested-equal-compute" else len(world.seeds)
        return nested_tables(world, list(range(n)), split=design == "nested-split")
    run_rows, eval_rows = [], []
    for k, a in enumerate(world.allocations):
        for budget in world.budgets:
            for seed in world.seeds:
                rid = f"{a['model']}-G{a['num_generations']}-{budget:.3g}-s{seed}"
                pts = distinct_points(world.run_outcomes(k, budget, seed))
                for step, (c, per) in enumerate(pts):
                    eval_rows.append(dict(run_id=rid, step=step, flops=c, target="greedy", score=float(per.mean()),
                                          n=len(per), per_problem=per.tolist()))
                run_rows.append(run_row(world, a, rid, budget, seed, pts[-1][0]))
    return pd.DataFrame(run_rows), pd.DataFrame(eval_rows)


def nested_tables(world: World, seeds: list[int], split: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, evals) of a nested design: per allocation and seed one run at the largest budget
    (:meth:`World.trajectory` at its own points and at the smaller budgets' stopping points,
    :meth:`World.nested_schedule`), plus one row per smaller budget as the grid store writes
    it (``race.grid.store``): run id ``<long run>.p<i>``, ``prefix_of`` the long run, and the
    long run's evaluations up to that budget's stopping point (the same rows, repeated).
    ``split``: every row keeps only step 0 and its points after the previous budget's stop."""
    run_rows, eval_rows = [], []
    budgets = sorted(world.budgets)
    for k, a in enumerate(world.allocations):
        for seed in seeds:
            rid = f"{a['model']}-G{a['num_generations']}-{budgets[-1]:.3g}-s{seed}"
            own, stops = world.nested_schedule(k, seed)
            traj = distinct_points(world.trajectory(k, seed, [0.0] + sorted(own + stops)))
            pts = [(step, c, per) for step, (c, per) in enumerate(traj)]
            edges = [0.0] + [world.stop_flops(k, seed, s) for s in stops] + [np.inf]
            rows = [(f"{rid}.p{i}" if i < len(stops) else rid, b, rid if i < len(stops) else None,
                     [p for p in pts if p[1] <= edges[i + 1] and (not split or p[1] == 0.0 or p[1] > edges[i])])
                    for i, b in enumerate(budgets)]
            rows = rows[-1:] + rows[:-1]  # the long run first, then its prefixes
            for run_id, budget, parent, run_pts in rows:
                for step, c, per in run_pts:  # the long run's step numbers, as the store keeps them
                    eval_rows.append(dict(run_id=run_id, step=step, flops=c, target="greedy", score=float(per.mean()),
                                          n=len(per), per_problem=per.tolist()))
                row = run_row(world, a, run_id, budget, seed, run_pts[-1][1])
                row["prefix_of"] = parent
                run_rows.append(row)
    return pd.DataFrame(run_rows), pd.DataFrame(eval_rows)


def distinct_points(points: list[tuple[float, np.ndarray]]) -> list[tuple[float, np.ndarray]]:
    """``points`` (counted FLOPs, outcomes) without repeats of a FLOPs value (the first kept): readings
    that fell on the same optimizer step are one evaluation of one checkpoint (the step generator)."""
    out, seen = [], set()
    for p in points:
        if p[0] not in seen:
            seen.add(p[0])
            out.append(p)
    return out


def trajectory_tables(world: World) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, evals) of a flat grid at a constant learning rate: per allocation and seed ONE
    trajectory (:meth:`World.trajectory`), of which the run at budget b_j is the part up to
    where it stops (:meth:`World.nested_schedule`: the same stops as the nested design),
    evaluated at its own ``n_points`` even fractions of that (each run its own points, as
    each run of a real flat grid evaluates on its own schedule), written at the FLOPs the
    trajectory counted there (a step world's readings fall on whole steps: :func:`distinct_points`)."""
    run_rows, eval_rows = [], []
    budgets = sorted(world.budgets)
    for k, a in enumerate(world.allocations):
        for seed in world.seeds:
            own, stops = world.nested_schedule(k, seed)
            ends = stops + [own[-1]]
            sched = [[e * (i + 1) / world.n_points for i in range(world.n_points)] for e in ends]
            flops = [0.0] + sorted(c for pts in sched for c in pts)
            traj = dict(zip(flops, world.trajectory(k, seed, flops)))
            for b, pts in zip(budgets, sched):
                rid = f"{a['model']}-G{a['num_generations']}-{b:.3g}-s{seed}"
                read = distinct_points([traj[c] for c in [0.0] + pts])
                for step, (c, per) in enumerate(read):
                    eval_rows.append(dict(run_id=rid, step=step, flops=c, target="greedy", score=float(per.mean()),
                                          n=len(per), per_problem=per.tolist()))
                run_rows.append(run_row(world, a, rid, b, seed, read[-1][0]))
    return pd.DataFrame(run_rows), pd.DataFrame(eval_rows)
