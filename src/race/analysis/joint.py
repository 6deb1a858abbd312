"""One paired bootstrap for everything that compares allocations.

A study's runs of one target become a :class:`StudyMatrix`: every run's evaluation points
with their per-problem outcomes (the same problems, in the same order, for every run of
the target), its step-0 evaluation (the base model before training) and its reading at
equal counted FLOPs within its budget. :func:`draw_replicates` then draws R joint
replicates; replicate r holds

    w_r  = multinomial(P, 1/P) / P      problem weights, ONE draw shared by every run,
                                        allocation, budget and evaluation point;
    k_r  = multinomial(m_s, 1/m_s)      seed counts, drawn per allocation over its m_s
                                        seeds and shared by its budgets (a seed is one
                                        trajectory: :func:`seed_clusters`).

A run's score under replicate r is w_r . p (p its per-problem vector), so every allocation
is judged on the same resampled problems (paired), and every quantity derived from the
same replicate (forecasts, P(best), expected regret, learning gains, standings) shares it.
Cell means use the small-sample correction mean + sqrt(m/(m-1)) (resampled mean - mean)
so that two seeds do not look twice as alike as they are. Without per-problem vectors
(or with lengths that differ) only seeds are resampled and ``notes`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .bootstrap import as_rng
from .curves import final_scores, learning_curves
from .tables import RUN_KEYS, per_problem_array


@dataclass
class StudyMatrix:
    """Per-problem outcomes of one target, indexed by run (row order of ``runs``)."""

    target: str
    runs: pd.DataFrame  # one row per run, RUN_KEYS present plus end_flops
    points: pd.DataFrame  # C > 0 evaluation points: run (row index into runs), flops, score, n
    point_pp: np.ndarray | None  # (n_points, P) per-problem outcomes of ``points``
    start: np.ndarray  # (n_runs,) step-0 score, NaN when the run has none
    start_pp: np.ndarray | None  # (n_runs, P)
    end: np.ndarray  # (n_runs,) score at equal FLOPs within the run's budget
    end_pp: np.ndarray | None  # (n_runs, P)
    n_problems: int | None
    notes: list[str] = field(default_factory=list)

    def strata(self) -> dict[tuple[str, float], np.ndarray]:
        """Run indices per (allocation, budget)."""
        return {(str(a), float(b)): g.index.to_numpy()
                for (a, b), g in self.runs.groupby(["allocation", "budget"], sort=True)}

    def runs_of(self, allocation: str, max_budget: float | None = None) -> np.ndarray:
        """Run indices of ``allocation`` at budgets <= ``max_budget`` (all its runs by default)."""
        keep = self.runs["allocation"] == allocation
        if max_budget is not None:
            keep &= self.runs["budget"].to_numpy(float) <= max_budget * (1 + 1e-9)
        return self.runs.index[keep].to_numpy()


def _stack(vectors: list[np.ndarray | None], size: int | None) -> np.ndarray | None:
    if size is None or any(v is None or v.size != size for v in vectors):
        return None
    return np.vstack(vectors) if vectors else np.empty((0, size))


def study_matrix(evals: pd.DataFrame, runs: pd.DataFrame, target: str) -> StudyMatrix:
    """Build the :class:`StudyMatrix` of ``target`` from complete runs (random controls kept)."""
    curves = learning_curves(evals, runs, target=target)  # once: the equal-FLOP readings come from it too
    ends = final_scores(evals, runs, target, at="equal", curves=curves).reset_index(drop=True)
    if ends.empty:
        raise ValueError(f"no complete runs with evaluations on target {target!r}")
    cols = [c for c in RUN_KEYS if c in ends.columns]
    run_tab = ends[cols].copy()
    run_tab["end_flops"] = ends["flops"].to_numpy(float)
    index = {rid: i for i, rid in enumerate(run_tab["run_id"])}
    curves = curves[curves["run_id"].isin(index)]
    has_pp = "per_problem" in curves.columns
    pp_all = [per_problem_array(v) for v in curves["per_problem"]] if has_pp else [None] * len(curves)
    sizes = {v.size for v in pp_all if v is not None}
    notes: list[str] = []
    size = sizes.pop() if len(sizes) == 1 and all(v is not None for v in pp_all) else None
    if size is None:
        notes.append("per-problem outcomes missing or of different lengths: only seeds are resampled "
                     "(problem noise is NOT in the intervals)")
    n_col = curves["n"].to_numpy(float) if "n" in curves.columns else np.full(len(curves), np.nan)
    scores = curves["score"].to_numpy(float)
    flops = curves["flops"].to_numpy(float)
    run_idx = curves["run_id"].map(index).to_numpy(int)
    n_runs = len(run_tab)
    start = np.full(n_runs, np.nan)
    start_pp: list[np.ndarray | None] = [None] * n_runs
    zero = flops <= 0
    for i in np.flatnonzero(zero):  # a run's step-0 evaluation (the first one if repeated)
        r = run_idx[i]
        if np.isnan(start[r]):
            start[r], start_pp[r] = scores[i], pp_all[i]
    pos = ~zero
    points = pd.DataFrame({"run": run_idx[pos], "flops": flops[pos], "score": scores[pos],
                           "n": np.where(np.isfinite(n_col[pos]) & (n_col[pos] > 0), n_col[pos], 1.0)})
    end_pp = [per_problem_array(v) for v in ends["per_problem"]] if "per_problem" in ends.columns else [None] * n_runs
    have_start = np.isfinite(start)
    if not have_start.all():
        notes.append(f"{int((~have_start).sum())} of {n_runs} runs have no step-0 evaluation: their learning gain "
                     "cannot be measured")
    return StudyMatrix(
        target=target, runs=run_tab, points=points,
        point_pp=_stack([pp_all[i] for i in np.flatnonzero(pos)], size),
        start=start, start_pp=_stack([start_pp[r] if start_pp[r] is not None else np.full(size or 0, np.nan)
                                      for r in range(n_runs)], size) if size else None,
        end=ends["score"].to_numpy(float), end_pp=_stack(end_pp, size), n_problems=size, notes=notes)


@dataclass
class Replicates:
    """R joint replicates: shared problem weights and per-stratum seed counts."""

    weights: np.ndarray | None  # (R, P) rows sum to 1; None: problems not resampled
    counts: np.ndarray  # (R, n_runs) seed multiplicity of each run (sums to m_s within a stratum)
    strata: dict[tuple[str, float], np.ndarray]
    over: tuple[str, ...]

    @property
    def n(self) -> int:
        return self.counts.shape[0]

    def scores(self, pp: np.ndarray | None, observed: np.ndarray) -> np.ndarray:
        """(R, k) scores of k vectors under each replicate's problem weights.

        ``pp`` (k, P) per-problem vectors (None: no problem resampling), ``observed`` (k,)
        their reported scores; replicates are centred on the reported scores.
        """
        observed = np.asarray(observed, dtype=float)
        if self.weights is None or pp is None:
            return np.tile(observed, (self.n, 1))
        pp = np.nan_to_num(pp, nan=0.0)
        return self.weights @ pp.T + (observed - pp.mean(axis=1))[None, :]

    def cell_mean(self, run_values: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """(R,) seed-resampled mean of ``run_values[:, idx]`` with the small-sample correction."""
        vals = run_values[:, idx]
        m = len(idx)
        plain = vals.mean(axis=1)
        if m < 2 or "seeds" not in self.over:
            return plain
        resampled = (self.counts[:, idx] * vals).sum(axis=1) / m
        return plain + np.sqrt(m / (m - 1)) * (resampled - plain)


def seed_clusters(sm: StudyMatrix, strata: dict[tuple[str, float], np.ndarray]) -> list[list[np.ndarray]]:
    """Groups of strata resampled together, each as run indices in the same seed order.

    A seed is one trajectory across budgets: with a constant learning rate the runs of one
    (allocation, seed) at several budgets are prefixes of each other (docs/analysis.md,
    section 8), and under any schedule they share the initialisation and the prompts. So
    the cells of an allocation whose runs have the same set of seeds are resampled by seed,
    jointly (a cluster bootstrap); a cell whose seeds differ (a failed run, unequal seeds)
    is resampled on its own."""
    seeds = sm.runs["seed"].to_numpy() if "seed" in sm.runs.columns else None
    by_alloc: dict[tuple[str, tuple], list[np.ndarray]] = {}
    out: list[list[np.ndarray]] = []
    for (alloc, _), idx in sorted(strata.items()):
        s = None if seeds is None else tuple(seeds[idx])
        if s is None or len(set(s)) != len(s) or any(v is None or v != v for v in s):
            out.append([idx])
            continue
        order = np.argsort(np.asarray(s, dtype=float), kind="stable")
        by_alloc.setdefault((alloc, tuple(sorted(s))), []).append(idx[order])
    return out + list(by_alloc.values())


def draw_replicates(sm: StudyMatrix, n_boot: int, rng: np.random.Generator | int | None = 0,
                    over: tuple[str, ...] = ("seeds", "problems")) -> Replicates:
    """Draw ``n_boot`` joint replicates for ``sm`` (formulas in the module docstring)."""
    gen = as_rng(rng)
    weights = None
    if "problems" in over and sm.n_problems:
        P = sm.n_problems
        weights = gen.multinomial(P, np.full(P, 1.0 / P), size=n_boot) / P
    strata = sm.strata()
    counts = np.ones((n_boot, len(sm.runs)))
    if "seeds" in over:
        for idx in seed_clusters(sm, strata):
            m = len(idx[0])
            if m > 1:
                draw = gen.multinomial(m, np.full(m, 1.0 / m), size=n_boot)
                for cell in idx:  # every budget of the allocation takes the same seeds
                    counts[:, cell] = draw
    return Replicates(weights=weights, counts=counts, strata=strata, over=tuple(over))


def resampled_text(reps: Replicates, sm: StudyMatrix, forecast: bool = True, method: str = "joint") -> str:
    """Exactly what the intervals resample (for the report's method section)."""
    parts = []
    if "seeds" in reps.over:
        parts.append("seeds (whole runs; a seed's runs at every budget of an allocation drawn together, as one "
                     "trajectory), with the sqrt(m/(m-1)) small-sample correction")
    if reps.weights is not None:
        parts.append(f"evaluation problems ({sm.n_problems} per evaluation; one draw per replicate shared by every "
                     "allocation, budget and evaluation point: paired)")
    else:
        parts.append("NOT evaluation problems (per-problem outcomes missing)")
    text = f"{reps.n} joint bootstrap replicates over " + " and ".join(parts)
    if forecast:
        fit = ("refits the joint model of every allocation that learned" if method == "joint" else
               "draws a curve family by its held-out skill, refits every allocation")
        text += (f"; each replicate {fit} and adds the extrapolation error measured by rolling-origin back-tests inside the study (logit scale, "
                 "one part shared by all allocations, one per allocation, scaled to the target's reach and, for the joint "
                 "model, to a misfit that remains at the last pilot)")
    return text
