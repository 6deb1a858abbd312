"""A third generator of known worlds, built differently: curves in OPTIMIZER STEPS.

The tuning (:mod:`race.analysis.synthetic`) and test (:mod:`race.analysis.synthetic_rl`)
generators draw curves in counted FLOPs, so any budget, however small, buys some progress, and a
run's seed offset is one number (or, with ``seed_walk``, a wander in ln C). Real runs take whole
optimizer steps, each at a cost that grows with the model and the group. Here
(:func:`step_world`, docs/analysis.md section 11):

- **grids** (:data:`STEP_LAYOUTS`): K = 4 is 2 sizes x G {4, 8}; K = 12 3 sizes x G {2, 4, 8, 16};
  K = 24 4 sizes x G {2, ..., 64}; in 30% of the worlds a learning-rate axis takes the place of
  some of those (K = 4: 1 size x G {4, 8} x 2 rates; 12: 3 x 2 x 2 or 2 x 2 x 3; 24: 3 x 4 x 2 or
  2 x 4 x 3; rates 1e-4 / 3e-4, 3e-4 / 1e-3 or all three). The smallest model has 10^U(7.5, 8.5)
  parameters, each next one U(2, 6) (2 sizes) or U(1.5, 3) times more;
- **steps and their cost**: a step of allocation k costs c_k = 8 N P G L FLOPs (N parameters, P = 4
  prompts, G completions of L = U(128, 768) tokens: rollout 2 N and update 6 N per token); step i of
  a run costs c_k (1 + U(-0.05, 0.05)) (:data:`COST_JITTER`). A run of budget b takes the whole steps
  that fit, at least one (:meth:`StepWorld.counted`): its counted FLOPs are its steps x c_k within
  5%, and a budget below one step buys that one step, counted in full;
- **warmup**: a linear learning-rate warmup of w_k steps (0-20, one per world, drawn anew for 30%
  of the allocations); progress accrues as the rate does (:func:`effective_steps`):
  e(n) = n (n + 1) / (2 w) full-rate steps for n <= w, n - (w - 1) / 2 after, so a small budget
  spends a large model's few steps inside its warmup;
- **curves** mu_k(n) = r0 + gain g(e(n) / tau_k), g one of ``sigmoid``, ``weibull``, ``logsat``,
  ``power`` (:func:`race.analysis.synthetic_rl.shape_value`; the world's shape for 70% of its
  allocations). Larger models start higher (r0 U(0.1, 0.4) for the smallest, + U(0.03, 0.2) or
  U(0.02, 0.12) a size) and gain up to 1.3x more of the headroom (gain U(0.1, 0.8) x (0.95 - r0));
  tau_k in steps is the smallest allocation's (its midpoint 10^U(-2.5, -0.3) T in FLOPs) times
  (N / N_0)^-beta (beta U(-0.2, 0.4)), (G / G_0)^-gamma (gamma U(0.2, 0.8)), (lr / lr_0)^-a
  (a U(0.5, 1)) and 10^U(-0.3, 0.3): per FLOP larger models and groups learn more slowly, a
  higher rate learns faster per step and plateaus lower (gain x (1 - cut)^j for the j-th rate
  above the lowest, cut U(0.03, 0.15)): it leads early and a lower rate may win at T;
- **ill-behaved curves** (:data:`ILL_KINDS`): each allocation of a learning world is ill-behaved
  with probability :data:`ILL_RATE` = 0.15 (about the share of real learning curves LCDB 1.1
  finds non-monotone or crossing), of a kind drawn evenly from: ``late_riser`` (0-10% of its
  gain until an onset at 10^U(-1.7, -0.4) of its target steps n_T,k = T / c_k, then the rise);
  ``decline`` (over-optimisation: 0.015-0.05 lost per e-fold of steps past a peak at
  10^U(-1.5, 0) n_T,k); ``collapse`` (from a step at 10^U(-1.5, 0.3) n_T,k on, a floor of
  U(0.5, 1) r0, never recovered); and, for the highest rate of a learning-rate axis only,
  ``lr_decline`` (the high rate peaks early, at 10^U(-2, -0.8) n_T,k, and loses 0.02-0.06 per
  e-fold: a lower rate is the late bloomer);
- **seed effects that drift**: a run's mean is mu_k(n) + seed_sd z0 + drift W(n / n_T,k): a
  fixed offset plus a random walk over its steps (Brownian in units of its allocation's target
  steps, SD ``drift`` at n_T,k). seed_sd U(0.3, 4) points and drift U(0.3, 2) seed_sd per world.
  ``seed_walk`` > 0 (``make_world(.., walk=L)``) lets z0 wander in ln C as well
  (:meth:`World.offsets`), on top of the drift;
- **run collapses**: in a third of the worlds each run collapses with probability 4%, from a
  step at 10^U(-2, 0.2) n_T,k on (its mean falls half way to 0.8 r0): accidents, not the truth;
- **null worlds** (:data:`NULL_RATE` = 15%): nothing is learned (gain 0), seeds still drift;
- **target and pilots**: T buys the costliest allocation's target run 20-400 steps
  (log-uniform); the flat grid's 3 pilot budgets span 4-10x, the largest 4-16x below T
  (``spend`` is 1: a run stops where its last whole step fits); 2-3 seeds; 200-1,000 shared
  problems (difficulty SD 1-2) and :mod:`race.analysis.synthetic`'s copula.

Crossovers are not drawn for (as ``rl_world`` draws them by rejection): they arise, and
:func:`race.analysis.synthetic.crossover_class` tags each world, so the base rate of ill-behaved
allocations is exactly binomial. The truth of an allocation at a budget is its mean after the
steps a run of that budget takes at the nominal cost, max(1, floor(b / c_k)): run collapses
excluded, the allocation's own collapse included.

Runs tables: a reading is taken at the end of the last whole step (its FLOPs are the run's own
count), and a checkpoint read twice gives the same outcomes (greedy decoding of one set of
weights); ``steps`` and ``warmup_steps`` are the run's. ``learning_rate`` is the allocation's
rate; in worlds with a learning-rate axis the ``model`` column names the cell
(``medium-lr0.0003``: the racing harness keys runs and allocations by model and G) and
``base_model`` the weights (one base model, the same step-0 outcomes, for every rate).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.special import expit
from scipy.stats import norm

from .synthetic import crossover_class
from .synthetic_base import SIZE_NAMES, World, check_k, size_ladder
from .synthetic_rl import SHAPES, shape_value

ILL_KINDS = ("late_riser", "decline", "collapse", "lr_decline")
ILL_RATE = 0.15  # ill-behaved allocations in a learning world (each independently)
NULL_RATE = 0.15
LR_AXIS_RATE = 0.3
#: K -> grids (sizes, group sizes, learning rates): the first has no learning-rate axis, the others have one
STEP_LAYOUTS = {4: ((2, 2, 1), (1, 2, 2)), 12: ((3, 4, 1), (3, 2, 2), (2, 2, 3)), 24: ((4, 6, 1), (3, 4, 2), (2, 4, 3))}
GROUPS = {1: (8,), 2: (4, 8), 4: (2, 4, 8, 16), 6: (2, 4, 8, 16, 32, 64)}
LEARNING_RATES = {1: ((1e-4,),), 2: ((1e-4, 3e-4), (3e-4, 1e-3)), 3: ((1e-4, 3e-4, 1e-3),)}
PROMPTS_PER_STEP = 4
COST_JITTER = 0.05  # step i costs c_k (1 + COST_JITTER U(-1, 1))
BLOCK = 4096  # a run's step costs are drawn in blocks of this many steps (any prefix is the same)


def effective_steps(n: np.ndarray | float, warmup: float) -> np.ndarray:
    """Full-rate steps of progress after ``n`` optimizer steps under a linear warmup of ``warmup``
    steps: step i (1-based) runs at min(1, i / w) of the rate, so n (n + 1) / (2 w) for n <= w and
    (w + 1) / 2 + (n - w) after; n itself without warmup."""
    n = np.maximum(np.asarray(n, dtype=float), 0.0)
    if warmup <= 0:
        return n
    w = float(warmup)
    return np.where(n <= w, n * (n + 1) / (2 * w), (w + 1) / 2 + (n - w))


def step_mean(spec: dict, steps: np.ndarray | float) -> np.ndarray:
    """Population mean score of allocation ``spec`` after ``steps`` optimizer steps (module docstring)."""
    n = np.maximum(np.asarray(steps, dtype=float), 0.0)
    e = effective_steps(n, spec["warmup"])
    if spec["kind"] == "late_riser":
        rise = shape_value(spec["shape"], np.maximum(e - spec["onset"], 0.0) / spec["tau"], spec["s"])
        g = spec["early"] * np.minimum(1.0, e / spec["onset"]) + (1 - spec["early"]) * rise
    else:
        g = shape_value(spec["shape"], e / spec["tau"], spec["s"])
    mu = spec["r0"] + spec["gain"] * g
    if spec["kind"] in ("decline", "lr_decline"):
        with np.errstate(divide="ignore"):
            mu = mu - spec["drop"] * np.maximum(0.0, np.log(np.where(e > 0, e, 1e-300) / spec["peak"]))
    if spec["kind"] == "collapse":
        mu = np.where(n >= spec["collapse_at"], spec["floor"], mu)
    return np.clip(mu, 0.01, 0.97)


@dataclass
class StepWorld(World):
    """A :class:`World` whose allocations carry ``spec`` dicts for :func:`step_mean`, a ``learning_rate`` and the
    ``base_model`` whose weights they train (``model`` is the cell's name: module docstring)."""

    generator: str = "steps"
    collapse_p: float = 0.0  # probability that one run collapses (an accident: not in the truth)
    drift: float = 0.0  # SD of a run's seed-effect drift over its allocation's target steps (score points)
    _ends: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # block ends per (k, seed)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("_ends")
        return d

    def spec(self, k: int) -> dict:
        return self.allocations[k]["spec"]

    def steps_at(self, k: int, budget: float | None = None) -> int:
        """Steps a run of ``budget`` (default: the target) takes at the nominal cost: max(1, floor(b / c_k))."""
        b = self.target_budget if budget is None else budget
        return max(1, int(np.floor(b / self.spec(k)["cost"] * (1 + 1e-12))))

    def truth(self, k: int, budget: float | None = None) -> float:
        return float(step_mean(self.spec(k), self.steps_at(k, budget)))

    def ill_behaved(self, k: int) -> bool:
        return self.spec(k)["kind"] in ILL_KINDS

    # -- steps of a run --------------------------------------------------------------------
    def step_cost(self, a: dict) -> float:
        return float(a["spec"]["cost"])

    def max_step_cost(self, a: dict) -> float:
        return float(a["spec"]["cost"]) * (1 + COST_JITTER)

    def warmup_steps(self, a: dict) -> int:
        return int(a["spec"]["warmup"])

    def _block(self, k: int, seed: int, b: int) -> np.ndarray:
        """Cumulative FLOPs of steps b BLOCK + 1 .. (b + 1) BLOCK of allocation ``k``'s run of ``seed``, from 0."""
        u = np.random.default_rng([self.seed, 11, k, seed, b]).uniform(-1.0, 1.0, BLOCK)
        return np.cumsum(self.spec(k)["cost"] * (1 + COST_JITTER * u))

    def counted(self, k: int, seed: int, flops: float) -> tuple[int, float]:
        """(optimizer steps, counted FLOPs) of allocation ``k``'s run of ``seed`` stopped at ``flops``: the
        whole steps that fit, at least one once ``flops`` > 0 (then its counted FLOPs exceed ``flops``)."""
        if flops <= 0:
            return 0, 0.0
        f = float(flops) * (1 + 1e-12)
        ends = self._ends.setdefault((k, seed), [])
        while not ends or ends[-1] <= f:
            ends.append((ends[-1] if ends else 0.0) + self._block(k, seed, len(ends))[-1])
        b = int(np.searchsorted(ends, f, side="right"))
        start = ends[b - 1] if b else 0.0
        cum = start + self._block(k, seed, b)
        i = int(np.searchsorted(cum, f, side="right"))
        if b == 0 and i == 0:
            return 1, float(cum[0])
        return b * BLOCK + i, float(cum[i - 1]) if i else float(start)

    def run_steps(self, a: dict, seed: int, total: float) -> int:
        return self.counted(self.index(a["model"], a["num_generations"], a["learning_rate"]), seed, total)[0]

    def stop_flops(self, k: int, seed: int, flops: float) -> float:
        return self.counted(k, seed, flops)[1]

    # -- outcomes ----------------------------------------------------------------------------
    def _means(self, k: int, seed: int, flops: list[float], rr: np.random.Generator) -> list[tuple[int, float, float]]:
        """(steps, counted FLOPs, mean score) of one run stopped at each of ``flops`` (ascending): the curve at
        its steps, plus its seed effect (offset z0 and the drift, a random walk over its steps) and its
        collapse, drawn from ``rr`` (module docstring)."""
        spec = self.spec(k)
        n_target = self.target_budget / spec["cost"]
        z0, collapses, at = rr.standard_normal(), rr.random() < self.collapse_p, rr.uniform(-2.0, 0.2)
        collapse_at = max(1.0, n_target * 10**at) if collapses else np.inf
        read = [self.counted(k, seed, c) for c in flops]
        offsets = self.seed_sd * self.offsets(z0, [c for _, c in read], k, seed)
        out, walk, prev = [], 0.0, 0
        for (n, c), off in zip(read, offsets):
            mu = spec["r0"]  # the base model at step 0
            if n > 0:
                walk += np.sqrt(max(n - prev, 0) / n_target) * rr.standard_normal()
                prev = max(prev, n)
                mu = float(step_mean(spec, n)) + off + self.drift * walk
                mu = 0.5 * mu + 0.4 * spec["r0"] if n >= collapse_at else mu
            out.append((n, c, float(mu)))
        return out

    def run_means(self, k: int, seed: int, flops: list[float]) -> list[tuple[int, float, float]]:
        """(steps, counted FLOPs, mean score) of allocation ``k``'s trajectory of ``seed`` (:meth:`trajectory`)
        stopped at each of ``flops``: the population means its outcomes are drawn from."""
        return self._means(k, seed, flops, np.random.default_rng([self.seed, 6, k, seed]))

    def _read(self, k: int, seed: int, flops: list[float], rr: np.random.Generator,
              stream: int) -> list[tuple[float, np.ndarray]]:
        """(counted FLOPs, per-problem 0/1 outcomes) of one run read where it stops at each of ``flops``:
        its means (:meth:`_means`, from ``rr``) through the copula, its problem noise per step (``stream``)."""
        bases = sorted({a["base_model"] for a in self.allocations})
        model_idx = bases.index(self.allocations[k]["base_model"])  # the weights: one base model for every rate
        d = np.random.default_rng([self.seed, 1]).normal(0.0, self.difficulty_sd, self.n_problems)
        z = np.random.default_rng([self.seed, 2, model_idx]).standard_normal(self.n_problems)
        theta_grid, mu_grid = self._theta_table()
        out = []
        for n, c, mu in self._means(k, seed, flops, rr):
            eps = (np.random.default_rng([self.seed, 12, k, seed, stream, n]).standard_normal(self.n_problems) if n > 0
                   else np.random.default_rng([self.seed, 4, model_idx]).standard_normal(self.n_problems))
            theta = float(np.interp(np.clip(mu, 0.005, 0.985), mu_grid, theta_grid))
            u = norm.cdf(self.rho * z + np.sqrt(1 - self.rho**2) * eps)
            out.append((float(c), (u < expit(theta - d)).astype(int)))
        return out

    def trajectory(self, k: int, seed: int, flops: list[float]) -> list[tuple[float, np.ndarray]]:
        """(counted FLOPs, per-problem 0/1 outcomes) of ONE run read at ``flops`` (ascending, 0 first): each
        reading at the end of the last whole step that fits (at least the first), so the FLOPs returned are
        the run's own count, and readings of one step are one checkpoint's (the same outcomes)."""
        return self._read(k, seed, flops, np.random.default_rng([self.seed, 6, k, seed]), 0)

    def run_outcomes(self, k: int, budget: float, seed: int) -> list[tuple[float, np.ndarray]]:
        """(counted FLOPs, per-problem 0/1 outcomes) of an independent run of ``budget``: step 0 then
        ``n_points`` readings at even fractions of the budget (the step costs as the seed's trajectory)."""
        key = int(np.log10(budget) * 1000)
        rr = np.random.default_rng([self.seed, 3, k, key, seed])
        return self._read(k, seed, [0.0] + [budget * (i + 1) / self.n_points for i in range(self.n_points)], rr,
                          1 + key)


def _kind(rng: np.random.Generator, n_target: float, top_rate: bool) -> dict:
    """An ill-behaved kind and its parameters (module docstring); ``top_rate``: the highest rate of an axis."""
    kinds = ILL_KINDS if top_rate else ILL_KINDS[:3]
    kind = str(kinds[int(rng.integers(len(kinds)))])
    if kind == "late_riser":
        return {"kind": kind, "onset": float(n_target * 10 ** rng.uniform(-1.7, -0.4)), "early": float(rng.uniform(0, 0.1))}
    if kind == "decline":
        return {"kind": kind, "peak": float(n_target * 10 ** rng.uniform(-1.5, 0.0)), "drop": float(rng.uniform(0.015, 0.05))}
    if kind == "lr_decline":
        return {"kind": kind, "peak": float(n_target * 10 ** rng.uniform(-2.0, -0.8)), "drop": float(rng.uniform(0.02, 0.06))}
    return {"kind": kind, "collapse_at": float(max(1, round(n_target * 10 ** rng.uniform(-1.5, 0.3)))),
            "floor": float(rng.uniform(0.5, 1.0))}  # floor as a share of r0 until the caller scales it


def _grid(rng: np.random.Generator, k: int) -> tuple[dict[str, float], tuple[int, ...], tuple[float, ...]]:
    """(parameters per model, group sizes, learning rates) of a world of ``k`` allocations."""
    layouts = STEP_LAYOUTS[k]
    sizes, n_groups, n_rates = layouts[0] if rng.random() >= LR_AXIS_RATE else layouts[1 + int(rng.integers(len(layouts) - 1))]
    params = size_ladder(rng, SIZE_NAMES[sizes], (2.0, 6.0) if sizes == 2 else (1.5, 3.0), base=10 ** rng.uniform(7.5, 8.5))
    rates = LEARNING_RATES[n_rates]
    return params, GROUPS[n_groups], rates[int(rng.integers(len(rates)))]


def _allocations(rng: np.random.Generator, params: dict[str, float], groups: tuple[int, ...], rates: tuple[float, ...],
                 cost: dict, target: float, null: bool) -> list[dict]:
    """Every allocation's spec: the world's curve parameters, then per allocation (module docstring)."""
    names = list(params)
    shape_world, x0 = str(rng.choice(SHAPES)), rng.uniform(-2.5, -0.3)
    beta, gamma, lr_speed, lr_cut = rng.uniform(-0.2, 0.4), rng.uniform(0.2, 0.8), rng.uniform(0.5, 1.0), rng.uniform(0.03, 0.15)
    warmup_world = int(rng.integers(0, 21))
    c_ref = cost[(names[0], groups[0])]
    r0, allocs = rng.uniform(0.1, 0.4), []
    for i, m in enumerate(names):
        r0 += 0.0 if i == 0 else (rng.uniform(0.03, 0.2) if len(names) == 2 else rng.uniform(0.02, 0.12))
        for g in groups:
            for j, lr in enumerate(rates):
                shape = shape_world if rng.random() > 0.3 else str(rng.choice(SHAPES))
                head = 0.95 - r0
                gain = rng.uniform(0.1, 0.8) * head * (1 + 0.3 * i / max(1, len(names) - 1)) * (1 - lr_cut) ** j
                tau = (target * 10**x0 / c_ref * (params[m] / params[names[0]]) ** -beta * (g / groups[0]) ** -gamma
                       * (lr / rates[0]) ** -lr_speed * 10 ** rng.uniform(-0.3, 0.3))
                spec = {"shape": shape, "s": float({"sigmoid": rng.uniform(0.6, 2.5), "weibull": rng.uniform(0.4, 1.5),
                                                    "power": rng.uniform(0.15, 0.7)}.get(shape, 1.0)),
                        "r0": float(r0), "gain": 0.0 if null else float(min(gain, head)), "tau": float(tau),
                        "warmup": warmup_world if rng.random() > 0.3 else int(rng.integers(0, 21)),
                        "cost": float(cost[(m, g)]), "kind": "flat" if null else "regular"}
                if rng.random() < ILL_RATE and not null:
                    spec.update(_kind(rng, target / cost[(m, g)], len(rates) > 1 and j == len(rates) - 1))
                    if spec["kind"] == "collapse":
                        spec["floor"] *= spec["r0"]
                label = m if len(rates) == 1 else f"{m}-lr{lr:g}"  # module docstring: the model column names the cell
                allocs.append({"model": label, "base_model": m, "num_generations": g, "learning_rate": lr, "spec": spec})
    return allocs


def step_world(seed: int, k: int = 4, null: bool | None = None) -> StepWorld:
    """A world of the step generator drawn at random (module docstring): ``k`` allocations (4, 12 or 24:
    :data:`STEP_LAYOUTS`); ``null`` forces (or forbids) a world where nothing is learned."""
    k = check_k(k)
    rng = np.random.default_rng([seed, 4711, k])
    is_null = bool(rng.random() < NULL_RATE) if null is None else bool(null)
    params, groups, rates = _grid(rng, k)
    tokens = rng.uniform(128, 768)
    cost = {(m, g): 8 * n * PROMPTS_PER_STEP * g * tokens for m, n in params.items() for g in groups}
    target = 10 ** rng.uniform(np.log10(20), np.log10(400)) * max(cost.values())
    b3, span = target / rng.uniform(4, 16), rng.uniform(4, 10)
    budgets = [b3 / span, b3 / np.sqrt(span), b3]
    allocs = _allocations(rng, params, groups, rates, cost, target, is_null)
    seed_sd = rng.uniform(0.003, 0.04)
    models = {a["model"]: params[a["base_model"]] for a in allocs}
    w = StepWorld(name=f"stepworld-{seed}" + ("" if k == 4 else f"-k{k}"), models=models, allocations=allocs,
                  budgets=[float(b) for b in budgets], seeds=list(range(int(rng.integers(2, 4)))),
                  target_budget=float(target), n_problems=int(rng.integers(200, 1001)), seed_sd=float(seed_sd),
                  difficulty_sd=float(rng.uniform(1.0, 2.0)), spend=(1.0, 1.0), seed=int(seed),
                  drift=float(seed_sd * rng.uniform(0.3, 2.0)), collapse_p=0.04 if rng.random() < 1 / 3 else 0.0)
    kinds = [a["spec"]["kind"] for a in allocs]
    w.tags = {"flat": is_null, "family": "null" if is_null else str(max(SHAPES, key=[a["spec"]["shape"] for a in allocs].count)),
              "shapes": [] if is_null else sorted({a["spec"]["shape"] for a in allocs}),
              "kinds": sorted(set(kinds) & set(ILL_KINDS)), "ill": sum(x in ILL_KINDS for x in kinds),
              "lr_axis": len(rates) > 1, "layout": f"{len(params)}x{len(groups)}x{len(rates)}",
              "warmup": max(a["spec"]["warmup"] for a in allocs), "target_steps": min(w.steps_at(i) for i in range(len(allocs))),
              "seed_sd_points": 100 * w.seed_sd, "drift_points": 100 * w.drift, "collapses": w.collapse_p > 0,
              "span": float(span), "target_ratio": float(target / b3), "crossover": crossover_class(w)}
    return w
