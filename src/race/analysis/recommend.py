"""Recommendation of an allocation for a target budget, as a composition of named steps.

1. **Data** (:func:`race.analysis.joint.study_matrix`): every run's evaluation points with
   per-problem outcomes, its step-0 score and its score at equal counted FLOPs.
2. **Joint replicates** (:func:`race.analysis.joint.draw_replicates`): one set of problem
   weights per replicate shared by every allocation, seeds resampled per (allocation,
   budget). Everything below is computed on the same replicates, so P(best), expected
   regret, intervals and the learning gate agree with each other.
3. **Learning gate** (:mod:`race.analysis.gate`): an allocation whose gain over its step-0
   score (and over the random-reward control, when there is one) is not beyond the noise is
   forecast as flat (its recent level). If no allocation passes, the recommendation makes
   no forecast at all: confidence ``"no learning detected"``, the observed standings at the
   largest pilot budget, and what to change.
4. **Forecast** (:mod:`race.analysis.families`): per allocation and replicate, the curve
   family chosen on held-out points (constant, straight line in log FLOPs, power law,
   saturating sigmoid anchored at the measured step-0 score; unidentified fits excluded),
   read at the FLOPs a run at the target budget is expected to count (target budget x the
   pilots' median spend share).
5. **Summary**: chosen = argmax of the point forecasts; interval = replicate percentiles;
   P(best)_k = share of replicates where k forecasts highest; expected regret_k =
   mean_r (max_j F[r, j] - F[r, k]).
6. **Confidence label** (:class:`ConfidenceRules`): ``"no learning detected"``;
   ``"extrapolation too far"`` when target / largest pilot >= ``max_extrapolation``;
   ``"unstable"`` when P(best) < ``min_win_prob``, the choice is not the observed winner at
   the largest pilot (equal FLOPs), Kendall's tau between the two largest budgets is below
   ``min_tau``, the choice did not pass the gate, or its score falls between the two
   largest pilot budgets; otherwise ``"stable regime"``. ``reasons`` says which rule decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from .bootstrap import as_rng, win_probabilities
from .families import FAMILIES, select_and_forecast
from .gate import learning_gate, what_to_change
from .joint import Replicates, StudyMatrix, draw_replicates, study_matrix
from .tables import ALLOCATION_COLUMNS, allocation_table, without_controls

METHODS = {"curve": FAMILIES, "trend": ("loglinear",)}
NO_LEARNING = "no learning detected"


def _jsonable(v: object) -> object:
    if isinstance(v, pd.DataFrame):
        return [{k: _jsonable(x) for k, x in row.items()} for row in v.to_dict(orient="records")]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None  # JSON has no NaN: a missing value
    return v


@dataclass(frozen=True)
class ConfidenceRules:
    """Thresholds of the confidence label (module docstring, step 6) and of the gate."""

    max_extrapolation: float = 10.0
    min_win_prob: float = 0.8
    min_tau: float = 0.5
    gate_alpha: float = 0.05


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
    forecast_flops: float
    n_boot: int
    resampled: str
    predictions: pd.DataFrame = field(repr=False)
    gate: pd.DataFrame = field(repr=False)
    notes: list[str] = field(default_factory=list)
    replicates: np.ndarray | None = field(default=None, repr=False)  # (R, k) forecasts, predictions' order

    @property
    def forecast_made(self) -> bool:
        return self.confidence != NO_LEARNING

    def to_dict(self) -> dict:
        """Plain Python types only (tables as lists of records; replicates left out)."""
        return {k: _jsonable(getattr(self, k)) for k in self.__dataclass_fields__ if k != "replicates"}


def candidate_allocations(sm: StudyMatrix, reward_system: str | None) -> list[str]:
    """Allocations that may be recommended: never random-reward controls; one reward system if asked."""
    r = without_controls(sm.runs)
    if reward_system is not None:
        r = r[r["reward_system"] == reward_system]
    return sorted(r["allocation"].unique())


def spend_share(sm: StudyMatrix) -> float:
    """Median over runs of (FLOPs at the equal-FLOP reading) / budget."""
    share = sm.runs["end_flops"].to_numpy(float) / sm.runs["budget"].to_numpy(float)
    return float(np.clip(np.median(share), 1e-6, 1.0))


def forecast_allocation(sm: StudyMatrix, reps: Replicates, allocation: str, x_target: float,
                        families: tuple[str, ...], rng: np.random.Generator | int | None = 0,
                        ) -> tuple[float, np.ndarray, dict]:
    """(point forecast, replicate forecasts (R,), info) of one allocation; ``info["family"]``
    is the family with the largest weight in the point fit."""
    idx = sm.runs.index[sm.runs["allocation"] == allocation].to_numpy()
    mask = sm.points["run"].isin(idx).to_numpy()
    pts = sm.points[mask]
    x, y, n = np.log(pts["flops"].to_numpy(float)), pts["score"].to_numpy(float), pts["n"].to_numpy(float)
    y_reps = reps.scores(sm.point_pp[mask] if sm.point_pp is not None else None, y)
    w_reps = n[None, :] * reps.counts[:, pts["run"].to_numpy(int)]
    start_reps = reps.scores(sm.start_pp[idx] if sm.start_pp is not None else None, sm.start[idx])
    r0 = float(np.nanmean(sm.start[idx])) if np.isfinite(sm.start[idx]).any() else np.nan
    c = reps.counts[:, idx]
    r0_reps = np.nansum(c * start_reps, axis=1) / np.maximum(np.sum(c * np.isfinite(start_reps), axis=1), 1e-300)
    if not np.isfinite(r0):  # no step-0 evaluation: anchor at the lowest-FLOP points
        low = x <= x.min() + 1e-9
        r0 = float(np.average(y[low], weights=n[low]))
        r0_reps = (w_reps[:, low] * y_reps[:, low]).sum(axis=1) / w_reps[:, low].sum(axis=1)
    if len(x) == 0:
        raise ValueError(f"allocation {allocation} has no evaluation point after step 0")
    point = select_and_forecast(x, y[None, :], n[None, :], np.array([r0]), x_target, families)
    rep = select_and_forecast(x, y_reps, w_reps, np.clip(r0_reps, 0.0, 1.0), x_target, families, rng=rng)
    fam = point.families[int(point.family[0])]
    info = {"family": fam, "holdout": point.selected_by_holdout, "r0": r0,
            **{f"share_{f}": rep.share(f) for f in families}, **{f"bound_{f}": v for f, v in rep.bound_hits.items()}}
    return float(point.forecast[0]), rep.forecast, info


def standings(sm: StudyMatrix, reps: Replicates, allocations: list[str], budget: float) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Observed seed-mean scores at equal FLOPs at ``budget``: (allocations present, points, (R, k) replicates)."""
    end_reps = reps.scores(sm.end_pp, sm.end)
    names, pts, cols = [], [], []
    for a in allocations:
        idx = sm.runs.index[(sm.runs["allocation"] == a) & np.isclose(sm.runs["budget"].to_numpy(float), budget)]
        if len(idx):
            names.append(a)
            pts.append(float(np.mean(sm.end[idx])))
            cols.append(reps.cell_mean(end_reps, idx.to_numpy()))
    return names, np.array(pts), np.column_stack(cols) if cols else np.empty((reps.n, 0))


def summarise(allocations: list[str], points: np.ndarray, reps: np.ndarray, level: float) -> pd.DataFrame:
    """Predictions table: score, lo, hi, p_best, expected_regret (step 5), sorted best first."""
    q = (1 - level) / 2
    pred = pd.DataFrame({"allocation": allocations, "score": points,
                         "lo": np.quantile(reps, q, axis=0), "hi": np.quantile(reps, 1 - q, axis=0),
                         "p_best": win_probabilities(reps),
                         "expected_regret": (reps.max(axis=1, keepdims=True) - reps).mean(axis=0)})
    return pred


def _tau_last_two(sm: StudyMatrix, allocations: list[str]) -> tuple[float, float | None]:
    runs = sm.runs.assign(end=sm.end)
    runs = runs[runs["allocation"].isin(allocations)]
    budgets = sorted(runs["budget"].unique())
    if len(budgets) < 2:
        return float("nan"), None
    a = runs[runs["budget"] == budgets[-2]].groupby("allocation")["end"].mean()
    b = runs[runs["budget"] == budgets[-1]].groupby("allocation")["end"].mean()
    common = sorted(set(a.index) & set(b.index))
    if len(common) < 2:
        return float("nan"), budgets[-2]
    return float(kendalltau(a[common], b[common]).statistic), budgets[-2]


def declining(sm: StudyMatrix, allocation: str) -> tuple[float, float] | None:
    """(previous, largest) equal-FLOP seed-mean scores of ``allocation`` when the score at its
    largest pilot budget is below the one at the budget before (a rise-then-decline sign)."""
    r = sm.runs.assign(end=sm.end)
    by_budget = r[r["allocation"] == allocation].groupby("budget")["end"].mean().sort_index()
    if len(by_budget) >= 2 and by_budget.iloc[-1] < by_budget.iloc[-2]:
        return float(by_budget.iloc[-2]), float(by_budget.iloc[-1])
    return None


def label(pred: pd.DataFrame, gate: pd.DataFrame, observed: str | None, largest: float, ratio: float,
          tau: tuple[float, float | None], rules: ConfidenceRules,
          decline: tuple[float, float] | None = None) -> tuple[str, list[str]]:
    """The confidence label and its reasons (module docstring, step 6)."""
    top = pred.iloc[0]
    if not gate["passed"].any():
        why = (f"no allocation's gain over its step-0 score is beyond the noise at the largest pilot budgets "
               f"(family-wise {1 - rules.gate_alpha:.0%}; best gain {gate['gain'].max():+.3f}); the standings "
               f"below are observed at {largest:.3g} FLOPs, not forecast. To see learning: {what_to_change(gate)}")
        return NO_LEARNING, [why]
    far, unstable = [], []
    if ratio >= rules.max_extrapolation:
        far.append(f"target budget is {ratio:.1f}x the largest pilot budget {largest:.3g} "
                   f"(limit: below {rules.max_extrapolation:g}x)")
    if top["p_best"] < rules.min_win_prob:
        unstable.append(f"win probability {top['p_best']:.2f} is below {rules.min_win_prob:g}")
    if observed is not None and observed != top["allocation"]:
        unstable.append(f"the observed winner at the largest pilot budget {largest:.3g} is {observed}, "
                        "not the chosen allocation")
    t, prev = tau
    if np.isfinite(t) and t < rules.min_tau:
        unstable.append(f"Kendall tau between budgets {prev:.3g} and {largest:.3g} is {t:.2f} "
                        f"(below {rules.min_tau:g}): rankings are still moving")
    if decline is not None:
        unstable.append(f"the chosen allocation's score falls from {decline[0]:.3f} to {decline[1]:.3f} between the "
                        "two largest pilot budgets (over-optimisation or noise): a rising forecast is suspect")
    if not bool(gate.loc[gate["allocation"] == top["allocation"], "passed"].any()):
        unstable.append("the chosen allocation itself did not pass the learning gate (forecast flat)")
    if far:
        return "extrapolation too far", far + unstable
    if unstable:
        return "unstable", unstable
    return "stable regime", [f"chosen allocation learned (gate passed), wins in {top['p_best']:.0%} of joint "
                             f"replicates, leads at the largest pilot budget, rankings agree across the two "
                             f"largest budgets (tau {t:.2f})"]


def resampled_text(reps: Replicates, sm: StudyMatrix, forecast: bool = True) -> str:
    """Exactly what the intervals resample (for the report's method section)."""
    parts = []
    if "seeds" in reps.over:
        parts.append("seeds (whole runs) within each (allocation, budget), with the sqrt(m/(m-1)) small-sample "
                     "correction")
    if reps.weights is not None:
        parts.append(f"evaluation problems ({sm.n_problems} per evaluation; one draw per replicate shared by every "
                     "allocation, budget and evaluation point: paired)")
    else:
        parts.append("NOT evaluation problems (per-problem outcomes missing)")
    text = f"{reps.n} joint bootstrap replicates over " + " and ".join(parts)
    if forecast:
        text += ("; each replicate draws a curve family by its held-out skill, refits every allocation and adds "
                 "that family's held-out extrapolation error")
    return text


def recommend(evals: pd.DataFrame, runs: pd.DataFrame, target: str, target_budget: float, *,
              reward_system: str | None = None, method: str = "curve", n_boot: int = 200,
              rng: np.random.Generator | int | None = 0, level: float = 0.95,
              rules: ConfidenceRules | None = None) -> Recommendation:
    """Choose an allocation for ``target_budget`` (steps in the module docstring).

    ``method="curve"`` chooses among every family, ``"trend"`` forces the straight line in
    log FLOPs. ``predictions``: one row per candidate, best first (``score, lo, hi, p_best,
    expected_regret, gate_passed, gain, family, share_*, bound_*``).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {method!r}")
    if not (np.isfinite(target_budget) and target_budget > 0):
        raise ValueError(f"target_budget must be a positive number of FLOPs, got {target_budget!r}")
    rules = rules or ConfidenceRules()
    sm = study_matrix(evals, runs, target)
    allocs = candidate_allocations(sm, reward_system)
    if not allocs:
        raise ValueError(f"no complete non-random runs for target {target!r} and reward system {reward_system!r}")
    gen = as_rng(rng)
    reps = draw_replicates(sm, n_boot, gen)
    gate = learning_gate(sm, reps, allocs, alpha=rules.gate_alpha, level=level)
    gate_checked = bool(np.isfinite(sm.start).any())
    if not gate_checked:  # nothing to compare with: forecast, but never call it stable
        gate = gate.assign(passed=True, reason="not checked: no step-0 evaluations in the study")
    cand = sm.runs[sm.runs["allocation"].isin(allocs)]
    largest = float(cand["budget"].max())
    ratio = float(target_budget / largest)
    obs_names, obs_pts, obs_reps = standings(sm, reps, allocs, largest)
    observed = obs_names[int(np.argmax(obs_pts))] if obs_names else None
    notes = list(sm.notes)
    if cand.groupby(["allocation", "budget"]).size().min() < 3:
        notes.append("fewer than 3 seeds per cell: seed variance is poorly estimated (2 seeds give 3 distinct "
                     "resamples); use 3 or more")
    forecast_c = float(target_budget * spend_share(sm))
    if gate["passed"].any():
        passed = set(gate.loc[gate["passed"], "allocation"])
        rows, cols = [], []
        for a in allocs:
            fams = METHODS[method]
            p, r, info = forecast_allocation(sm, reps, a, float(np.log(forecast_c)), fams, rng=gen)
            rows.append({"allocation": a, "point": p, "forecast": a in passed, **info})
            cols.append(r)
        info_df = pd.DataFrame(rows)
        pred = summarise(allocs, info_df["point"].to_numpy(), np.column_stack(cols), level)
        pred = pred.merge(info_df.drop(columns="point"), on="allocation")
        rep_matrix = np.column_stack(cols)
        method_used = method
    else:
        pred = summarise(obs_names, obs_pts, obs_reps, level).assign(family="observed")
        rep_matrix, method_used, forecast_c = obs_reps, "observed", largest
    pred = pred.merge(gate[["allocation", "passed", "gain"]].rename(columns={"passed": "gate_passed"}),
                      on="allocation", how="left")
    order = np.lexsort((pred["allocation"].to_numpy(), -pred["score"].to_numpy()))
    pred = pred.iloc[order].reset_index(drop=True)
    rep_matrix = rep_matrix[:, order]
    confidence, reasons = label(pred, gate, observed, largest, ratio, _tau_last_two(sm, allocs), rules,
                                declining(sm, str(pred.iloc[0]["allocation"])))
    if not gate_checked:
        reasons.append("learning gate not applied: the study has no step-0 evaluations (record one per run)")
        confidence = "unstable" if confidence == "stable regime" else confidence
    top = pred.iloc[0]
    params = allocation_table(runs).set_index("allocation")
    params = params.loc[top["allocation"]] if top["allocation"] in params.index else pd.Series(dtype=object)
    params = {c: _jsonable(params[c]) for c in (*ALLOCATION_COLUMNS, "model_params") if c in params.index}
    return Recommendation(
        target=target, target_budget=float(target_budget), condition=reward_system, method=method_used,
        allocation=str(top["allocation"]), allocation_params=params, predicted_score=float(top["score"]),
        predicted_lo=float(top["lo"]), predicted_hi=float(top["hi"]), level=level,
        expected_regret=float(top["expected_regret"]), win_probability=float(top["p_best"]),
        runner_up=str(pred.iloc[1]["allocation"]) if len(pred) > 1 else None, confidence=confidence,
        reasons=reasons, largest_pilot_budget=largest, extrapolation_ratio=ratio, forecast_flops=forecast_c,
        n_boot=int(n_boot), resampled=resampled_text(reps, sm, forecast=method_used != "observed"), predictions=pred, gate=gate, notes=notes,
        replicates=rep_matrix,
    )
