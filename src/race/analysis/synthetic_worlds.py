"""The known-world generators by name (:func:`make_world`), and what each draws (:func:`world_stats`).

Three generators of synthetic pilot studies whose truth is known:

- ``tune``: :func:`race.analysis.synthetic.random_world`, the TUNING generator (curves in counted
  FLOPs; RACE's rules were set on its seeds);
- ``test``: :func:`race.analysis.synthetic_rl.rl_world`, the TEST generator (curves in FLOPs with a
  format jump, an end-of-schedule bonus, declines, collapses, seed spread growing with compute);
- ``steps``: :func:`race.analysis.synthetic_steps.step_world`, curves in optimizer steps with warmup
  and a per-step FLOP cost, a base rate of ill-behaved curves, seed effects that drift along a run
  (docs/analysis.md section 11).

Each draws K allocations, K in 4, 12, 24. The FLOP generators draw
:data:`race.analysis.synthetic_base.LAYOUTS`: K = 4 is 2 sizes x G {4, 8}, bit for bit the worlds
every past benchmark seed drew; K = 12 is 3 sizes x G {2, 4, 8, 16} and K = 24 4 sizes x G
{2, ..., 64}, the sizes and group sizes drawn as each generator draws its two, from a random stream
of their own. The step generator draws its own grids, some with a learning-rate axis.

``walk`` (``World.seed_walk``, a correlation length in ln C): 0 keeps a run's seed offset fixed
along its trajectory in ``tune`` and ``test``; L > 0 lets it wander, a mean-reverting random walk
in ln C with correlation exp(-|d ln C| / L) (:meth:`race.analysis.synthetic_base.World.offsets`).
In ``steps`` worlds a run's seed effect drifts in any case (a random walk over its optimizer
steps, built in); there ``walk`` L > 0 makes its fixed part wander in ln C as well, on top of the
drift.
"""

from __future__ import annotations

import numpy as np

from .synthetic import crossover_class, random_world
from .synthetic_base import World, check_k
from .synthetic_rl import rl_world
from .synthetic_steps import step_world

#: generator name -> the function that draws its world of a seed and K
DRAW = {"tune": random_world, "test": rl_world, "steps": step_world}
GENERATORS = tuple(DRAW)


def make_world(generator: str, seed: int, k: int = 4, walk: float = 0.0) -> World:
    """A known world by generator name (:data:`GENERATORS`), seed, K (4, 12 or 24) and walk (module
    docstring). Tags added: ``generator``, ``k``, ``walk`` and ``crossover``
    (:func:`race.analysis.synthetic.crossover_class`)."""
    if generator not in DRAW:
        raise ValueError(f"unknown generator {generator!r}; choose from {', '.join(GENERATORS)}")
    k = check_k(k)
    if isinstance(walk, bool) or not isinstance(walk, (int, float, np.floating)) or not np.isfinite(walk) or walk < 0:
        raise ValueError(f"walk must be a correlation length >= 0 in ln C (0: fixed seed offsets), got {walk!r}")
    w = DRAW[generator](seed, k=k)
    w.seed_walk = float(walk)
    w.tags.update(generator=generator, k=k, walk=float(walk), crossover=crossover_class(w))
    return w


#: the budgets (fractions of the target) at which :func:`world_stats` counts the costliest allocation's steps
STEP_READINGS = (1 / 32, 1 / 8, 1 / 3, 1.0)


def world_stats(w: World) -> dict:
    """One world's line of the generators' summary: ``null``, ``late`` (its best allocation at the target is
    not the best at the flat grid's largest pilot: ``crossover_class`` "after"), ``ill`` (its ill-behaved
    allocations, :meth:`World.ill_behaved`, and ``k``), ``steps`` (the costliest allocation's optimizer
    steps at each of :data:`STEP_READINGS` x T, :meth:`World.steps_at`)."""
    k = len(w.allocations)
    costliest = max(range(k), key=lambda i: w.step_cost(w.allocations[i]))
    return {"null": bool(w.tags.get("flat")), "late": crossover_class(w) == "after", "k": k,
            "ill": sum(w.ill_behaved(i) for i in range(k)),
            "steps": [w.steps_at(costliest, w.target_budget * f) for f in STEP_READINGS]}
