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

from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pandas as pd
from scipy.special import expit
from scipy.stats import norm

from race.accounting.guard import is_budget

CURVE_FAMILIES = ("sigmoid", "power", "loglinear", "weibull", "rise_decline", "flat")
#: Pilot designs of :func:`world_tables` (see "Nested designs" below)
DESIGNS = ("flat", "nested", "nested-equal-compute", "nested-split", "flat-trajectory", "nested-dense")
DENSE_BUDGETS = 6  # budget points of ``nested-dense``: log-spaced from the smallest to the largest pilot budget


@dataclass(frozen=True)
class Curve:
    """True expected score against counted FLOPs (families in the module docstring)."""

    family: str
    r0: float
    gain: float
    c: float
    shape: float = 1.0

    def mean(self, flops: np.ndarray | float) -> np.ndarray:
        C = np.maximum(np.asarray(flops, dtype=float), 0.0)
        u = C / self.c
        if self.family == "sigmoid":
            with np.errstate(divide="ignore"):
                g = expit(self.shape * np.log(np.where(u > 0, u, 1e-300)))
        elif self.family == "power":
            g = u**self.shape
        elif self.family == "loglinear":
            g = np.log1p(u)
        elif self.family == "weibull":
            g = 1 - np.exp(-(u**self.shape))
        elif self.family == "rise_decline":
            g = u * np.exp(1 - u)
        elif self.family == "flat":
            g = np.zeros_like(u)
        else:
            raise ValueError(f"unknown curve family {self.family!r}; choose from {CURVE_FAMILIES}")
        return np.clip(self.r0 + self.gain * g, 0.01, 0.97)


_THETA: dict[float, tuple[np.ndarray, np.ndarray]] = {}


def theta_table(difficulty_sd: float) -> tuple[np.ndarray, np.ndarray]:
    """(theta grid, mu(theta) = E_d expit(theta - d)) for d ~ N(0, difficulty_sd^2), by quadrature (cached)."""
    if difficulty_sd not in _THETA:
        if len(_THETA) > 256:
            _THETA.clear()
        q = norm.ppf((np.arange(400) + 0.5) / 400) * difficulty_sd
        theta = np.linspace(-12, 12, 481)
        _THETA[difficulty_sd] = (theta, expit(theta[:, None] - q[None, :]).mean(axis=1))
    return _THETA[difficulty_sd]


@dataclass
class World:
    """A synthetic study design and its truth (module docstring)."""

    name: str
    models: dict[str, float]  # model name -> parameters
    allocations: list[dict]  # model, num_generations, curve (Curve as dict)
    budgets: list[float]
    seeds: list[int]
    target_budget: float
    n_problems: int = 500
    n_points: int = 3
    difficulty_sd: float = 1.5
    seed_sd: float = 0.05
    rho: float = 0.8
    spend: tuple[float, float] = (0.8, 1.0)
    seed: int = 0
    tags: dict = field(default_factory=dict)
    seed_walk: float = 0.0  # ln C over which a run's seed offset decorrelates along its trajectory (0: fixed)

    def curve(self, k: int) -> Curve:
        c = self.allocations[k]["curve"]
        return c if isinstance(c, Curve) else Curve(**c)

    def index(self, model: str, num_generations: int) -> int:
        for k, a in enumerate(self.allocations):
            if a["model"] == model and int(a["num_generations"]) == int(num_generations):
                return k
        raise KeyError(f"world {self.name} has no allocation {model} G={num_generations}")

    def truth(self, k: int, budget: float | None = None) -> float:
        """Population mean score of allocation k at the FLOPs counted at ``budget`` (default: target)."""
        b = self.target_budget if budget is None else budget
        return float(self.curve(k).mean(b * float(np.mean(self.spend))))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["allocations"] = [{**a, "curve": asdict(a["curve"]) if isinstance(a["curve"], Curve) else a["curve"]}
                            for a in self.allocations]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "World":
        d = dict(d)
        d["spend"] = tuple(d.get("spend", (0.8, 1.0)))
        return cls(**d)

    # -- outcomes ---------------------------------------------------------------------
    def _theta_table(self) -> tuple[np.ndarray, np.ndarray]:
        """mu(theta) = E_d expit(theta - d) over the difficulty population (quadrature)."""
        return theta_table(float(self.difficulty_sd))

    def run_outcomes(self, k: int, budget: float, seed: int) -> list[tuple[float, np.ndarray]]:
        """(counted FLOPs, per-problem 0/1 outcomes) of one run: step 0 then ``n_points`` points."""
        a = self.allocations[k]
        model_idx = sorted(self.models).index(a["model"])
        world_rng = np.random.default_rng([self.seed, 1])
        d = world_rng.normal(0.0, self.difficulty_sd, self.n_problems)  # shared by every run
        z = np.random.default_rng([self.seed, 2, model_idx]).standard_normal(self.n_problems)
        run_rng = np.random.default_rng([self.seed, 3, k, int(np.log10(budget) * 1000), seed])
        delta = run_rng.normal(0.0, self.seed_sd)
        spent = budget * run_rng.uniform(*self.spend)
        flops = [0.0] + [spent * (i + 1) / self.n_points for i in range(self.n_points)]
        theta_grid, mu_grid = self._theta_table()
        curve = self.curve(k)
        out = []
        for i, c in enumerate(flops):
            mu = float(curve.mean(c))
            theta = float(np.interp(mu, mu_grid, theta_grid)) + (delta if c > 0 else 0.0)
            p = expit(theta - d)
            if c > 0:
                eps = run_rng.standard_normal(self.n_problems)
            else:  # the base model: the same outcomes for every seed and budget of this model
                eps = np.random.default_rng([self.seed, 4, model_idx]).standard_normal(self.n_problems)
            u = norm.cdf(self.rho * z + np.sqrt(1 - self.rho**2) * eps)
            out.append((float(c), (u < p).astype(int)))
        return out

    # -- nested designs: one run per (allocation, seed) read at its prefixes ------------------
    def nested_schedule(self, k: int, seed: int) -> tuple[list[float], list[float]]:
        """(the long run's own evaluation FLOPs, where a run of each smaller budget would stop).

        The long run is at the largest budget and spends ``budget x U(spend)`` as a flat run
        does, evaluated at ``n_points`` even fractions of that; a smaller budget b_j's run
        would stop at ``b_j x U(spend)`` (one draw per budget: where its last step fits)."""
        rng = np.random.default_rng([self.seed, 5, k, seed])
        b = sorted(self.budgets)
        spent = b[-1] * rng.uniform(*self.spend)
        stops = [float(bj * rng.uniform(*self.spend)) for bj in b[:-1]]
        return [spent * (i + 1) / self.n_points for i in range(self.n_points)], stops

    def trajectory(self, k: int, seed: int, flops: list[float]) -> list[tuple[float, np.ndarray]]:
        """(counted FLOPs, per-problem 0/1 outcomes) of ONE run evaluated at ``flops`` (ascending,
        0 for the base model): one seed offset for the whole run, per-point problem noise as in
        :meth:`run_outcomes`; its own random stream, so a flat design's runs are untouched."""
        model_idx = sorted(self.models).index(self.allocations[k]["model"])
        d = np.random.default_rng([self.seed, 1]).normal(0.0, self.difficulty_sd, self.n_problems)
        z = np.random.default_rng([self.seed, 2, model_idx]).standard_normal(self.n_problems)
        run_rng = np.random.default_rng([self.seed, 6, k, seed])
        delta = self.seed_sd * self.offsets(run_rng.normal(0.0, 1.0), flops, k, seed)
        theta_grid, mu_grid = self._theta_table()
        curve = self.curve(k)
        out = []
        for c, dc in zip(flops, delta):
            theta = float(np.interp(float(curve.mean(c)), mu_grid, theta_grid)) + (dc if c > 0 else 0.0)
            eps = (run_rng.standard_normal(self.n_problems) if c > 0
                   else np.random.default_rng([self.seed, 4, model_idx]).standard_normal(self.n_problems))
            u = norm.cdf(self.rho * z + np.sqrt(1 - self.rho**2) * eps)
            out.append((float(c), (u < expit(theta - d)).astype(int)))
        return out


    def offsets(self, z0: float, flops: list[float], k: int, seed: int) -> np.ndarray:
        """A run's standardised seed offset at each of ``flops``: ``z0`` throughout when ``seed_walk`` is 0, else a
        mean-reverting random walk (Ornstein-Uhlenbeck) in ln C from ``z0`` at the first C > 0: N(0, 1) at every point,
        correlation exp(-|ln C_i - ln C_j| / seed_walk); its own random stream (fixed-offset draws are untouched)."""
        z, x = np.full(len(flops), float(z0)), np.log(np.maximum(flops, 1.0))
        rng, first = np.random.default_rng([self.seed, 8, k, seed]), int(np.argmax(np.asarray(flops) > 0))
        for i in range(first + 1, len(z) if self.seed_walk > 0 else 0):
            rho = float(np.exp(-max(x[i] - x[i - 1], 0.0) / self.seed_walk))
            z[i] = rho * z[i - 1] + np.sqrt(1 - rho**2) * rng.standard_normal()
        return z


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


def random_world(seed: int, flat: bool | None = None, families: tuple[str, ...] = CURVE_FAMILIES) -> World:
    """A world drawn at random: 2 sizes x 2 group sizes, 3 pilot budgets spanning 4-10x,
    2-3 seeds, a target 4-16x beyond the largest pilot; ``flat`` forces (or forbids) a world
    where nothing is learned. Curves of larger models start higher and learn more slowly per
    FLOP, so crossovers between budgets happen in some worlds and not in others."""
    rng = np.random.default_rng([seed, 99])
    b1 = 10 ** rng.uniform(10, 12)
    span = rng.uniform(4, 10)
    budgets = [b1, b1 * np.sqrt(span), b1 * span]
    seeds = list(range(int(rng.integers(2, 4))))
    target = budgets[-1] * rng.uniform(4, 16)
    is_flat = bool(rng.random() < 0.2) if flat is None else flat
    learning = [f for f in families if f != "flat"] or ["flat"]
    world_family = "flat" if is_flat else str(rng.choice(learning))
    models = {"small": 1e5, "large": 1e5 * rng.uniform(3, 8)}
    r0_small = rng.uniform(0.1, 0.4)
    allocs = []
    for model in ("small", "large"):
        r0 = r0_small + (rng.uniform(0.05, 0.25) if model == "large" else 0.0)
        slow = models[model] / 1e5  # per-FLOP learning slows with size
        for g in (4, 8):
            fam = world_family if (is_flat or rng.random() > 0.3) else str(rng.choice(learning))
            gain = 0.0 if fam == "flat" else rng.uniform(0.05, 0.6) * (1 - r0)
            c = b1 * 10 ** rng.uniform(-0.5, 1.5) * slow * (rng.uniform(0.7, 1.5) if g == 8 else 1.0)
            shape = {"sigmoid": rng.uniform(0.6, 2.5), "power": rng.uniform(0.15, 0.7),
                     "weibull": rng.uniform(0.4, 1.5)}.get(fam, 1.0)
            if fam == "loglinear":
                gain /= 3.0
            allocs.append({"model": model, "num_generations": g, "curve": Curve(fam, float(r0), float(gain), float(c),
                                                                                  float(shape))})
    return World(name=f"world-{seed}", models=models, allocations=allocs, budgets=[float(b) for b in budgets],
                 seeds=seeds, target_budget=float(target), n_problems=int(rng.choice([200, 500, 1000])),
                 seed_sd=float(rng.uniform(0.02, 0.12)), seed=int(seed),
                 tags={"family": world_family, "flat": is_flat, "span": float(span),
                       "target_ratio": float(target / budgets[-1])})


def run_row(world: World, a: dict, rid: str, budget: float, seed: int, total: float) -> dict:
    """One complete run's row of the runs table (``race.schema`` layout) for allocation ``a`` of ``world``."""
    from .tables import RUNS_COLUMNS

    row = {c: None for c in RUNS_COLUMNS}
    row.update(run_id=rid, study=world.name, budget=budget, model=a["model"],
               model_params=world.models[a["model"]], num_generations=a["num_generations"],
               prompts_per_step=4, num_iterations=1, learning_rate=1e-4, reward="rule", seed=seed,
               status="complete", total_flops=total, rollout_flops=0.7 * total,
               learning_flops=0.3 * total, feedback_flops=0.0, steps=10, wall_s=1.0,
               zero_var_frac=0.1, trunc_rate=0.0)
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
                pts = world.run_outcomes(k, budget, seed)
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
            pts = [(step, c, per) for step, (c, per) in enumerate(world.trajectory(k, seed, [0.0] + sorted(own + stops)))]
            edges = [0.0] + stops + [np.inf]
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


def trajectory_tables(world: World) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, evals) of a flat grid at a constant learning rate: per allocation and seed ONE
    trajectory (:meth:`World.trajectory`), of which the run at budget b_j is the part up to
    where it stops (:meth:`World.nested_schedule`: the same stops as the nested design),
    evaluated at its own ``n_points`` even fractions of that (each run its own points, as
    each run of a real flat grid evaluates on its own schedule)."""
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
                for step, c in enumerate([0.0] + pts):
                    per = traj[c][1]
                    eval_rows.append(dict(run_id=rid, step=step, flops=c, target="greedy", score=float(per.mean()),
                                          n=len(per), per_problem=per.tolist()))
                run_rows.append(run_row(world, a, rid, b, seed, pts[-1]))
    return pd.DataFrame(run_rows), pd.DataFrame(eval_rows)
