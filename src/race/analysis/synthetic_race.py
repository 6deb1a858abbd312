"""The racing protocol on known worlds: rungs toward the target, decided by the code the grid runs.

A :class:`RaceDesign` runs a world's pilots in rungs toward its target budget T: fixed rungs
(``rungs``, fractions of T) or, with ``rungs=None``, the schedule the racing rule sizes for
the world's allocations and cap (:meth:`race.analysis.racing.RacingRule.schedule`, the one a
racing grid runs). Rung 0 runs every allocation with ``first_seeds`` seeds (the world's seeds
by default), read at ``nested`` smaller budgets too (prefixes: for the gate and the
back-tests); each later rung continues the first ``later_seeds`` seeds' runs of the
allocations that go on. A run is ONE trajectory (:meth:`World.trajectory`, constant
learning rate), drawn once at every point it could reach, so a continued run's earlier
readings are exactly the shorter run's. A run of budget b stops at b x U(spend) (one draw per
run and rung; in a world of optimizer steps, on its last whole step: ``World.stop_flops``),
with ``n_points`` evaluations spread evenly over each rung's segment. The pilots do not anneal: a world's end-of-schedule bonus falls on a
point at the target that no pilot reads, and the truth at the target keeps it.

:func:`race_tables` writes what a study's store holds after a rung, as the grid writes it
(``race.grid.load_tables``): per (allocation, seed) one row at the largest budget its run
reached, and one ``prefix_of`` row per smaller budget it passed (the nested readings, the
earlier rungs), with ``steps`` and ``warmup_steps`` where the world has them.
:func:`simulate_race` runs the rungs, calling :func:`race.analysis.racing.rung_decision`
after each, so the benchmark tests the same decisions as a real racing study makes.

Compute: a continued run costs its final budget once (extension is resumption), so the
pilots cost the sum over runs of the largest budget each reached; the target run continues
the chosen allocation's first-seed pilot, which reuses that pilot's budget.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .synthetic import World, distinct_points, run_row


@dataclass(frozen=True)
class RaceDesign:
    """Rungs (fractions of T, or None: the rule's schedule) and seeds per rung (module docstring)."""

    rungs: tuple[float, ...] | None = (1 / 32, 1 / 8, 1 / 3)
    first_seeds: int | None = None  # seeds on rung 0 (None: the world's)
    later_seeds: int = 1  # seeds continued on each later rung (the first ones)
    nested: tuple[float, ...] = (1 / 4, 1 / 2)  # rung 0 also read at these fractions of its budget
    n_points: int | None = None  # evaluations per rung segment (None: the world's n_points)

    def __post_init__(self) -> None:
        if self.rungs is not None:
            r = [float(x) for x in self.rungs]
            if not r or not all(0 < x <= 1 for x in r) or any(a >= b for a, b in zip(r, r[1:])):
                raise ValueError(f"rungs must be increasing fractions of the target budget in (0, 1], got {self.rungs!r}")
        if not all(0 < x < 1 for x in self.nested) or list(self.nested) != sorted(set(self.nested)):
            raise ValueError(f"nested must be increasing fractions of the first rung's budget in (0, 1), got {self.nested!r}")
        if self.later_seeds < 1 or (self.first_seeds is not None and self.first_seeds < self.later_seeds):
            raise ValueError(f"need 1 <= later_seeds <= first_seeds, got {self.later_seeds} and {self.first_seeds}")

    def seed_count(self, world: World) -> int:
        return len(world.seeds) if self.first_seeds is None else int(self.first_seeds)

    def seeds(self, world: World, rung: int) -> list[int]:
        first = list(world.seeds) if self.first_seeds is None else list(range(self.first_seeds))
        return first if rung == 0 else first[: self.later_seeds]

    def schedule(self, world: World, rule=None):
        """The world's :class:`race.spec.rungs.RungSchedule` under this design and ``rule``."""
        from .racing import RacingRule

        rule = rule or RacingRule()
        names = [allocation_name(world, k) for k in range(len(world.allocations))]
        mins = min_budgets(world, rule.floor_steps)
        fixed = None if self.rungs is None else [float(world.target_budget * f) for f in self.rungs]
        return rule.schedule(names, world.target_budget, first_seeds=self.seed_count(world), rungs=fixed,
                             min_budgets=mins, least_budget=least_budget(world), strict=False)

    def budgets(self, world: World, rule=None) -> list[float]:
        """The rungs' budgets in FLOPs."""
        if self.rungs is not None:
            return [float(world.target_budget * f) for f in self.rungs]
        return list(self.schedule(world, rule).budgets)

    def as_dict(self) -> dict:
        return asdict(self)


def allocation_name(world: World, k: int) -> str:
    """The analysis's name of allocation ``k`` of ``world``: ``race.analysis.tables.allocation_key``
    of its runs' rows."""
    return allocation_names(world)[k]


def allocation_names(world: World) -> list[str]:
    """:func:`allocation_name` of every allocation (one key computation; cached on the world)."""
    from .tables import allocation_key

    cached = getattr(world, "_race_names", None)  # an instance attribute, not a field: asdict/to_dict leave it out
    if cached is None or len(cached) != len(world.allocations):
        rows = []
        for k, a in enumerate(world.allocations):
            row = run_row(world, a, "name", world.target_budget, 0, 0.0)
            row["learning_rate"] = _lr(world, k)
            rows.append(row)
        cached = [str(x) for x in allocation_key(pd.DataFrame(rows))] if rows else []
        world._race_names = cached
    return list(cached)


def _lr(world: World, k: int) -> float:
    return float(world.allocations[k].get("learning_rate", 1e-4))


def min_budgets(world: World, floor_steps: int) -> dict[str, float]:
    """Per allocation the budget that buys its warmup + ``floor_steps`` optimizer steps at their
    costliest (``World.max_step_cost``: a step world's steps vary in cost, and a floor priced at the
    nominal cost can buy one step short, leaving the allocation unmeasured, kept by the floor beyond
    the schedule's keep counts and over the cap) even when a run spends only the least share of its
    budget (``spend``); the plan prices real steps the same way, at their maximal completions."""
    names = allocation_names(world)
    return {names[k]: float((world.warmup_steps(a) + floor_steps) * world.max_step_cost(a) / world.spend[0]
                            * (1 + 1e-9))
            for k, a in enumerate(world.allocations)}


def least_budget(world: World) -> float:
    """One step of the costliest allocation."""
    return float(max(world.step_cost(a) for a in world.allocations)) if world.allocations else 0.0


def schedule(world: World, budgets: list[float], k: int, seed: int, nested: tuple[float, ...], n_points: int | None,
             ) -> tuple[list[float], list[float], list[float]]:
    """(every evaluation FLOPs of the run's whole trajectory, ascending, 0 first; each rung's stop;
    each nested reading's stop) of allocation ``k``'s run of ``seed``: a run of budget b stops at
    b x U(spend) (one draw per run and rung; a step world's spend is 1 and its run ends on the
    last whole step, ``World.stop_flops``)."""
    rng = np.random.default_rng([world.seed, 9, k, seed])
    n = world.n_points if n_points is None else int(n_points)
    stops = [float(b * rng.uniform(*world.spend)) for b in budgets]
    nested_stops = [float(stops[0] * f) for f in nested]
    pts, prev = [], 0.0
    for s in stops:
        pts += [prev + (s - prev) * (i + 1) / n for i in range(n)]
        prev = s
    return [0.0] + sorted(set(pts + nested_stops)), stops, nested_stops


def _trajectory(world: World, budgets: list[float], design: RaceDesign, k: int, seed: int):
    flops, stops, nested = schedule(world, budgets, k, seed, design.nested, design.n_points)
    beyond = world.target_budget * float(np.mean(world.spend)) * 1.5  # takes a world's end-of-schedule bonus
    # readings that fall on one optimizer step are one evaluation of one checkpoint (a step world)
    return distinct_points(world.trajectory(k, seed, flops + [max(beyond, flops[-1] * 2)])[:-1]), stops, nested


def race_tables(world: World, design: RaceDesign, reached: dict[tuple[int, int], int], cache: dict | None = None,
                budgets: "list[float] | dict[int, list[float]] | None" = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, evals) a racing study's store holds when run (k, seed) has reached rung
    ``reached[(k, seed)]`` of ``budgets`` (one list for every allocation, or per allocation:
    ``RungSchedule.ladder``, where a floor may repeat a budget) (module docstring); ``cache``
    keeps the drawn trajectories between calls."""
    cache = {} if cache is None else cache
    budgets = design.budgets(world) if budgets is None else budgets
    run_rows, eval_rows = [], []
    for (k, seed), top in sorted(reached.items()):
        ladder = list(budgets[k] if isinstance(budgets, dict) else budgets)
        uniq = sorted(set(ladder))
        key = (k, seed, tuple(uniq))
        if key not in cache:
            cache[key] = _trajectory(world, uniq, design, k, seed)
        pts, stops, nested = cache[key]
        a = world.allocations[k]
        rid = f"{a['model']}-G{a['num_generations']}-lr{_lr(world, k):g}-s{seed}"
        i_top = uniq.index(ladder[top])
        reads = [(f"{rid}.n{i}", uniq[0] * f, st) for i, (f, st) in enumerate(zip(design.nested, nested))]
        reads += [(f"{rid}.r{j}", uniq[j], stops[j]) for j in range(i_top)]
        for run_id, budget, stop, parent in [(rid, uniq[i_top], stops[i_top], None)] + [(*r, rid) for r in reads]:
            cut = world.stop_flops(k, seed, stop) * (1 + 1e-12)  # a step world's run ends on a whole step
            read = [(i, c, per) for i, (c, per) in enumerate(pts) if c <= cut]
            for step, c, per in read:
                eval_rows.append(dict(run_id=run_id, step=step, flops=c, target="greedy", score=float(per.mean()),
                                      n=len(per), per_problem=per.tolist()))
            row = run_row(world, a, run_id, budget, seed, read[-1][1])
            row["prefix_of"] = parent
            run_rows.append(row)
    return pd.DataFrame(run_rows), pd.DataFrame(eval_rows)


def observed_leader(runs: pd.DataFrame, evals: pd.DataFrame, budget: float, target: str = "greedy",
                    among: "set[str] | None" = None) -> str:
    """The allocation with the highest seed-mean score at equal FLOPs at ``budget`` (the naive pick there)."""
    from .curves import final_scores
    from .tables import prepare_runs

    ends = final_scores(evals, prepare_runs(runs), target, at="equal")
    at = ends[np.isclose(ends["budget"].to_numpy(float), budget, rtol=1e-9, atol=0.0)]
    means = at.groupby("allocation")["score"].mean()
    if among is not None:
        means = means[means.index.isin(among)]
    return str(min(means.index, key=lambda a: (-means[a], a)))


@dataclass
class WorldSource:
    """A known world as a source of complete trajectories (``race.analysis.designs.Source``)."""

    world: World
    nested: tuple[float, ...] = (1 / 4, 1 / 2)
    n_points: int | None = None

    def __post_init__(self) -> None:
        self.target_budget = float(self.world.target_budget)
        self.names = allocation_names(self.world)
        self.seeds = list(self.world.seeds)
        self.target = "greedy"
        self._cache: dict = {}

    def tables(self, reached: dict[tuple[int, int], int], budgets: "list[float] | dict[int, list[float]]",
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
        design = RaceDesign(rungs=None, first_seeds=None, nested=self.nested, n_points=self.n_points)
        return race_tables(self.world, design, reached, self._cache, budgets)

    def snap(self, budgets: list[float]) -> list[float]:
        return list(budgets)

    def snap_up(self, budget: float) -> float:
        return float(budget)

    def min_budgets(self, floor_steps: int) -> dict[str, float]:
        return min_budgets(self.world, floor_steps)

    def least_budget(self) -> float:
        return least_budget(self.world)

    def flat(self) -> tuple[pd.DataFrame, pd.DataFrame, list[float]]:
        from .synthetic import world_tables

        runs, evals = world_tables(self.world, "flat-trajectory")
        return runs, evals, list(self.world.budgets)


def simulate_race(world: World, design: RaceDesign, rule=None, seed: int = 0, forecast: bool | None = None) -> dict:
    """Run ``design`` on ``world``: after each rung the allocations that go on are decided by
    :func:`race.analysis.racing.rung_decision` with ``rule`` (a ``RacingRule``, through
    ``race.analysis.designs.race``; None: every allocation goes on and the pick is the observed
    leader at the last rung, no analysis). ``forecast``: forecast at every rung too (True), at
    the last rung only (None, the default: the pick's interval and odds), or where the rule
    needs it (False; the decisions never change). Returns the decisions
    (``RungDecision.as_dict``), the pick's name (``pick_name``) and its ``Recommendation``
    (``pick``, None without a forecast), the observed leader at the last rung, the schedule,
    the pilot FLOPs and the part the target run reuses, in FLOPs and in units of T, and the
    allocations alive at each rung."""
    from .designs import race
    from .racing import RacingRule

    src = WorldSource(world, design.nested, design.n_points)
    T = world.target_budget
    fixed = None if design.rungs is None else [float(T * f) for f in design.rungs]
    first = design.seed_count(world)
    if rule is not None:
        out = race(src, rule, first, fixed, seed=seed, forecast=forecast)
        budgets = out.schedule["budgets"]
        alive_hist = [[src.names.index(a) for a in _alive(d)] for d in out.decisions]
        history = [list(range(len(src.names)))] + [sorted(h) for h in alive_hist[:-1]]
        decisions, pick, pick_name = out.decisions, out.recommendation, out.pick
        pilot = out.pilot * T
    else:
        budgets = fixed if fixed is not None else list(design.schedule(world, RacingRule()).budgets)
        history = [list(range(len(src.names)))] * len(budgets)
        decisions, pick, pick_name = [], None, None
    reached = _reached(src, design, world, budgets, history)
    if rule is None:
        pilot = float(sum(budgets[j] for j in reached.values()))
    runs, evals = src.tables(reached, budgets if rule is None else {k: _ladder(out, a, budgets)
                                                                     for k, a in enumerate(src.names)})
    leader = observed_leader(runs, evals, budgets[-1])
    return {"decisions": decisions, "pick": pick, "pick_name": pick_name or leader, "leader": leader,
            "alive": history, "pilot_flops": pilot, "reused_flops": budgets[-1],
            "pilot_T": pilot / T, "reused_T": budgets[-1] / T, "runs": runs, "evals": evals}


def _ladder(out, name: str, budgets: list[float]) -> list[float]:
    mins = out.schedule.get("min_budgets", {})
    return [min(max(b, mins.get(name, 0.0)), budgets[-1]) for b in budgets]


def _alive(decision: dict) -> list[str]:
    return list(decision["go_on"])


def _reached(src: WorldSource, design: RaceDesign, world: World, budgets: list[float],
             history: list[list[int]]) -> dict[tuple[int, int], int]:
    reached = {(k, s): 0 for k in range(len(src.names)) for s in design.seeds(world, 0)}
    for j in range(1, len(budgets)):
        for k in history[j] if j < len(history) else []:
            for s in design.seeds(world, j):
                reached[(k, s)] = j
    return reached
