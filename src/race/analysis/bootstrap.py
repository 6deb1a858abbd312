"""Bootstrap over seeds (whole runs) and over evaluation problems.

The unit of resampling is a whole run or an evaluation problem, never a checkpoint of
one run (checkpoints of a run are correlated; resampling them understates the noise).

For cells c (e.g. (budget, allocation)) holding runs r in c with per-problem score vectors
p_r (the same problems, in the same order, for every run of a target), one replicate is

    w  = multinomial(P, 1/P) / P                          (problem weights, shared by all runs)
    s_r = w . p_r                                          (run score on resampled problems)
    k  = multinomial(m_c, 1/m_c) per cell                  (seed counts, m_c runs in cell c)
    S_c = sum_r k_r s_r / m_c                              (cell mean)

With only seeds, s_r is the run's score; with only problems, k_r = 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .tables import per_problem_array, require_columns

OVER_CHOICES = ("seeds", "problems")


def as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A numpy Generator from a seed or a Generator (``None`` means seed 0, not entropy)."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(0 if rng is None else int(rng))


@dataclass
class BootstrapResult:
    """Bootstrap replicates of cell mean scores.

    ``cells``: one row per cell (the cell columns, ``score`` = point mean over runs,
    ``n_runs``); ``reps``: array (n_boot, n_cells), column j belongs to ``cells.iloc[j]``.
    """

    cells: pd.DataFrame
    reps: np.ndarray
    over: tuple[str, ...]
    notes: list[str] = field(default_factory=list)

    def index_of(self, **values: object) -> int:
        """Column index of the cell whose columns equal ``values``."""
        mask = np.ones(len(self.cells), dtype=bool)
        for k, v in values.items():
            mask &= (self.cells[k] == v).to_numpy()
        hits = np.flatnonzero(mask)
        if len(hits) != 1:
            raise KeyError(f"{len(hits)} cells match {values}")
        return int(hits[0])

    def intervals(self, level: float = 0.95) -> pd.DataFrame:
        """``cells`` with ``lo``, ``hi`` (percentile interval) and ``se`` (replicate std)."""
        a = (1 - level) / 2
        out = self.cells.copy()
        out["lo"] = np.quantile(self.reps, a, axis=0)
        out["hi"] = np.quantile(self.reps, 1 - a, axis=0)
        out["se"] = self.reps.std(axis=0, ddof=1) if self.reps.shape[0] > 1 else np.nan
        return out


def _problem_matrix(finals: pd.DataFrame) -> tuple[np.ndarray | None, str | None]:
    if "per_problem" not in finals.columns:
        return None, "no per_problem column: problem bootstrap skipped"
    arrays = [per_problem_array(v) for v in finals["per_problem"]]
    if any(a is None for a in arrays):
        return None, "per_problem missing for some runs: problem bootstrap skipped"
    sizes = {a.size for a in arrays}
    if len(sizes) != 1:
        return None, f"per_problem lengths differ across runs ({sorted(sizes)}): problem bootstrap skipped"
    return np.vstack(arrays), None


def bootstrap_cells(
    finals: pd.DataFrame,
    cell_cols: Sequence[str] = ("budget", "allocation"),
    n_boot: int = 1000,
    rng: np.random.Generator | int | None = 0,
    over: Sequence[str] = ("seeds", "problems"),
) -> BootstrapResult:
    """Replicates of each cell's mean score (formula in the module docstring).

    ``finals`` holds one row per run (see :func:`race.analysis.final_scores`) with
    ``score`` and, for the problem bootstrap, ``per_problem``. Problem indices are drawn
    once per replicate and shared by every run (joint across runs). Cells are sorted by
    ``cell_cols``; the same input and seed give the same replicates.
    """
    over = tuple(over)
    bad = [o for o in over if o not in OVER_CHOICES]
    if bad:
        raise ValueError(f"over must be drawn from {OVER_CHOICES}, got {bad}")
    cell_cols = list(cell_cols)
    require_columns(finals, [*cell_cols, "run_id", "score"], "finals")
    if finals.empty:
        raise ValueError("finals is empty: no runs to bootstrap")
    gen = as_rng(rng)
    fin = finals.sort_values([*cell_cols, "run_id"], kind="mergesort").reset_index(drop=True)
    notes: list[str] = []

    if "problems" in over:
        pmat, note = _problem_matrix(fin)
        if note:
            notes.append(note)
    else:
        pmat = None
    if pmat is not None:
        n_prob = pmat.shape[1]
        w = gen.multinomial(n_prob, np.full(n_prob, 1.0 / n_prob), size=n_boot) / n_prob
        run_reps = w @ pmat.T  # (n_boot, n_runs)
        # Runs whose per_problem mean differs from the reported score (e.g. rounding) are
        # shifted so the replicate mean is centred on the reported score.
        run_reps += (fin["score"].to_numpy() - pmat.mean(axis=1))[None, :]
    else:
        run_reps = np.tile(fin["score"].to_numpy(dtype=float), (n_boot, 1))

    groups = fin.groupby(cell_cols, sort=True, dropna=False)
    cells = groups["score"].agg(score="mean", n_runs="size").reset_index()
    reps = np.empty((n_boot, len(cells)))
    codes = groups.ngroup().to_numpy()  # group numbers follow the sorted cell order
    for j in range(len(cells)):
        idx = np.flatnonzero(codes == j)
        m = len(idx)
        if "seeds" in over and m > 1:
            k = gen.multinomial(m, np.full(m, 1.0 / m), size=n_boot)
            reps[:, j] = (k * run_reps[:, idx]).sum(axis=1) / m
        else:
            reps[:, j] = run_reps[:, idx].mean(axis=1)
    if "seeds" in over and (cells["n_runs"] < 2).any():
        notes.append("some cells have a single seed: their seed variance is not estimated")
    return BootstrapResult(cells=cells, reps=reps, over=over, notes=notes)


@dataclass
class Difference:
    """Bootstrap difference a - b of two cells: point, interval, P(a > b), tie flag."""

    diff: float
    lo: float
    hi: float
    p_greater: float
    tie: bool

    def to_dict(self) -> dict:
        return dict(diff=self.diff, lo=self.lo, hi=self.hi, p_greater=self.p_greater, tie=self.tie)


def difference(point_a: float, point_b: float, reps_a: np.ndarray, reps_b: np.ndarray, level: float = 0.95) -> Difference:
    """Difference a - b with a percentile interval over paired replicates.

    A difference whose interval covers 0 is a tie.
    """
    d = np.asarray(reps_a) - np.asarray(reps_b)
    a = (1 - level) / 2
    lo, hi = (float(q) for q in np.quantile(d, [a, 1 - a]))
    p = float(np.mean(d > 0) + 0.5 * np.mean(d == 0))
    return Difference(float(point_a - point_b), lo, hi, p, bool(lo <= 0.0 <= hi))


def win_probabilities(reps: np.ndarray) -> np.ndarray:
    """Share of replicates in which each column is the maximum (ties split evenly)."""
    reps = np.asarray(reps, dtype=float)
    is_max = reps >= reps.max(axis=1, keepdims=True) - 1e-15
    return (is_max / is_max.sum(axis=1, keepdims=True)).mean(axis=0)
