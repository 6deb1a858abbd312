"""Recommendation of an allocation for a target budget, and its validation.

Each candidate allocation k gets a predicted score at the target budget C_T:

- ``method="curve"``: the saturating fit R_k(C) (see :mod:`race.analysis.fits`) over all
  evaluation points of k's pilot runs (every budget pooled), read at C_T;
- ``method="trend"``: the frontier trend score = alpha_k + beta_k ln(budget) fitted to the
  final scores of k's runs across pilot budgets, read at C_T and clipped to [0, 1].

Uncertainty: B bootstrap replicates resample k's runs with replacement within each pilot
budget and refit. With replicate predictions P[r, k]:

- chosen = argmax_k of the point predictions;
- win probability p_k = share of r where P[r, k] is the maximum;
- expected regret of k = mean_r (max_j P[r, j] - P[r, k]) = E[max(max_alt - k, 0)].

Confidence label: "extrapolation too far" when C_T exceeds ``max_extrapolation`` times the
largest pilot budget, or the chosen curve's asymptote is unidentified (its data end before
C_mid) while C_T lies beyond its data; otherwise "unstable" when the chosen allocation's
win probability is below ``min_win_prob``, it is not the observed winner at the largest
pilot budget, or Kendall's tau between the two largest budgets is below ``min_tau``;
otherwise "stable regime". ``reasons`` says which rule decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from .bootstrap import as_rng, bootstrap_cells, difference, win_probabilities
from .curves import final_scores, learning_curves
from .fits import bootstrap_saturating, saturating_curve
from .frontier import allocation_scores
from .tables import ALLOCATION_COLUMNS, allocation_table

METHODS = ("curve", "trend")


def _jsonable(v: object) -> object:
    if isinstance(v, pd.DataFrame):
        return [{k: _jsonable(x) for k, x in row.items()} for row in v.to_dict(orient="records")]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


@dataclass
class Recommendation:
    """The allocation to run at ``target_budget`` and how sure the analysis is."""

    target: str
    target_budget: float
    condition: str | None
    method: str
    allocation: str
    allocation_params: dict
    predicted_score: float
    predicted_lo: float
    predicted_hi: float
    level: float
    expected_regret: float
    win_probability: float
    runner_up: str | None
    confidence: str
    reasons: list[str]
    largest_pilot_budget: float
    extrapolation_ratio: float
    predictions: pd.DataFrame = field(repr=False)

    def to_dict(self) -> dict:
        """Plain Python types only (predictions as a list of records)."""
        return {k: _jsonable(getattr(self, k)) for k in self.__dataclass_fields__}


def _trend_predict(budgets: np.ndarray, scores: np.ndarray, c_t: float) -> float:
    """alpha + beta ln(C_T) from least squares on (ln budget, score), clipped to [0, 1]."""
    x = np.log(budgets)
    if np.ptp(x) == 0:
        return float(np.clip(scores.mean(), 0, 1))
    beta, alpha = np.polyfit(x, scores, 1)
    return float(np.clip(alpha + beta * np.log(c_t), 0, 1))


def _predict_trend(finals_k: pd.DataFrame, c_t: float, n_boot: int, gen: np.random.Generator) -> tuple[float, np.ndarray]:
    b = finals_k["budget"].to_numpy(float)
    s = finals_k["score"].to_numpy(float)
    point = _trend_predict(b, s, c_t)
    strata = [np.flatnonzero(b == v) for v in np.unique(b)]
    reps = np.empty(n_boot)
    for r in range(n_boot):
        pick = np.concatenate([ix[gen.integers(0, len(ix), size=len(ix))] for ix in strata])
        reps[r] = _trend_predict(b[pick], s[pick], c_t)
    return point, reps


def _last_two_tau(finals: pd.DataFrame) -> tuple[float, float | None]:
    """Kendall tau of seed-mean scores between the two largest budgets; and that budget."""
    scores = allocation_scores(finals)
    budgets = sorted(scores["budget"].unique())
    if len(budgets) < 2:
        return float("nan"), None
    a = scores[scores["budget"] == budgets[-2]].set_index("allocation")["score"]
    b = scores[scores["budget"] == budgets[-1]].set_index("allocation")["score"]
    common = sorted(set(a.index) & set(b.index))
    if len(common) < 2:
        return float("nan"), budgets[-2]
    return float(kendalltau(a[common], b[common]).statistic), budgets[-2]


def recommend(
    evals: pd.DataFrame,
    runs: pd.DataFrame,
    target: str,
    target_budget: float,
    reward_system: str | None = None,
    method: str = "curve",
    n_boot: int = 200,
    rng: np.random.Generator | int | None = 0,
    level: float = 0.95,
    max_extrapolation: float = 10.0,
    min_win_prob: float = 0.8,
    min_tau: float = 0.5,
) -> Recommendation:
    """Choose an allocation for ``target_budget`` (formulas in the module docstring).

    ``reward_system`` restricts the candidates to one reward system; random-reward
    controls are never candidates. ``predictions`` holds one row per allocation:
    ``allocation, score, lo, hi, p_best, expected_regret, A_identified, c_mid, c_max``
    (the last three NaN/None for ``method="trend"``), sorted by score descending.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    gen = as_rng(rng)
    finals = final_scores(evals, runs, target, at="last")
    finals = finals[finals["reward"].astype(str) != "random"]
    if reward_system is not None:
        finals = finals[finals["reward_system"] == reward_system]
    if finals.empty:
        raise ValueError(f"no complete non-random runs for target {target!r} and reward system {reward_system!r}")
    curves = learning_curves(evals, runs, target=target)
    curves = curves[curves["run_id"].isin(set(finals["run_id"])) & (curves["flops"] > 0)]

    allocs = sorted(finals["allocation"].unique())
    points, reps, extra = [], [], []
    for k in allocs:
        if method == "curve":
            ci = bootstrap_saturating(curves[curves["allocation"] == k], n_boot=n_boot, rng=gen, strata=("budget",))
            p = float(ci.fit.predict(target_budget))
            r = ci.reps
            rr = saturating_curve(target_budget, r["r0"].to_numpy(), r["a"].to_numpy(), r["b"].to_numpy(),
                                  r["c_mid"].to_numpy())
            rr = np.where(np.isfinite(rr), rr, p)  # a replicate that could not be fitted keeps the point
            extra.append(dict(A_identified=ci.fit.A_identified, c_mid=ci.fit.c_mid, c_max=ci.fit.c_max))
        else:
            p, rr = _predict_trend(finals[finals["allocation"] == k], target_budget, n_boot, gen)
            extra.append(dict(A_identified=None, c_mid=np.nan, c_max=np.nan))
        points.append(p)
        reps.append(rr)
    points_arr = np.array(points)
    reps_arr = np.column_stack(reps)  # (n_boot, n_alloc)
    q = (1 - level) / 2
    p_best = win_probabilities(reps_arr)
    regret = (reps_arr.max(axis=1, keepdims=True) - reps_arr).mean(axis=0)
    pred = pd.DataFrame({"allocation": allocs, "score": points_arr,
                         "lo": np.quantile(reps_arr, q, axis=0), "hi": np.quantile(reps_arr, 1 - q, axis=0),
                         "p_best": p_best, "expected_regret": regret})
    pred = pd.concat([pred, pd.DataFrame(extra)], axis=1)
    pred = pred.sort_values(["score", "allocation"], ascending=[False, True], kind="mergesort").reset_index(drop=True)
    top = pred.iloc[0]

    largest = float(finals["budget"].max())
    ratio = float(target_budget / largest)
    reasons_far, reasons_unstable = [], []
    if ratio > max_extrapolation:
        reasons_far.append(f"target budget {target_budget:.3g} is {ratio:.1f}x the largest pilot budget "
                           f"{largest:.3g} (limit {max_extrapolation:g}x)")
    if method == "curve" and not top["A_identified"] and target_budget > top["c_max"]:
        reasons_far.append(f"asymptote A of the chosen allocation is unidentified: its data end at "
                           f"C={top['c_max']:.3g}, before C_mid={top['c_mid']:.3g}")
    if top["p_best"] < min_win_prob:
        reasons_unstable.append(f"win probability {top['p_best']:.2f} is below {min_win_prob:g}")
    at_largest = allocation_scores(finals[finals["budget"] == largest])
    observed = at_largest.iloc[0]["allocation"]
    if observed != top["allocation"]:
        reasons_unstable.append(f"the observed winner at the largest pilot budget {largest:.3g} is {observed}, "
                                f"not the chosen allocation")
    tau, prev = _last_two_tau(finals)
    if np.isfinite(tau) and tau < min_tau:
        reasons_unstable.append(f"Kendall tau between budgets {prev:.3g} and {largest:.3g} is {tau:.2f} "
                                f"(below {min_tau:g}): rankings are still moving")
    if reasons_far:
        confidence = "extrapolation too far"
    elif reasons_unstable:
        confidence = "unstable"
    else:
        confidence = "stable regime"
    reasons = reasons_far + reasons_unstable
    if not reasons:
        reasons = [f"chosen allocation wins with probability {top['p_best']:.2f}, leads at the largest pilot "
                   f"budget, and rankings agree across the two largest budgets (tau {tau:.2f})"]
    params = allocation_table(finals).set_index("allocation").loc[top["allocation"]]
    params = {c: _jsonable(params[c]) for c in (*ALLOCATION_COLUMNS, "model_params") if c in params.index}
    return Recommendation(
        target=target, target_budget=float(target_budget), condition=reward_system, method=method,
        allocation=str(top["allocation"]), allocation_params=params, predicted_score=float(top["score"]),
        predicted_lo=float(top["lo"]), predicted_hi=float(top["hi"]), level=level,
        expected_regret=float(top["expected_regret"]), win_probability=float(top["p_best"]),
        runner_up=str(pred.iloc[1]["allocation"]) if len(pred) > 1 else None, confidence=confidence,
        reasons=reasons, largest_pilot_budget=largest, extrapolation_ratio=ratio, predictions=pred,
    )


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
    best_rival: str | None
    best_rival_score: float
    realised_regret: float
    regret_lo: float
    regret_hi: float
    regret_tie: bool
    predicted_regret: float
    rank: int
    table: pd.DataFrame = field(repr=False)

    def to_dict(self) -> dict:
        return {k: _jsonable(getattr(self, k)) for k in self.__dataclass_fields__}


def realised_regret(
    recommendation: Recommendation,
    validation_evals: pd.DataFrame,
    validation_runs: pd.DataFrame,
    n_boot: int = 1000,
    rng: np.random.Generator | int | None = 0,
    budget_rtol: float = 0.05,
) -> ValidationResult:
    """Realised regret = (best rival's seed-mean score) - (recommended allocation's score).

    Uses validation runs whose budget is within ``budget_rtol`` of the target budget and
    their last evaluation on the recommendation's target. The best rival is the rival with
    the highest point score; the regret interval is a bootstrap over seeds and problems
    (paired: same problem draws for both). Positive regret: a rival did better; a tie when
    the interval covers 0. ``table`` lists every validated allocation with ``score, lo, hi,
    n_runs, predicted`` (the recommendation's prediction, when it made one).
    """
    rec = recommendation
    finals = final_scores(validation_evals, validation_runs, rec.target, at="last")
    near = np.isclose(finals["budget"].to_numpy(float), rec.target_budget, rtol=budget_rtol, atol=0.0)
    if not near.any():
        raise ValueError(f"no validation runs at the target budget {rec.target_budget:.3g} "
                         f"(budgets: {sorted(finals['budget'].unique())})")
    finals = finals[near].assign(budget=rec.target_budget)
    if rec.allocation not in set(finals["allocation"]):
        raise ValueError(f"the recommended allocation {rec.allocation} has no validation run")
    bs = bootstrap_cells(finals, ["allocation"], n_boot=n_boot, rng=rng)
    table = bs.intervals(rec.level)
    table = table.merge(rec.predictions[["allocation", "score"]].rename(columns={"score": "predicted"}),
                        on="allocation", how="left")
    table = table.sort_values(["score", "allocation"], ascending=[False, True], kind="mergesort").reset_index(drop=True)
    i_rec = bs.index_of(allocation=rec.allocation)
    own = table[table["allocation"] == rec.allocation].iloc[0]
    rivals = table[table["allocation"] != rec.allocation]
    if len(rivals):
        rival = rivals.iloc[0]
        i_riv = bs.index_of(allocation=rival["allocation"])
        d = difference(rival["score"], own["score"], bs.reps[:, i_riv], bs.reps[:, i_rec], rec.level)
        best_rival, rival_score = str(rival["allocation"]), float(rival["score"])
    else:
        d = difference(0.0, 0.0, np.zeros(1), np.zeros(1), rec.level)
        best_rival, rival_score = None, float("nan")
    rank = int(np.flatnonzero(table["allocation"].to_numpy() == rec.allocation)[0]) + 1
    return ValidationResult(
        target=rec.target, target_budget=rec.target_budget, allocation=rec.allocation,
        realised_score=float(own["score"]), realised_lo=float(own["lo"]), realised_hi=float(own["hi"]),
        predicted_score=rec.predicted_score, predicted_lo=rec.predicted_lo, predicted_hi=rec.predicted_hi,
        prediction_covered=bool(rec.predicted_lo <= own["score"] <= rec.predicted_hi),
        best_rival=best_rival, best_rival_score=rival_score, realised_regret=d.diff if best_rival else float("nan"),
        regret_lo=d.lo, regret_hi=d.hi, regret_tie=d.tie, predicted_regret=rec.expected_regret,
        rank=rank, table=table,
    )
