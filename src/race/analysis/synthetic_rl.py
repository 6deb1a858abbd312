"""A second, independent generator of known worlds: what real RL curves show and the fitter does not assume.

:mod:`race.analysis.synthetic` is the TUNING generator (its seeds set the rules). This one
is the TEST generator: nothing in RACE was tuned on it. Its worlds have 2 model sizes x 2
group sizes (4 allocations; ``k`` 12 and 24 draw 3 sizes x G 2-16 and 4 sizes x G 2-64), 3
pilot budgets spanning 4-10x, 2-3 seeds, a target 4-16x beyond the largest pilot, 200-1,000
evaluation problems shared by every run, and:

- **format jump**: the first update moves the score by ``jump`` (0-0.12) at once, so the
  step-0 point lies off the smooth curve the later points follow;
- **curve shapes**: mu(C) = r0 + jump [C > 0] + gain g(C / c) - decline(C) with g one of
  ``sigmoid`` expit(s ln u), ``weibull`` 1 - exp(-u^s), ``logsat`` min(1, ln(1 + u) / L),
  ``power`` min(1, u^s) (u = C / c);
- **rise-then-decline**: decline(C) = d max(0, ln(C / c_dec)) with c_dec drawn from half
  the smallest pilot to the target (it starts before, within or after the pilots);
- **end-of-schedule bonus**: a run's LAST evaluation (its learning rate has annealed) is
  ``bonus`` (0-0.03) above the curve; earlier points of the same run are not. The truth at
  the target (the end of a target run) includes it;
- **seed spread growing with compute**: a run's offset is z_run sd(C) score points with
  sd(C) = sd_max (C / C_max_pilot)^growth, sd_max 0.5-6 points, growth 0-0.5, plus a
  per-point wiggle of sd(C) / 3;
- **collapses**: in a third of the worlds each run collapses with probability 4%: from a
  random evaluation on, its mean falls half way back to below its step-0 score;
- **crossovers**: each learning world is drawn for one crossover class (``within`` the
  pilots, ``after`` the last pilot and before the target, ``beyond`` the target, ``none``)
  by rejection, and the class is re-derived from the truth (:func:`crossover_class`);
- **null worlds** (15%): nothing is learned (no jump, no gain, no bonus), seeds still vary.

Per-problem outcomes: problem j has difficulty d_j (shared by every run); a point with mean
m solves j with probability expit(theta(m) - d_j) (theta makes the population mean m),
correlated across a model's evaluations by a Gaussian copula (``rho``). The truth of an
allocation is its population mean at the end of a target run (collapses excluded: they are
rare accidents, not the allocation's expected score).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.special import expit
from scipy.stats import norm

from .synthetic import World, crossover_class
from .synthetic_base import check_k, group_factor, layout, size_ladder

SHAPES = ("sigmoid", "weibull", "logsat", "power")
CROSSOVERS = ("within", "after", "beyond", "none")


def shape_value(kind: str, u: np.ndarray, s: float, L: float = 4.0) -> np.ndarray:
    """g(u) in [0, 1] for u = C / c >= 0 (forms in the module docstring)."""
    u = np.maximum(np.asarray(u, dtype=float), 0.0)
    if kind == "sigmoid":
        with np.errstate(divide="ignore"):
            return expit(s * np.log(np.where(u > 0, u, 1e-300)))
    if kind == "weibull":
        return 1 - np.exp(-(u**s))
    if kind == "logsat":
        return np.minimum(1.0, np.log1p(u) / L)
    if kind == "power":
        return np.minimum(1.0, u**s)
    raise ValueError(f"unknown shape {kind!r}; choose from {SHAPES}")


def rl_mean(spec: dict, flops: np.ndarray | float, end_of_run: bool = False) -> np.ndarray:
    """Population mean score of one allocation ``spec`` after ``flops`` counted FLOPs."""
    C = np.maximum(np.asarray(flops, dtype=float), 0.0)
    g = shape_value(spec["shape"], C / spec["c"], spec["s"])
    with np.errstate(divide="ignore"):
        dec = spec["decline"] * np.maximum(0.0, np.log(np.where(C > 0, C, 1e-300) / spec["c_dec"]))
    mu = spec["r0"] + np.where(C > 0, spec["jump"] + spec["gain"] * g - dec, 0.0)
    if end_of_run:
        mu = mu + np.where(C > 0, spec["bonus"], 0.0)
    return np.clip(mu, 0.01, 0.97)


@dataclass
class RLWorld(World):
    """A :class:`World` whose allocations carry ``spec`` dicts for :func:`rl_mean`."""

    generator: str = "rl"
    seed_growth: float = 0.0
    collapse_p: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def truth(self, k: int, budget: float | None = None) -> float:
        b = self.target_budget if budget is None else budget
        return float(rl_mean(self.allocations[k]["spec"], b * float(np.mean(self.spend)), end_of_run=True))

    def ill_behaved(self, k: int) -> bool:
        """Whether allocation ``k``'s true curve declines (a run's collapse is an accident of the run)."""
        return self.allocations[k]["spec"]["decline"] > 0

    def seed_sd_at(self, flops: float) -> float:
        return float(self.seed_sd * (max(flops, 1.0) / (self.budgets[-1] * np.mean(self.spend))) ** self.seed_growth)

    def _points(self, spec: dict, model_idx: int, flops: list[float], rr: np.random.Generator,
                z_run: float | np.ndarray, collapse_at: int | None) -> list[tuple[float, np.ndarray]]:
        """(counted FLOPs, per-problem 0/1 outcomes) at each of ``flops`` (0 first) for one run
        whose draws come from ``rr`` (its offset ``z_run``, one or one per point, and collapse point already drawn):
        the shared problem difficulties and model factor, a per-point wiggle, the
        end-of-schedule bonus at the last point, the base model's fixed outcomes at 0."""
        d = np.random.default_rng([self.seed, 1]).normal(0.0, self.difficulty_sd, self.n_problems)
        z = np.random.default_rng([self.seed, 2, model_idx]).standard_normal(self.n_problems)
        theta_grid, mu_grid = self._theta_table()
        out, z_at = [], np.broadcast_to(np.asarray(z_run, dtype=float), (len(flops),))
        for i, c in enumerate(flops):
            mu = float(rl_mean(spec, c, end_of_run=(i == len(flops) - 1)))
            if c > 0:
                sd = self.seed_sd_at(c)
                mu += z_at[i] * sd + rr.normal(0.0, sd / 3)
                if collapse_at is not None and i >= collapse_at:
                    mu = 0.5 * mu + 0.5 * 0.8 * spec["r0"]
            theta = float(np.interp(np.clip(mu, 0.005, 0.985), mu_grid, theta_grid))
            eps = (rr.standard_normal(self.n_problems) if c > 0
                   else np.random.default_rng([self.seed, 4, model_idx]).standard_normal(self.n_problems))
            u = norm.cdf(self.rho * z + np.sqrt(1 - self.rho**2) * eps)
            out.append((float(c), (u < expit(theta - d)).astype(int)))
        return out

    def run_outcomes(self, k: int, budget: float, seed: int) -> list[tuple[float, np.ndarray]]:
        """(counted FLOPs, per-problem 0/1 outcomes) of one run: step 0 then ``n_points`` points."""
        spec = self.allocations[k]["spec"]
        model_idx = sorted(self.models).index(self.allocations[k]["model"])
        rr = np.random.default_rng([self.seed, 3, k, int(np.log10(budget) * 1000), seed])
        z_run = rr.standard_normal()
        spent = budget * rr.uniform(*self.spend)
        flops = [0.0] + [spent * (i + 1) / self.n_points for i in range(self.n_points)]
        collapse_at = int(rr.integers(1, self.n_points + 1)) if rr.random() < self.collapse_p else None
        return self._points(spec, model_idx, flops, rr, z_run, collapse_at)

    def trajectory(self, k: int, seed: int, flops: list[float]) -> list[tuple[float, np.ndarray]]:
        """(counted FLOPs, per-problem 0/1 outcomes) of ONE run evaluated at ``flops`` (ascending,
        0 first): one offset z_run (a random walk from it when ``seed_walk`` > 0: :meth:`World.offsets`)
        and one collapse draw for the whole run (a prefix that ends
        after the collapse shows it), the per-point wiggle as in :meth:`run_outcomes`, and the
        end-of-schedule bonus at the LAST point only (the prefixes did not anneal). Its own
        random stream, so a flat design's runs are untouched."""
        spec = self.allocations[k]["spec"]
        model_idx = sorted(self.models).index(self.allocations[k]["model"])
        rr = np.random.default_rng([self.seed, 6, k, seed])
        z_run = rr.standard_normal()
        n_pos = sum(c > 0 for c in flops)
        collapse_at = int(rr.integers(1, n_pos + 1)) if (rr.random() < self.collapse_p and n_pos) else None
        return self._points(spec, model_idx, flops, rr, self.offsets(z_run, flops, k, seed), collapse_at)


def _draw(rng: np.random.Generator, seed: int, null: bool, k: int = 4,
          arng: np.random.Generator | None = None) -> RLWorld:
    """One candidate world; ``arng`` (K > 4) draws the sizes and the allocations, ``rng`` the rest
    (K = 4: ``rng`` draws everything, in the order it did before K existed)."""
    names, groups = layout(k)
    arng = rng if arng is None else arng
    b1 = 10 ** rng.uniform(10, 12)
    span = rng.uniform(4, 10)
    budgets = [b1, b1 * np.sqrt(span), b1 * span]
    target = budgets[-1] * rng.uniform(4, 16)
    models = {"small": 1e5, "large": 1e5 * rng.uniform(3, 8)} if k == 4 else size_ladder(arng, names, (2.0, 4.0))
    r0 = r0_small = rng.uniform(0.1, 0.4)
    jump_world = rng.uniform(0.0, 0.12) if rng.random() < 0.6 else 0.0
    bonus = rng.uniform(0.0, 0.03) if rng.random() < 0.5 else 0.0
    decline_world = rng.random() < 0.3
    allocs = []
    for i, model in enumerate(models):
        if k == 4:
            r0 = r0_small + (rng.uniform(0.05, 0.2) if model == "large" else 0.0)
        elif i:
            r0 = r0 + arng.uniform(0.03, 0.12)
        slow = models[model] / 1e5
        big = (1.3 if model == "large" else 1.0) if k == 4 else 1 + 0.3 * i / (len(names) - 1)
        for g in groups:
            shape = str(arng.choice(SHAPES))
            head = 0.95 - r0
            gain = 0.0 if null else arng.uniform(0.1, 0.8) * head * big
            c = b1 * 10 ** arng.uniform(-1.0, 1.5) * slow ** arng.uniform(0.5, 1.5) * group_factor(arng, g, 0.6, 1.6)
            spec = {"shape": shape, "r0": float(r0), "gain": float(min(gain, head)), "c": float(c),
                    "s": float({"sigmoid": arng.uniform(0.6, 2.5), "weibull": arng.uniform(0.4, 1.5),
                                "power": arng.uniform(0.15, 0.7)}.get(shape, 1.0)),
                    "jump": 0.0 if null else float(jump_world * arng.uniform(0.5, 1.0)),
                    "bonus": 0.0 if null else float(bonus),
                    "decline": float(arng.uniform(0.01, 0.05)) if (decline_world and not null and arng.random() < 0.6) else 0.0,
                    "c_dec": float(10 ** arng.uniform(np.log10(b1 / 2), np.log10(target)))}
            allocs.append({"model": model, "num_generations": g, "spec": spec})
    return RLWorld(name=f"rlworld-{seed}" + ("" if k == 4 else f"-k{k}"), models=models, allocations=allocs,
                   budgets=[float(b) for b in budgets],
                   seeds=list(range(int(rng.integers(2, 4)))), target_budget=float(target),
                   n_problems=int(rng.integers(200, 1001)), seed_sd=float(rng.uniform(0.005, 0.06)),
                   seed_growth=float(rng.uniform(0.0, 0.5)), collapse_p=0.04 if rng.random() < 1 / 3 else 0.0,
                   difficulty_sd=float(rng.uniform(1.0, 2.0)), seed=int(seed),
                   tags={"span": float(span), "target_ratio": float(target / budgets[-1])})


def rl_world(seed: int, null: bool | None = None, max_tries: int = 200, k: int = 4) -> RLWorld:
    """A test world drawn at random (module docstring); ``null`` forces or forbids a null world; ``k``
    allocations (4, 12 or 24: :data:`race.analysis.synthetic_base.LAYOUTS`; K = 4 is the world the
    seed drew before K existed, K > 4 draws its sizes and allocations from a stream of its own)."""
    k = check_k(k)
    rng = np.random.default_rng([seed, 2026])
    arng = None if k == 4 else np.random.default_rng([seed, 2026, k])
    is_null = bool(rng.random() < 0.15) if null is None else null
    want = "none" if is_null else str(rng.choice(CROSSOVERS))
    w = None
    for _ in range(max_tries):
        w = _draw(rng, seed, is_null, k, arng)
        if is_null or crossover_class(w) == want:
            break
    assert w is not None
    w.tags.update(flat=is_null, family="null" if is_null else "rl", crossover="none" if is_null else crossover_class(w),
                  seed_sd_points=100 * w.seed_sd, collapses=w.collapse_p > 0,
                  jump=max(a["spec"]["jump"] for a in w.allocations), bonus=w.allocations[0]["spec"]["bonus"],
                  decline=any(a["spec"]["decline"] > 0 for a in w.allocations))
    return w
