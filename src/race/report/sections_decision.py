"""Report sections that decide: regimes and rank stability, the recommendation, its
validation, and how to read them (the diagnostics that say when to distrust a gain are
:mod:`race.report.sections_diagnostics`'s)."""

from __future__ import annotations

import pandas as pd

from race.analysis import (
    ConfidenceRules,
    Label,
    Recommendation,
    rank_stability,
    realised_regret,
    regime_changes,
)
from race.analysis.pilot_reach import advice_text

from . import figures as F
from .doc import Callout, Context, KeyValues, Note, Section, Table, Text, figure
from .fmt import fmt_flops, fmt_interval, fmt_num, fmt_prob, fmt_score, is_num, jsonable, text_or
from .prefix_note import load_measured, measured_sentence, study_sentence
from .sections_study import target_regimes

TONES = {lab.value: lab.tone for lab in Label}


def interval_note(rec: Recommendation) -> str | None:
    """Why the chosen allocation's interval reaches 0 or 1, when it does (None otherwise)."""
    if not rec.forecast_made:
        return None
    if getattr(rec, "open_reason", ""):  # computed from the data (race.analysis.backtest.open_ends)
        return rec.open_reason
    if rec.open_above:
        return ("no sign of saturation yet: the interval is open above (no curve bends inside the pilots, so the "
                "saturating model cannot place its midpoint; the upper bound is the back-tested extrapolation error, "
                "not a ceiling the data show)")
    if rec.predicted_hi >= 0.995 or rec.predicted_lo <= 0.005:
        return ("the interval reaches the end of the 0-1 scale because the back-tested extrapolation error at this "
                "reach is that large (scores are forecast on the logit scale, so a bound near 0 or 1 is the error "
                "model's, not a clip)")
    return None


def headline(rec: Recommendation) -> str:
    if not rec.forecast_made:
        return (f"No learning detected: no forecast for {fmt_flops(rec.target_budget)}. Observed at the largest "
                f"pilot budget ({fmt_flops(rec.largest_pilot_budget)}), {rec.allocation} leads with {rec.target} "
                f"{fmt_score(rec.predicted_score)} {fmt_interval(rec.predicted_lo, rec.predicted_hi)} "
                f"(win probability {rec.win_probability:.2f}).")
    how = (rec.provenance if getattr(rec, "provenance", "") else
           "the observed winner at the largest pilot budget (the default)" if rec.allocation == rec.default_allocation
           else f"switched from the observed winner {rec.default_allocation} by expected regret")
    text = (f"Run {rec.allocation} at {fmt_flops(rec.target_budget)} ({how}): predicted {rec.target} score "
            f"{fmt_score(rec.predicted_score)} {fmt_interval(rec.predicted_lo, rec.predicted_hi)} "
            f"({rec.level:.0%} interval), expected regret {rec.expected_regret:.3f}, "
            f"win probability {rec.win_probability:.2f}.")
    note = interval_note(rec)
    return text + (f" Note: {note}." if note else "")


def regimes_section(ctx: Context) -> Section:
    sec = Section("regimes", "Regimes and rank stability")
    reg = pd.concat([target_regimes(ctx, t) for t in ctx.targets], ignore_index=True)
    sec.add(Text("At each budget the winning allocation is compared with the runner-up: the axis along which they "
                 "differ (size, search, learning, feedback) is the one that wins there, if the difference is "
                 "beyond the noise (its 95% interval excludes 0); otherwise it is a tie. The win probability is the "
                 "share of bootstrap replicates in which the winner scores highest."),
            figure("regime_heatmap", "Winning axis per budget", lambda: F.regime_heatmap(reg)))
    sec.add(Table(["target", "reward system", "budget", "winner", "win prob.", "vs", "difference [95%]", "verdict",
                   "winning axis"],
                  [[r.target, str(r.condition), fmt_flops(r.budget), r.winner, fmt_prob(r.win_prob),
                    text_or(r.compared_to),
                    f"{fmt_score(r.diff)} {fmt_interval(r.diff_lo, r.diff_hi)}" if is_num(r.diff) else "-",
                    "only one allocation" if text_or(r.compared_to, "") == "" else ("tie" if r.tie else "decisive"),
                    r.detail or "-"] for r in reg.itertuples()]))
    changes = []
    for t in ctx.targets:
        ch = regime_changes(reg[reg["target"] == t], ctx.prepared)
        changes.append(ch.assign(target=t))
    ch = pd.concat(changes, ignore_index=True)
    if len(ch):
        sec.add(Table(["target", "reward system", "from budget", "to budget", "new winner", "changed axes", "decisive"],
                      [[r.target, str(r.condition), fmt_flops(r.from_budget), fmt_flops(r.to_budget), r.to_winner,
                        r.axes or "-", "yes" if r.decisive else "no (within noise)"] for r in ch.itertuples()],
                      "Regime changes (the winner moves between consecutive budgets)"))
    else:
        sec.add(Text("The winner does not change between consecutive budgets."))
    rs = rank_stability(ctx.evals, ctx.runs, ctx.primary)
    if rs.empty:
        sec.add(Note("rank stability needs >= 2 budgets", "warn"))
    else:
        sec.add(Table(["reward system", "budget", "next budget", "Kendall tau", "common allocations",
                       "pairwise decision accuracy vs largest", "pairs"],
                      [[str(r.condition), fmt_flops(r.budget), fmt_flops(r.next_budget), fmt_prob(r.kendall_tau),
                        str(r.n_common), fmt_prob(r.pda_vs_largest), str(r.n_pairs)] for r in rs.itertuples()],
                      f"Rank stability of allocations across budgets ({ctx.primary})"))
        low = rs[rs["kendall_tau"] < 0.5]
        if len(low):
            sec.add(Note(f"rankings still move between budgets (Kendall tau < 0.5 at {len(low)} step(s)): "
                         "small-budget winners may not stay winners", "warn"))
    sec.data = {"regimes": jsonable(reg), "changes": jsonable(ch), "rank_stability": jsonable(rs)}
    return sec


def _gate_table(rec: Recommendation) -> Table:
    rows = []
    for r in rec.gate.itertuples():
        ctl = (f"{fmt_score(r.control_diff)} {fmt_interval(r.control_lo, r.control_hi)}" if is_num(r.control_diff)
               else "no control")
        rows.append([r.allocation, fmt_flops(r.budget), fmt_score(r.start), fmt_score(r.end),
                     f"{fmt_score(r.gain)} {fmt_interval(r.gain_lo, r.gain_hi)}" if is_num(r.gain) else "-", ctl,
                     "yes" if r.passed else f"no: {r.reason}"])
    return Table(["allocation", "largest budget", "step-0 score", "end score (equal FLOPs)", "gain [95%]",
                  "vs random control", "learned"], rows,
                 f"Learning gate: end minus step-0 score on the same problems (paired; seed variance pooled over "
                 f"the cells; passes at t > {rec.gate['threshold_z'].max():.2f} with size-safe Satterthwaite "
                 f"degrees of freedom, family-wise {1 - 0.05:.0%} over {len(rec.gate)} allocations)")


def recommendation_section(ctx: Context) -> Section:
    sec = Section("recommendation", f"Recommendation for {fmt_flops(ctx.target_budget)}")
    rec, notes = ctx.recommendation
    sec.add(Callout("Recommended allocation" if rec.forecast_made else "No recommendation: nothing was learned",
                    [headline(rec)] + [f"- {r}" for r in rec.reasons],
                    label=rec.confidence, tone=TONES.get(rec.confidence, "neutral")))
    for n in notes:
        sec.add(Note(n, "warn"))
    params = [(k, fmt_num(v) if k == "model_params" else str(v)) for k, v in rec.allocation_params.items()]
    model = ("joint model of the allocations that learned (midpoint trend in model and group size, partially "
             "pooled)" if rec.method == "joint" else "curve family per allocation chosen on held-out points")
    how = ("observed standings at the largest pilot budget (no forecast)" if not rec.forecast_made else
           f"{model}, read at {fmt_flops(rec.forecast_flops)} "
           "(target budget x the pilots' median spend share); extrapolation error from rolling-origin back-tests "
           "inside the study; " + ("pick: " + rec.provenance if getattr(rec, "provenance", "") else
                                   "default pick: the observed winner at the largest pilot, switched only when the "
                                   "paired lower bound of the expected-regret gain is above 0"))
    sec.add(KeyValues([("allocation", rec.allocation), *params, ("method", f"{how}; target {rec.target}"),
                       ("extrapolation", f"{rec.extrapolation_ratio:.3g}x the largest pilot budget "
                                         f"{fmt_flops(rec.largest_pilot_budget)}"),
                       *([("narrower interval", advice_text(rec.pilot_advice, fmt_flops))]
                         if getattr(rec, "pilot_advice", None) else []),
                       ("P(regret <= 0.01)", fmt_prob(getattr(rec, "p_near_best", float("nan")))),
                       ("intervals resample", rec.resampled),
                       ("decision", rec.decision or "-"),
                       ("runner-up", str(rec.runner_up or "-"))]))
    sec.add(_gate_table(rec))
    try:
        res = validation_result(ctx)[0]
    except Exception:  # noqa: BLE001 - the validation section reports its own error
        res = None
    realised = res.table if res is not None else None
    title = "Predicted score at the target budget" if rec.forecast_made else "Observed score at the largest pilot"
    sec.add(figure("predictions", title,
                   lambda: F.predictions_figure(rec.predictions, rec.allocation, ctx.labels, realised,
                                                observed=not rec.forecast_made)))
    pred = rec.predictions.head(10)
    fam_cols = [c for c in pred.columns if c.startswith("share_")]

    def basis(r: pd.Series) -> str:
        if not rec.forecast_made:
            return "observed"
        if r.get("family") == "joint":
            text = (f"joint model of the allocations; midpoint located by {r['midpoint']}"
                    if r.get("midpoint") != "not located" else
                    "joint model of the allocations; midpoint not located (no allocation saturates inside the pilots)")
        else:
            shares = ", ".join(f"{c[6:]} {r[c]:.0%}" for c in fam_cols if r[c] >= 0.05)
            bounds = [f"{c[6:]} {r[c]:.0%}" for c in pred.columns if c.startswith("bound_") and r[c] > 0]
            text = f"{r['family']} ({shares})" + (f"; fits at a bound: {', '.join(bounds)}" if bounds else "")
        if not r.get("gate_passed", True):
            text += "; did not pass the gate: forecast by its recent level or its trend"
        why = str(r.get("open_reason") or "")
        if r.get("open_above", False):
            text += ("; no sign of saturation yet: open above" if why.startswith("no sign") else
                     "; open above: the back-tested error at this reach spans the scale")
        if r.get("open_below", False):
            text += "; open below: the back-tested error at this reach spans the scale"
        return text

    sec.add(Table(["allocation", ("predicted" if rec.forecast_made else "observed") + " score [95%]", "P(best)",
                   "expected regret", "learned", "forecast basis (family share of replicates)"],
                  [[r["allocation"], f"{fmt_score(r['score'])} {fmt_interval(r['lo'], r['hi'])}", fmt_prob(r["p_best"]),
                    f"{r['expected_regret']:.3f}", "yes" if r["gate_passed"] else "no", basis(r)]
                   for _, r in pred.iterrows()], "Candidates (best 10)"))
    sec.data = {"recommendation": jsonable(rec.to_dict()), "notes": notes, "headline": headline(rec),
                "gate": jsonable(rec.gate), "resampled": rec.resampled}
    return sec


def validation_result(ctx: Context) -> tuple[object, str | None, list[str]]:
    """(ValidationResult or None, why it is missing, warnings), computed once."""
    if "validation" in ctx.cache:
        return ctx.cache["validation"]
    st = ctx.study
    rec: Recommendation | None = ctx.rec
    entry = st.validation_for(ctx.target_budget, ctx.primary)
    how = (f"run `race validate {st.study_dir or 'STUDY_DIR'} --target-budget {ctx.target_budget:.3g}` to train the "
           "recommendation and its strongest rivals at the target budget and measure the realised regret")
    if st.imported is not None:  # race import: RACE cannot re-run these runs
        how = ("the study was imported (race import), so RACE cannot re-run it: train the recommendation at the "
               "target budget where its runs were trained")
    vruns = st.validation_runs
    warns = []
    if entry is not None and entry.get("status") not in (None, "complete"):
        warns.append(f"the validation recorded for this budget is {entry.get('status')!r}: "
                     f"{entry.get('message') or 'some cells did not finish'}")
    out: tuple[object, str | None, list[str]]
    if vruns.empty and entry is None:
        out = (None, f"not validated yet: {how}", warns)
    elif rec is None:
        out = (None, "there is no recommendation to validate (see the recommendation section)", warns)
    else:
        try:
            res = realised_regret(rec, st.evals_of(vruns), vruns, n_boot=ctx.n_boot, rng=ctx.rng)
            out = (res, None, warns)
        except ValueError as e:
            out = (None, f"{e}; {how}", warns)
    ctx.cache["validation"] = out
    return out


def validation_section(ctx: Context) -> Section:
    sec = Section("validation", "Validation at the target budget")
    res, missing, warns = validation_result(ctx)
    for w in warns:
        sec.add(Note(w, "warn"))
    if res is None:
        sec.missing = missing
        return sec
    verdict = ("a rival did better beyond the noise" if res.realised_regret > 0 and not res.regret_tie
               else "within the noise of the best rival" if res.regret_tie else "the recommendation did best")
    sec.add(Callout("Realised regret", [
        f"{res.allocation} scored {fmt_score(res.realised_score)} {fmt_interval(res.realised_lo, res.realised_hi)} at "
        f"{fmt_flops(res.target_budget)}; predicted {fmt_score(res.predicted_score)} "
        f"{fmt_interval(res.predicted_lo, res.predicted_hi)}. Forecast minus realised "
        f"{fmt_score(res.forecast_error)} {fmt_interval(res.forecast_error_lo, res.forecast_error_hi)} (both noises): "
        f"{'covered' if res.prediction_covered else 'NOT covered'}.",
        f"Best rival: {res.best_rival or '-'} ({fmt_score(res.best_rival_score)}; {res.rival_chosen_on}). Realised "
        f"regret {fmt_score(res.realised_regret)} {fmt_interval(res.regret_lo, res.regret_hi)} vs expected regret "
        f"{res.predicted_regret:.3f}: {verdict}; the recommendation ranked {res.rank} of {len(res.table)}."],
        label="regret " + ("tie" if res.regret_tie else fmt_score(res.realised_regret)),
        tone="good" if res.regret_tie or not is_num(res.realised_regret) or res.realised_regret <= 0 else "bad"))
    for n in res.notes:
        sec.add(Note(n, "warn"))
    sec.add(Table(["allocation", "realised score [95%]", "runs", "predicted"],
                  [[r.allocation, f"{fmt_score(r.score)} {fmt_interval(r.lo, r.hi)}", str(r.n_runs),
                    fmt_score(r.predicted)] for r in res.table.itertuples()], "Validated allocations"))
    sec.data = {"validation": jsonable(res.to_dict())}
    return sec


CURVE_TEXT = ("Curve families (constant, straight line in log FLOPs, saturating sigmoid from the measured step-0 "
              "score) are fitted per allocation by binomial likelihood; fits with a parameter at its bound are "
              "unidentified and never forecast; each replicate draws a family by its held-out skill. ")
JOINT_TEXT = ("Forecasts come from one joint model of the study: every allocation that learned follows a saturating "
              "curve from its measured step-0 score whose midpoint moves with ln(model size) and ln(group size) and "
              "whose asymptote cannot fall as the model grows; each allocation's own departures from that trend are "
              "shrunk toward it (empirical Bayes), so a smaller model's visible midpoint informs a larger model's. "
              "An allocation whose curve bends nowhere inside the pilots is 'open above': its upper bound is what "
              "the back-tested error allows, not a ceiling the data show. ")


def method_section(ctx: Context) -> Section:
    sec = Section("method", "How to read this report")
    rec: Recommendation | None = ctx.rec
    resampled = rec.resampled if rec is not None else "no recommendation was made"
    sec.add(Text("RACE is a diagnostic: it identifies allocation regimes from cheap pilot runs before an expensive "
                 "run; it does not promise held-out improvement. Allocations are compared at equal counted FLOPs "
                 "(each budget's runs read at the smallest FLOPs all of them reached). Score intervals in the "
                 "frontier, regimes and diagnostics are 95% bootstrap intervals over seeds (whole runs) and "
                 "evaluation problems (one problem draw shared by every run: paired), never over checkpoints of one "
                 "run; differences whose interval covers 0 are ties."),
            Text(f"The recommendation's intervals, P(best) and expected regret come from {resampled}. A forecast "
                 "is made only after the learning gate: an allocation learned if its end score minus its step-0 "
                 "score (same problems) exceeds the noise at the family-wise 95% level (and beats the random-reward "
                 f"control where one ran); if none did, the confidence is '{Label.NO_LEARNING}' and the report "
                 "shows observed standings instead of forecasts. Allocations that did not pass are not fitted by the "
                 "model: they are forecast by their recent level or their straight line in ln C, weighed on held-out "
                 "points. "
                 + (JOINT_TEXT if rec is not None and rec.method == "joint" else CURVE_TEXT) +
                 "The extrapolation error is "
                 "measured inside the study by rolling-origin back-tests (fit on the smaller pilot budgets, forecast "
                 "the larger ones), on the logit scale, with one part shared by all allocations and one per "
                 "allocation, scaled to the target's reach (for the joint model the effective reach sqrt(r_m^2 + d^2): a "
                 "forecast at the last pilot still misses by the fitted curve's misfit, so the error does not vanish "
                 "as the pilots near the target; r_m was measured with the pilots at six distances from the target). "
                 "The default pick is the observed winner at the largest "
                 f"pilot budget (equal FLOPs); it is replaced only when the paired lower bound of the forecast "
                 f"gain (its {ConfidenceRules().switch_alpha:.0%} quantile over the joint replicates) "
                 f"is above 0. Labels: '{Label.STABLE}' (3+ seeds, the choice learned, wins in at least "
                 f"{ConfidenceRules().min_win_prob:.0%} of the replicates (the share of such calls the label promises "
                 "to get right), led at both of the two largest pilot budgets beyond the paired noise, and the "
                 "back-test from the smaller budgets picked the observed winner at the largest), "
                 f"'{Label.UNSTABLE}' (one of those fails), '{Label.TOO_FAR}' (the target is 10x the largest pilot "
                 f"budget or more), '{Label.NO_LEARNING}'."),
            *[Text(t) for t in (measured_sentence(load_measured()), study_sentence(ctx.runs)) if t],
            KeyValues([("bootstrap replicates", f"{ctx.n_boot} (scores), {ctx.n_boot_fit} (recommendation)"),
                       ("random seed", str(ctx.rng)), ("FLOPs", "model FLOPs counted in the budget (see each run's "
                                                        "report card for the conventions)")]))
    return sec


__all__ = ["regimes_section", "recommendation_section", "validation_section", "diagnostics_section", "method_section",
           "headline",
           "interval_note"]
