"""The racing protocol on known worlds: rungs toward the target, decided by the code the grid runs.

A :class:`RaceDesign` runs a world's pilots in rungs at fractions of its target budget T
(default T/32, T/8, T/3). Rung 0 runs every allocation with ``first_seeds`` seeds (the
world's seeds by default), read at ``nested`` smaller budgets too (prefixes: for the gate
and the back-tests); each later rung continues the first ``later_seeds`` seeds' runs of the
allocations that go on. A run is ONE trajectory (:meth:`World.trajectory`, constant learning
rate), drawn once at every point it could reach, so a continued run's earlier readings are
exactly the shorter run's: rung j's stop is b_j x U(spend) (one draw per run and rung), with
``n_points`` evaluations spread evenly over each rung's segment. The pilots do not anneal:
a world's end-of-schedule bonus (``rl_world``) falls on a point at the target that no pilot
reads, and the truth at the target keeps it.

:func:`race_tables` writes what a study's store holds after a rung, as the grid writes it
(``race.grid.load_tables``): per (allocation, seed) one row at the largest budget its run
reached, and one ``prefix_of`` row per smaller budget it passed (the nested readings, the
earlier rungs). :func:`simulate_race` runs the rungs, calling
:func:`race.analysis.racing.rung_decision` after each and :func:`race.analysis.racing.race_pick`
after the last, so the benchmark tests the same decisions as a real racing study makes.

Compute: a continued run costs its final budget once (extension is resumption), so the
pilots cost the sum over runs of the largest budget each reached; the target run continues
the chosen allocation's first-seed pilot, which reuses that pilot's budget.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .synthetic import World, run_row


@dataclass(frozen=True)
class RaceDesign:
    """A racing design: rungs as fractions of the target budget, seeds per rung (module docstring)."""

    rungs: tuple[float, ...] = (1 / 32, 1 / 8, 1 / 3)
    first_seeds: int | None = None  # seeds on rung 0 (None: the world's)
    later_seeds: int = 1  # seeds continued on each later rung (the first ones)
    nested: tuple[float, ...] = (1 / 4, 1 / 2)  # rung 0 also read at these fractions of its budget
    n_points: int | None = None  # evaluations per rung segment (None: the world's n_points)

    def __post_init__(self) -> None:
        r = [float(x) for x in self.rungs]
        if not r or not all(0 < x <= 1 for x in r) or any(a >= b for a, b in zip(r, r[1:])):
            raise ValueError(f"rungs must be increasing fractions of the target budget in (0, 1], got {self.rungs!r}")
        if not all(0 < x < 1 for x in self.nested) or list(self.nested) != sorted(set(self.nested)):
            raise ValueError(f"nested must be increasing fractions of the first rung's budget in (0, 1), got {self.nested!r}")
        if self.later_seeds < 1 or (self.first_seeds is not None and self.first_seeds < self.later_seeds):
            raise ValueError(f"need 1 <= later_seeds <= first_seeds, got {self.later_seeds} and {self.first_seeds}")

    def budgets(self, world: World) -> list[float]:
        """The rungs' budgets in FLOPs."""
        return [float(world.target_budget * f) for f in self.rungs]

    def seeds(self, world: World, rung: int) -> list[int]:
        first = list(world.seeds) if self.first_seeds is None else list(range(self.first_seeds))
        return first if rung == 0 else first[: self.later_seeds]

    def as_dict(self) -> dict:
        return asdict(self)


def schedule(world: World, design: RaceDesign, k: int, seed: int) -> tuple[list[float], list[float], list[float]]:
    """(every evaluation FLOPs of the run's whole trajectory, ascending, 0 first; each rung's stop;
    each nested reading's stop) of allocation ``k``'s run of ``seed`` (module docstring)."""
    rng = np.random.default_rng([world.seed, 9, k, seed])
    n = world.n_points if design.n_points is None else int(design.n_points)
    stops = [float(b * rng.uniform(*world.spend)) for b in design.budgets(world)]
    nested = [float(stops[0] * f) for f in design.nested]
    pts, prev = [], 0.0
    for s in stops:
        pts += [prev + (s - prev) * (i + 1) / n for i in range(n)]
        prev = s
    return [0.0] + sorted(set(pts + nested)), stops, nested


def _trajectory(world: World, design: RaceDesign, k: int, seed: int) -> tuple[list, list[float], list[float]]:
    flops, stops, nested = schedule(world, design, k, seed)
    beyond = world.target_budget * float(np.mean(world.spend)) * 1.5  # takes a world's end-of-schedule bonus
    return world.trajectory(k, seed, flops + [max(beyond, flops[-1] * 2)])[:-1], stops, nested


def race_tables(world: World, design: RaceDesign, reached: dict[tuple[int, int], int],
                cache: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, evals) a racing study's store holds when run (k, seed) has reached rung
    ``reached[(k, seed)]`` (module docstring); ``cache`` keeps the drawn trajectories between calls."""
    cache = {} if cache is None else cache
    budgets = design.budgets(world)
    run_rows, eval_rows = [], []
    for (k, seed), top in sorted(reached.items()):
        if (k, seed) not in cache:
            cache[(k, seed)] = _trajectory(world, design, k, seed)
        pts, stops, nested = cache[(k, seed)]
        a = world.allocations[k]
        rid = f"{a['model']}-G{a['num_generations']}-s{seed}"
        reads = [(f"{rid}.n{i}", budgets[0] * f, stop) for i, (f, stop) in enumerate(zip(design.nested, nested))]
        reads += [(f"{rid}.r{j}", budgets[j], stops[j]) for j in range(top)]
        for run_id, budget, stop, parent in [(rid, budgets[top], stops[top], None)] + [(*r, rid) for r in reads]:
            for step, (c, per) in enumerate(pts):
                if c <= stop * (1 + 1e-12):
                    eval_rows.append(dict(run_id=run_id, step=step, flops=c, target="greedy", score=float(per.mean()),
                                          n=len(per), per_problem=per.tolist()))
            row = run_row(world, a, run_id, budget, seed, max(c for c, _ in pts if c <= stop * (1 + 1e-12)))
            row["prefix_of"] = parent
            run_rows.append(row)
    return pd.DataFrame(run_rows), pd.DataFrame(eval_rows)


def observed_leader(runs: pd.DataFrame, evals: pd.DataFrame, budget: float, target: str = "greedy") -> str:
    """The allocation with the highest seed-mean score at equal FLOPs at ``budget`` (the naive pick there)."""
    from .curves import final_scores
    from .tables import prepare_runs

    ends = final_scores(evals, prepare_runs(runs), target, at="equal")
    at = ends[np.isclose(ends["budget"].to_numpy(float), budget, rtol=1e-9, atol=0.0)]
    means = at.groupby("allocation")["score"].mean()
    return str(max(means.index, key=lambda a: (means[a], a)))


def simulate_race(world: World, design: RaceDesign, rule=None, seed: int = 0) -> dict:
    """Run ``design`` on ``world``: after each rung the allocations that go on are decided by
    :func:`race.analysis.racing.rung_decision` with ``rule`` (a ``RacingRule``; None: every
    allocation goes on and the pick is the observed leader at the last rung, no analysis).
    Returns the decisions (``RungDecision.as_dict``), the pick (a ``Recommendation``, None
    without a rule), the observed leader at the last rung, the pilot FLOPs and the part the
    target run reuses, in FLOPs and in units of T, and the allocations alive at each rung."""
    from .racing import race_pick, rung_decision
    from .tables import allocation_key

    budgets = design.budgets(world)
    alive = list(range(len(world.allocations)))
    reached = {(k, s): 0 for k in alive for s in design.seeds(world, 0)}
    cache: dict = {}
    decisions, history = [], [list(alive)]
    runs = evals = None
    for j in range(len(budgets)):
        runs, evals = race_tables(world, design, reached, cache)
        if rule is None or j == len(budgets) - 1:
            break
        d = rung_decision(runs, evals, target_budget=world.target_budget, rung_budgets=budgets, rung=j, rule=rule,
                          seed=seed)
        decisions.append(d.as_dict())
        index = dict(zip(allocation_key(runs), (world.index(m, g) for m, g in zip(runs["model"], runs["num_generations"]))))
        alive = [index[a] for a in d.go_on]
        history.append(sorted(alive))
        for k in alive:
            for s in design.seeds(world, j + 1):
                reached[(k, s)] = j + 1
    if rule is None:
        for j in range(1, len(budgets)):
            history.append(list(alive))
            for k in alive:
                for s in design.seeds(world, j):
                    reached[(k, s)] = j
        runs, evals = race_tables(world, design, reached, cache)
    pick = None
    if rule is not None:
        pick = race_pick(runs, evals, target_budget=world.target_budget, rung_budgets=budgets, rule=rule, seed=seed)
    pilot = float(sum(budgets[j] for j in reached.values()))
    return {"decisions": decisions, "pick": pick, "leader": observed_leader(runs, evals, budgets[-1]),
            "alive": history, "pilot_flops": pilot, "reused_flops": budgets[-1],
            "pilot_T": pilot / world.target_budget, "reused_T": budgets[-1] / world.target_budget,
            "runs": runs, "evals": evals}

