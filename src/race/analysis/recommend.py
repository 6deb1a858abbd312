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
   family chosen on held-out points (constant, straight line or parabola in log FLOPs,
   power law, saturating sigmoid anchored at the measured step-0 score; unidentified fits
   excluded), read at the
   FLOPs a run at the target budget is expected to count (target budget x the pilots'
   median spend share). Allocations that failed the gate are not fitted by the joint model:
   they are forecast by their recent level or their straight line in ln C, weighed on
   held-out points (``UNGATED``), so a late riser whose gain is not yet beyond the noise
   keeps the slope its points show instead of being forecast flat.
5. **Extrapolation error, back-tested** (:mod:`race.analysis.backtest`): rolling-origin
   back-tests inside the study (fit on the smaller budgets, forecast the larger ones) give
   the logit-scale error per unit of log-FLOP reach and of the curve's observed slope,
   shared across allocations and specific to each; every replicate adds it at the
   target's reach. No clipping: scores
   live on the logit scale, so an interval approaches 0 or 1 only as the errors say.
6. **Decision by expected regret, with a default**: the default pick is the observed winner
   at the largest pilot budget (equal counted FLOPs). The candidate is the allocation of
   least expected regret E_r[max_j F_rj - F_rk] (= highest mean forecast). The pick
   switches to it only when the paired lower bound of the gain, the ``switch_alpha``
   quantile of F_r,candidate - F_r,default over the joint replicates, is above 0.
   P(best)_k = share of replicates where k forecasts highest.
7. **Confidence label** (:class:`ConfidenceRules`): ``"no learning detected"``;
   ``"extrapolation too far"`` when target / largest pilot >= ``max_extrapolation``;
   ``"stable regime"`` only when the forecast earned it: >= ``min_seeds_stable`` seeds in
   every cell, the choice passed the gate and wins in >= ``min_win_prob`` (0.9, the label's
   promised accuracy) of the replicates (back-tested error included), the back-test from the
   smaller budgets picked the observed winner at the largest one, the choice's score does
   not fall between the two largest pilot budgets, and its lead held: observed winner at
   both of the two largest pilot budgets, with a paired lower bound of its lead over the
   runner-up at the largest above 0 (:func:`race.analysis.decision.lead_not_held`);
   otherwise ``"unstable"``. ``reasons`` says which rule decided.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import norm

from race.accounting.guard import is_budget

from .backtest import PairRule, logit, open_ends, run_backtest
from .bootstrap import as_rng
from .families import FAMILIES
from .decision import NO_LEARNING, ConfidenceRules, Label, decide, declining, label, lead_not_held
from .gate import learning_gate
from .joint import Replicates, StudyMatrix, draw_replicates, resampled_text, study_matrix
from .forecast import TrendMix, forecasts, spend_share, standings, summarise
from .pilot_reach import pilot_advice
from .tables import ALLOCATION_COLUMNS, allocation_table, jsonable, without_controls

METHODS = {"curve": FAMILIES, "trend": ("loglinear",), "joint": ("joint",)}
#: families of an allocation that did not pass the gate: its recent level or its straight line in
#: ln C, weighed on held-out points (a late riser whose gain is not yet beyond the noise keeps its slope)
UNGATED = ("constant", "loglinear")
__all__ = ["NO_LEARNING", "ConfidenceRules", "Label", "Recommendation", "decide", "declining", "label", "lead_not_held",
           "recommend"]


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
    default_allocation: str | None = None  # the observed winner at the largest pilot budget
    decision: str = ""  # why the pick is the default or a switch
    switch_gain_lo: float = float("nan")  # paired lower bound of the candidate's gain over the default
    open_above: bool = False  # the data do not bound the chosen allocation's score above (backtest.open_ends)
    open_below: bool = False  # ... nor below
    open_reason: str = ""  # why (empty when both ends are bounded by the data)
    backtest: pd.DataFrame | None = field(default=None, repr=False)
    pilot_advice: dict | None = None  # how close the pilots must run for a narrower interval (race.analysis.pilot_reach)
    p_near_best: float = float("nan")  # P(regret <= 0.01): share of joint replicates where the pick is within 0.01 of the best
    calibration: str = ""  # which error scale the intervals use (race.analysis.backtest.BackTest.calibration)
    provenance: str = ""  # where the pick comes from when not this analysis's default (a racing study's: its race)

    @property
    def forecast_made(self) -> bool:
        return self.confidence != NO_LEARNING

    def to_dict(self) -> dict:
        """Plain Python types only (tables as lists of records; replicates left out)."""
        return {k: jsonable(getattr(self, k)) for k in self.__dataclass_fields__ if k != "replicates"}


def candidate_allocations(sm: StudyMatrix, reward_system: str | None) -> list[str]:
    """Allocations that may be recommended: never random-reward controls; one reward system if asked."""
    r = without_controls(sm.runs)
    if reward_system is not None:
        r = r[r["reward_system"] == reward_system]
    return sorted(r["allocation"].unique())


def own_standings(sm: StudyMatrix, reps: Replicates, allocations: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """:func:`race.analysis.forecast.standings` with each allocation read at its own largest budget."""
    names, pts, cols = [], [], []
    for a in allocations:
        b = float(sm.runs.loc[sm.runs["allocation"] == a, "budget"].max())
        n, p, r = standings(sm, reps, [a], b)
        names, pts, cols = names + n, pts + list(p), cols + [r]
    return names, np.array(pts), np.column_stack(cols) if cols else np.empty((reps.n, 0))


def gated_study(evals: pd.DataFrame, runs: pd.DataFrame, target: str, n_boot: int = 200,
                rng: np.random.Generator | int | None = 0, reward_system: str | None = None, alpha: float = 0.05,
                level: float = 0.95) -> tuple[StudyMatrix, list[str], Replicates, pd.DataFrame, np.random.Generator]:
    """Steps 1-3: (study matrix, candidate allocations, joint replicates, learning gate, the
    generator the replicates were drawn from, to draw the rest with)."""
    sm = study_matrix(evals, runs, target)
    allocs = candidate_allocations(sm, reward_system)
    if not allocs:
        raise ValueError(f"no complete non-random runs for target {target!r} and reward system {reward_system!r}")
    gen = as_rng(rng)
    reps = draw_replicates(sm, n_boot, gen)
    return sm, allocs, reps, learning_gate(sm, reps, allocs, alpha=alpha, level=level), gen


def recommend(evals: pd.DataFrame, runs: pd.DataFrame, target: str, target_budget: float, *,
              reward_system: str | None = None, method: str = "joint", n_boot: int = 200,
              rng: np.random.Generator | int | None = 0, level: float = 0.95,
              rules: ConfidenceRules | None = None, pick_from: "Collection[str] | None" = None,
              default: str | None = None) -> Recommendation:
    """Choose an allocation for ``target_budget`` (steps in the module docstring).

    ``method="joint"`` (the default) fits the allocations that passed the gate together
    (:mod:`race.analysis.joint_model`); ``"curve"`` chooses among the curve families per
    allocation, ``"trend"`` forces the straight line in log FLOPs. ``predictions``: one row per candidate, the pick first, then by forecast
    (``score, lo, hi, p_best, expected_regret, observed, open_above, open_below, open_reason, gate_passed, gain,
    family, share_*, bound_*``). ``pick_from``: the allocations the pick may be (a racing study's
    survivors at its last rung); every candidate is still forecast, so P(best), expected regret
    and the intervals are over all of them (an allocation stopped early at its last forecast).
    ``default``: the default pick (step 6) when the caller has one (a racing rung's observed
    leader, read at each allocation's own budget), instead of the observed winner at the largest
    pilot budget.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {method!r}")
    if not is_budget(target_budget):
        raise ValueError(f"target_budget must be a positive number of FLOPs, got {target_budget!r}")
    rules = rules or ConfidenceRules()
    sm, allocs, reps, gate, gen = gated_study(evals, runs, target, n_boot, rng, reward_system, rules.gate_alpha, level)
    gate_checked = bool(np.isfinite(sm.start).any())
    if not gate_checked:  # nothing to compare with: forecast, but never call it stable
        gate = gate.assign(passed=True, reason="not checked: no step-0 evaluations in the study")
    cand = sm.runs[sm.runs["allocation"].isin(allocs)]
    largest = float(cand["budget"].max())
    ratio = float(target_budget / largest)
    obs_names, obs_pts, obs_reps = standings(sm, reps, allocs, largest)
    eligible = [i for i, a in enumerate(obs_names) if pick_from is None or a in pick_from]
    if default is not None:
        if default not in allocs or (pick_from is not None and default not in pick_from):
            raise ValueError(f"default {default!r} is not a candidate allocation{' of pick_from' if pick_from else ''}")
        observed = default
    elif pick_from is not None and not eligible:
        raise ValueError(f"pick_from names no allocation with runs at the largest budget {largest:.3g}: "
                         f"{sorted(pick_from)}; pass default=")
    else:
        observed = obs_names[max(eligible, key=lambda i: obs_pts[i])] if eligible else None
    notes = list(sm.notes)
    min_seeds = int(cand.groupby(["allocation", "budget"]).size().min())
    if min_seeds < 3:
        notes.append("fewer than 3 seeds per cell: seed variance is poorly estimated (2 seeds give 3 distinct "
                     "resamples); use 3 or more")
    forecast_c = float(target_budget * spend_share(sm))
    bt, decision, gain_lo, open_above = None, "", float("nan"), False
    if gate["passed"].any():
        passed = set(gate.loc[gate["passed"], "allocation"])
        families_of = {a: METHODS[method] if a in passed else UNGATED for a in allocs}
        info_df, rep_matrix, bt = forecasts(sm, reps, allocs, families_of, forecast_c, gen,
                                          PairRule(rules.own_pairs, rules.pair_reach),
                                          TrendMix(rules.trend_weight, rules.trend_scale), rules.min_logit_sd)
        pred = summarise(allocs, info_df["point"].to_numpy(), rep_matrix, level, rules.interval)
        pred = pred.merge(info_df.drop(columns=["point", "x_max", "x_min"]), on="allocation")
        obs = dict(zip(obs_names, obs_pts))
        pred["observed"] = [obs.get(a, np.nan) for a in allocs]
        # does the data bound each interval? (backtest.open_ends: not located and still rising, or the
        # back-tested error at this reach spans the scale)
        z = float(norm.ppf(0.5 + level / 2))
        ends = [open_ends(r["score"], r["logit_sd"], z, bool(a in passed and r["unidentified"]),
                          bool(r["score"] > r["observed"]), r["ln_reach"], r["lo"], r["hi"])
                for a, (_, r) in zip(allocs, pred.iterrows())]
        pred["open_above"], pred["open_below"], pred["open_reason"] = ([e[i] for e in ends] for i in range(3))
        default = observed if observed is not None else allocs[int(np.argmax(pred["score"]))]
        sel = [i for i, a in enumerate(allocs) if pick_from is None or a in pick_from]
        chosen, decision, gain_lo = decide(rep_matrix[:, sel], [allocs[i] for i in sel], default, rules.switch_alpha)
        method_used = method
    else:
        if default is not None:  # a racing rung: every allocation at its own largest budget
            obs_names, obs_pts, obs_reps = own_standings(sm, reps, allocs)
        pred = summarise(obs_names, obs_pts, obs_reps, level, rules.interval).assign(family="observed", observed=obs_pts,
                                                                      open_above=False, open_below=False, open_reason="")
        rep_matrix, method_used, forecast_c = obs_reps, "observed", largest
        chosen = observed
    pred = pred.merge(gate[["allocation", "passed", "gain"]].rename(columns={"passed": "gate_passed"}),
                      on="allocation", how="left")
    first = (pred["allocation"] != chosen).to_numpy()
    order = np.lexsort((pred["allocation"].to_numpy(), -pred["score"].to_numpy(), first))
    pred = pred.iloc[order].reset_index(drop=True)
    rep_matrix = rep_matrix[:, order]
    budgets = sorted(float(b) for b in cand["budget"].unique())
    lead = lead_not_held(str(pred.iloc[0]["allocation"]),
                         [standings(sm, reps, allocs, b) for b in budgets[-2:]], rules.lead_alpha)
    confidence, reasons = label(pred, gate, largest, ratio, rules, min_seeds,
                                bt if bt is not None else run_backtest([], [], None, None),
                                declining(sm, str(pred.iloc[0]["allocation"])), lead)
    if decision and confidence != NO_LEARNING:
        reasons.insert(0, decision)
    top = pred.iloc[0]
    open_above = bool(top["open_above"]) and confidence != NO_LEARNING
    open_below = bool(top["open_below"]) and confidence != NO_LEARNING
    open_reason = str(top["open_reason"]) if confidence != NO_LEARNING else ""
    if open_reason:
        reasons.append(f"{top['allocation']}: {open_reason}")
    advice = None
    if bt is not None and confidence != NO_LEARNING:
        advice = pilot_advice(float(logit(top["score"])), float(top["rep_sd"]), float(np.hypot(*bt.pooled())),
                              float(top["factor"]), bt.misfit_reach, target_budget, largest, z=float(norm.ppf(0.5 + level / 2)))
    if not gate_checked:
        reasons.append("learning gate not applied: the study has no step-0 evaluations (record one per run)")
        confidence = Label.UNSTABLE if confidence == Label.STABLE else confidence
    params = allocation_table(runs).set_index("allocation")
    params = params.loc[top["allocation"]] if top["allocation"] in params.index else pd.Series(dtype=object)
    params = {c: jsonable(params[c]) for c in (*ALLOCATION_COLUMNS, "model_params") if c in params.index}
    return Recommendation(
        target=target, target_budget=float(target_budget), condition=reward_system, method=method_used,
        allocation=str(top["allocation"]), allocation_params=params, predicted_score=float(top["score"]),
        predicted_lo=float(top["lo"]), predicted_hi=float(top["hi"]), level=level,
        expected_regret=float(top["expected_regret"]), win_probability=float(top["p_best"]),
        runner_up=str(pred.iloc[1]["allocation"]) if len(pred) > 1 else None, confidence=confidence,
        reasons=reasons, largest_pilot_budget=largest, extrapolation_ratio=ratio, forecast_flops=forecast_c,
        n_boot=int(n_boot), resampled=resampled_text(reps, sm, forecast=method_used != "observed", method=method_used), predictions=pred,
        gate=gate, notes=notes, replicates=rep_matrix, default_allocation=observed, decision=decision,
        switch_gain_lo=gain_lo, open_above=open_above, open_below=open_below, open_reason=open_reason, backtest=bt.table if bt is not None else None,
        pilot_advice=advice, p_near_best=float(top["p_near_best"]),
        calibration=bt.calibration if bt is not None and confidence != NO_LEARNING else "",
    )
