"""What every known world shares: its allocations' curves, the outcomes of its runs, its grid of K.

:class:`World` is a synthetic pilot study whose truth is known (the outcome model is in
:mod:`race.analysis.synthetic`'s docstring; :mod:`race.analysis.synthetic_rl` and
:mod:`race.analysis.synthetic_steps` subclass it), :class:`Curve` the tuning generator's
curves in counted FLOPs. The grids: every generator draws K allocations, K in :data:`KS`;
the FLOP generators draw :data:`LAYOUTS` (model sizes x group sizes), with more sizes and
group sizes than their first two drawn as those are (:func:`size_ladder`,
:func:`group_factor`). A world also says what a run's row reports about its optimizer steps
(:meth:`World.step_cost`, :meth:`World.run_steps`, :meth:`World.warmup_steps`,
:meth:`World.stop_flops`): FLOP worlds have no steps of their own, so a nominal cost per step
stands in (warmup 0); the step generator overrides these with its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.special import expit
from scipy.stats import norm

CURVE_FAMILIES = ("sigmoid", "power", "loglinear", "weibull", "rise_decline", "flat")
LEARNING_RATE = 1e-4  # the runs' learning rate where an allocation does not set one
NOMINAL_TARGET_STEPS = 1000  # steps of the costliest allocation's target run where a world has no steps (World.step_cost)
#: the numbers of allocations a generator draws
KS = (4, 12, 24)
#: K -> (model sizes, group sizes) of the FLOP generators' grids
LAYOUTS: dict[int, tuple[int, tuple[int, ...]]] = {4: (2, (4, 8)), 12: (3, (2, 4, 8, 16)), 24: (4, (2, 4, 8, 16, 32, 64))}
SIZE_NAMES: dict[int, tuple[str, ...]] = {1: ("medium",), 2: ("small", "large"), 3: ("small", "medium", "large"),
                                          4: ("small", "medium", "large", "xlarge")}
#: the group size whose curve the per-doubling factors are relative to (the FLOP generators' G = 4)
REFERENCE_G = 4


def check_k(k: int) -> int:
    """``k`` as an int when it is one of :data:`KS`, else a ValueError naming them."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) not in KS:
        raise ValueError(f"k (the number of allocations) must be one of {KS}, got {k!r}")
    return int(k)


def layout(k: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(model names, group sizes) of a FLOP generator's grid of ``k`` allocations (:data:`LAYOUTS`)."""
    n, groups = LAYOUTS[check_k(k)]
    return SIZE_NAMES[n], groups


def size_ladder(rng: np.random.Generator, names: tuple[str, ...], ratio: tuple[float, float],
                base: float = 1e5) -> dict[str, float]:
    """Parameters per model: ``base`` for the first, then each one ``U(ratio)`` times the one before."""
    params, out = float(base), {}
    for i, name in enumerate(names):
        if i:
            params *= float(rng.uniform(*ratio))
        out[name] = params
    return out


def group_factor(rng: np.random.Generator, g: int, lo: float, hi: float, ref: int = REFERENCE_G) -> float:
    """The factor group size ``g`` puts on a curve's midpoint: one ``U(lo, hi)`` draw per doubling
    above ``ref`` (multiplied) or below it (divided), 1 at ``ref``. With ``ref`` 4 and ``g`` 8 this
    is the single draw the FLOP generators made for G = 8 before K existed (same stream position)."""
    doublings = int(round(np.log2(g / ref)))
    if 2.0**doublings * ref != g:
        raise ValueError(f"group size {g} is not a power-of-two multiple of {ref}")
    f = 1.0
    for _ in range(abs(doublings)):
        d = rng.uniform(lo, hi)
        f = f * d if doublings > 0 else f / d
    return f


@dataclass(frozen=True)
class Curve:
    """True expected score against counted FLOPs (families in :mod:`race.analysis.synthetic`'s docstring)."""

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
    """A synthetic study design and its truth (:mod:`race.analysis.synthetic`'s docstring)."""

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

    def index(self, model: str, num_generations: int, learning_rate: float | None = None) -> int:
        """The allocation of ``model`` and G (and ``learning_rate``, needed where a world has a learning-rate axis)."""
        hits = [k for k, a in enumerate(self.allocations) if a["model"] == model
                and int(a["num_generations"]) == int(num_generations)
                and (learning_rate is None or np.isclose(a.get("learning_rate", LEARNING_RATE), learning_rate, rtol=1e-9))]
        if len(hits) == 1:
            return hits[0]
        what = f"{model} G={num_generations}" + ("" if learning_rate is None else f" lr={learning_rate:g}")
        if not hits:
            raise KeyError(f"world {self.name} has no allocation {what}")
        raise KeyError(f"world {self.name} has {len(hits)} allocations {what} (a learning-rate axis): pass learning_rate")

    # -- steps: what a run's row says about its optimizer steps (the step generator overrides) ---------
    def step_cost(self, a: dict) -> float:
        """Nominal FLOPs per optimizer step of allocation ``a`` (these worlds have no steps of their own):
        proportional to parameters x G, the costliest allocation taking ``NOMINAL_TARGET_STEPS`` steps in a
        target run, so no pilot reading of these worlds falls under a few steps."""
        size = [self.models[b["model"]] * int(b["num_generations"]) for b in [a, *self.allocations]]
        return float(self.target_budget * float(np.mean(self.spend)) / NOMINAL_TARGET_STEPS * size[0] / max(size))

    def max_step_cost(self, a: dict) -> float:
        """The most FLOPs one optimizer step of allocation ``a`` can cost: what a plan prices a step floor
        at, as ``race grid plan`` prices real steps at their maximal completions (an upper bound, so the
        floor holds). Here the nominal cost; the step generator adds its per-step jitter."""
        return self.step_cost(a)

    def run_steps(self, a: dict, seed: int, total: float) -> int:
        """Optimizer steps a run of allocation ``a`` and ``seed`` has taken after ``total`` counted FLOPs
        (0 for none; at least 1 once it has counted any)."""
        return 0 if total <= 0 else max(1, int(np.floor(total / self.step_cost(a) * (1 + 1e-12))))

    def warmup_steps(self, a: dict) -> int:
        """Learning-rate warmup steps of allocation ``a`` (none in the FLOP generators)."""
        return 0

    def steps_at(self, k: int, budget: float | None = None) -> int:
        """Optimizer steps a run of ``budget`` (default: the target) of allocation ``k`` takes at the nominal cost."""
        b = self.target_budget if budget is None else budget
        return self.run_steps(self.allocations[k], 0, b * float(np.mean(self.spend)))

    def ill_behaved(self, k: int) -> bool:
        """Whether allocation ``k``'s true curve is not a saturating rise (here: ``rise_decline``)."""
        return self.curve(k).family == "rise_decline"

    def stop_flops(self, k: int, seed: int, flops: float) -> float:
        """Counted FLOPs of allocation ``k``'s run of ``seed`` stopped at ``flops``: ``flops`` itself here (a
        FLOP curve has no step grid); the step generator's run stops at the end of a whole step."""
        return float(flops)

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
