"""Validation of a recommendation: runs at the target budget, scored so that it can fail honestly.

Given validation runs of the recommended allocation and its rivals at the target budget
(each read at equal counted FLOPs, as the pilots were):

- **realised score** of every validated allocation with its own interval: the joint
  bootstrap of :mod:`race.analysis.joint` (problems shared, seeds resampled per allocation);
- **realised regret** = score(best rival) - score(recommendation). Picking the best rival on
  the same problems that score it would favour the rival (winner's curse), so the rival is
  chosen on one half of the problems (even positions) and the regret is measured, with its
  paired interval, on the other half (odd positions). Without per-problem outcomes the
  rival is the runner-up named before validation (chosen without seeing these data);
- **coverage**: forecast minus realised, with both noises: d = predicted - realised,
  s = sqrt(s_f^2 + s_r^2) with s_f = (forecast interval width) / (2 z) and s_r the
  realised replicates' standard deviation; covered when |d| <= z s (z for ``level``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import norm

from .bootstrap import as_rng
from .joint import Replicates, StudyMatrix, draw_replicates, study_matrix
from .recommend import Recommendation
from .tables import jsonable


@dataclass
class ValidationResult:
    """Realised outcome of a recommendation at the target budget."""

    target: str
    target_budget: float
    allocation: str
    realised_score: float
    realised_lo: float
    realised_hi: float
    predicted_score: float
    predicted_lo: float
    predicted_hi: float
    prediction_covered: bool
    forecast_error: float
    forecast_error_lo: float
    forecast_error_hi: float
    best_rival: str | None
    best_rival_score: float
    rival_chosen_on: str
    realised_regret: float
    regret_lo: float
    regret_hi: float
    regret_tie: bool
    predicted_regret: float
    rank: int
    table: pd.DataFrame = field(repr=False)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: jsonable(getattr(self, k)) for k in self.__dataclass_fields__}


def _half_scores(pp: np.ndarray, half: np.ndarray, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Run scores on the problems in ``half``: (points (n_runs,), replicates (R, n_runs))."""
    sub = pp[:, half]
    pts = sub.mean(axis=1)
    return pts, (weights @ sub.T if weights is not None else np.tile(pts, (1, 1)))


def realised_regret(recommendation: Recommendation, validation_evals: pd.DataFrame, validation_runs: pd.DataFrame,
                    n_boot: int = 1000, rng: np.random.Generator | int | None = 0,
                    budget_rtol: float = 0.05) -> ValidationResult:
    """Score the validation runs of ``recommendation`` (module docstring)."""
    rec = recommendation
    sm = _at_target(rec, validation_evals, validation_runs, budget_rtol)
    gen = as_rng(rng)
    reps = draw_replicates(sm, n_boot, gen)
    end_reps = reps.scores(sm.end_pp, sm.end)
    z = float(norm.ppf(0.5 + rec.level / 2))
    q = (1 - rec.level) / 2
    allocs = sorted(sm.runs["allocation"].unique())
    idx = {a: sm.runs.index[sm.runs["allocation"] == a].to_numpy() for a in allocs}
    cell = {a: reps.cell_mean(end_reps, idx[a]) for a in allocs}
    table = pd.DataFrame({"allocation": allocs,
                          "score": [float(np.mean(sm.end[idx[a]])) for a in allocs],
                          "lo": [float(np.quantile(cell[a], q)) for a in allocs],
                          "hi": [float(np.quantile(cell[a], 1 - q)) for a in allocs],
                          "n_runs": [len(idx[a]) for a in allocs]})
    table = table.merge(rec.predictions[["allocation", "score"]].rename(columns={"score": "predicted"}),
                        on="allocation", how="left")
    table = table.sort_values(["score", "allocation"], ascending=[False, True], kind="mergesort").reset_index(drop=True)
    own = table[table["allocation"] == rec.allocation].iloc[0]

    # coverage of the forecast, both noises
    s_f = max(rec.predicted_hi - rec.predicted_lo, 0.0) / (2 * z)
    s_r = float(np.std(cell[rec.allocation], ddof=1)) if reps.n > 1 else 0.0
    err = rec.predicted_score - float(own["score"])
    s = float(np.hypot(s_f, s_r))

    rivals = [a for a in allocs if a != rec.allocation]
    best_rival, rival_score, chosen_on = None, float("nan"), "-"
    regret, lo, hi, tie = float("nan"), float("nan"), float("nan"), True
    if rivals:
        best_rival, d_reps, regret, chosen_on = _best_rival(rec, sm, reps, idx, cell, rivals, gen, n_boot)
        rival_score = float(np.mean(sm.end[idx[best_rival]]))
        lo, hi = (float(v) for v in np.quantile(d_reps, [q, 1 - q]))
        tie = bool(lo <= 0.0 <= hi)
    rank = int(np.flatnonzero(table["allocation"].to_numpy() == rec.allocation)[0]) + 1
    return ValidationResult(
        target=rec.target, target_budget=rec.target_budget, allocation=rec.allocation,
        realised_score=float(own["score"]), realised_lo=float(own["lo"]), realised_hi=float(own["hi"]),
        predicted_score=rec.predicted_score, predicted_lo=rec.predicted_lo, predicted_hi=rec.predicted_hi,
        prediction_covered=bool(abs(err) <= z * s), forecast_error=err, forecast_error_lo=err - z * s,
        forecast_error_hi=err + z * s, best_rival=best_rival, best_rival_score=rival_score,
        rival_chosen_on=chosen_on, realised_regret=regret, regret_lo=lo, regret_hi=hi, regret_tie=tie,
        predicted_regret=rec.expected_regret, rank=rank, table=table, notes=list(sm.notes),
    )


def _at_target(rec: Recommendation, evals: pd.DataFrame, runs: pd.DataFrame, budget_rtol: float) -> StudyMatrix:
    """The study matrix of the validation runs at the target budget (within ``budget_rtol``,
    read as the target budget); refused without them or without a run of the pick."""
    near = np.isclose(runs["budget"].astype(float).to_numpy(), rec.target_budget, rtol=budget_rtol, atol=0.0)
    if not near.any():
        raise ValueError(f"no validation runs at the target budget {rec.target_budget:.3g} "
                         f"(budgets: {sorted(runs['budget'].astype(float).unique())})")
    sm = study_matrix(evals, runs[near].assign(budget=rec.target_budget), rec.target)
    if rec.allocation not in set(sm.runs["allocation"]):
        raise ValueError(f"the recommended allocation {rec.allocation} has no validation run")
    return sm


def _best_rival(rec: Recommendation, sm: StudyMatrix, reps: Replicates, idx: dict[str, np.ndarray],
                cell: dict[str, np.ndarray], rivals: list[str], gen: np.random.Generator,
                n_boot: int) -> tuple[str, np.ndarray, float, str]:
    """(the best rival, (R,) replicates of its regret over the pick, the regret, how the rival
    was chosen): on even-position problems with the regret on the odd ones (module docstring),
    else the runner-up named before validation or the best rival on the same problems."""
    pp = sm.end_pp
    if pp is not None and pp.shape[1] >= 2:
        even, odd = np.arange(0, pp.shape[1], 2), np.arange(1, pp.shape[1], 2)
        pick_pts = {a: float(pp[idx[a]][:, even].mean()) for a in rivals}
        best_rival = max(rivals, key=lambda a: (pick_pts[a], a))
        w = gen.multinomial(len(odd), np.full(len(odd), 1.0 / len(odd)), size=n_boot) / len(odd)
        pts, half_reps = _half_scores(pp, odd, w)
        d_reps = reps.cell_mean(half_reps, idx[best_rival]) - reps.cell_mean(half_reps, idx[rec.allocation])
        regret = float(pts[idx[best_rival]].mean() - pts[idx[rec.allocation]].mean())
        return best_rival, d_reps, regret, ("rival chosen on even-position problems, regret measured on "
                                            "odd-position problems")
    named = rec.runner_up if rec.runner_up in rivals else None
    best_rival = named or max(rivals, key=lambda a: float(np.mean(sm.end[idx[a]])))
    d_reps = cell[best_rival] - cell[rec.allocation]
    regret = float(np.mean(sm.end[idx[best_rival]]) - np.mean(sm.end[idx[rec.allocation]]))
    return best_rival, d_reps, regret, ("the runner-up named before validation" if named else
                                        "the best rival on the same problems (winner's curse NOT corrected: "
                                        "no per-problem data)")
