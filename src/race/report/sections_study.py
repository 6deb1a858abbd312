"""Report sections that describe the study: summary, compute report card, frontier,
compute split, isoFLOP profiles, learning curves, FLOPs vs seconds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from race.accounting import SPLIT, SPLIT_COLUMNS
from race.accounting.report_card import ReportCard
from race.analysis.tables import is_control
from race.analysis import (
    allocation_of,
    final_scores,
    frontier_envelope,
    isoflop_table,
    learning_curves,
    optimal_size_trend,
    regimes,
    waste_table,
)

from . import figures as F
from .doc import Context, KeyValues, Note, Section, Table, Text, figure, finished, is_prefix, spent
from .fmt import fmt_flops, fmt_interval, fmt_num, fmt_pct, fmt_score, is_num, jsonable, text_or


def _first_line(text: object, limit: int = 160) -> str:
    s = str(text or "").strip().splitlines()
    line = s[-1] if s else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def summary_section(ctx: Context) -> Section:
    st = ctx.study
    runs = ctx.runs
    sec = Section("summary", "Study")
    counts = runs["status"].astype(str).value_counts().to_dict()
    p = ctx.prepared
    sizes = p.drop_duplicates("model").sort_values("model_params")
    rows = [
        ("Study", st.name),
        ("Source", st.source),
        ("Pilot runs", ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))),
        ("Budgets (FLOPs)", ", ".join(fmt_flops(b) for b in sorted(p["budget"].unique()))),
        ("Allocations", str(p["allocation"].nunique())),
        ("Model sizes", ", ".join(f"{m} ({fmt_num(n)} params)" for m, n in zip(sizes["model"], sizes["model_params"]))),
        ("Seeds", ", ".join(str(s) for s in sorted(p["seed"].unique()))),
        ("Rewards", ", ".join(sorted(p["reward"].astype(str).unique()))),
        ("Evaluation targets", ", ".join(ctx.targets)),
        ("Target budget", f"{fmt_flops(ctx.target_budget)} ({ctx.target_budget / p['budget'].max():.3g}x the largest "
                          "pilot budget)"),
    ]
    if len(st.validation_runs):
        vc = st.validation_runs["status"].astype(str).value_counts().to_dict()
        rows.append(("Validation runs", ", ".join(f"{n} {s}" for s, n in sorted(vc.items()))))
    sec.add(KeyValues(rows))
    bad = runs[~runs["status"].astype(str).isin(["complete"])]
    if len(bad):
        sec.add(Note(f"{len(bad)} pilot cell(s) are not complete; the analysis uses the {len(p)} complete runs.", "warn"))
        err = bad["error"] if "error" in bad.columns else pd.Series([""] * len(bad), index=bad.index)
        label = allocation_of(bad)
        sec.add(Table(["run", "allocation", "budget", "seed", "status", "error"],
                      [[str(r), str(lab), fmt_flops(b), str(s), str(stt), _first_line(e)]
                       for r, lab, b, s, stt, e in zip(bad["run_id"], label, bad["budget"], bad["seed"],
                                                        bad["status"], err)], "Runs left out"))
    for n in st.notes + ctx.notes:
        sec.add(Note(n))
    sec.data = {"study": st.name, "source": st.source, "status_counts": counts, "budgets": sorted(p["budget"].unique()),
                "n_allocations": int(p["allocation"].nunique()), "targets": ctx.targets,
                "target_budget": ctx.target_budget}
    return sec


def study_card(ctx: Context) -> ReportCard:
    """The study's compute report card (every finished run summed; RM training as its own
    line), built once per report whichever caller asks first: the card section and the
    report's ``report_card.{json,md,tex}``."""
    return ctx.cached("study_card", lambda: _build_study_card(ctx))


def _build_study_card(ctx: Context) -> ReportCard:
    from .latex import conventions_text
    from .sections_feedback import rm_training

    st = ctx.study
    done = spent(st.runs)
    tot = float(done["total_flops"].sum())
    # each axis under its first phase (rollout, update, reward), as the report card keys them
    parts = {SPLIT[a][0]: float(done[c].fillna(0).sum()) for a, c in SPLIT_COLUMNS.items()}
    seconds = {}
    if st.ledger is not None and "seconds" in st.ledger.columns:
        led = st.ledger[st.ledger["run_id"].isin(set(done["run_id"])) & st.ledger["counted"].astype(bool)]
        seconds = {str(k): float(v) for k, v in led.groupby("phase")["seconds"].sum().items()}
    rms = rm_training(ctx)
    return ReportCard(total_flops=int(round(tot)), phase_flops={k: int(round(v)) for k, v in parts.items()},
                      budget_flops=float(done["budget"].sum()), seconds=seconds,
                      model=", ".join(dict.fromkeys(done.sort_values("model_params")["model"].astype(str))),
                      steps=int(done["steps"].fillna(0).sum()) if "steps" in done.columns else 0,
                      lora_rank=int(done["lora_r"].iloc[0]) if "lora_r" in done.columns and done["lora_r"].notna().all()
                      and done["lora_r"].nunique() == 1 else None,
                      extra={"runs": len(done), "wall_s": float(done["wall_s"].fillna(0).sum()), "study": st.name},
                      rm_training_flops=rms, count_rm_training=ctx.count_rm_training, scope="study",
                      conventions_text=conventions_text(done) + ("; reward-model training as each RM's info.json "
                                                                 "records it" if rms else ""))


def card_section(ctx: Context) -> Section:
    st = ctx.study
    sec = Section("card", "Compute report card")
    done = spent(st.runs)
    n_prefix = int(is_prefix(finished(st.runs)).sum())
    tot = float(done["total_flops"].sum())
    card = study_card(ctx)
    rms = card.rm_training_flops
    split, shares = card.split, card.shares
    counted = card.counted_flops
    other = tot - sum(split.values())
    rm_counted = ctx.count_rm_training and bool(rms)
    rows = [["Total FLOPs (model, counted)" + (" incl. RM training" if rm_counted else ""), fmt_flops(counted), "100%"]]
    names = {"search": "search (rollout)", "learning": "learning (update + log-probs)", "feedback": "feedback (reward)"}
    rows += [[f"  {names[k]}", fmt_flops(v), fmt_pct(shares[k])] for k, v in split.items()]
    if abs(other) > 0.005 * max(tot, 1.0):
        rows.append(["  other / unattributed", fmt_flops(other), fmt_pct(other / counted if counted else np.nan)])
    if rms:
        each = ", ".join(f"{n} {fmt_flops(v)}" for n, v in sorted(rms.items()))
        rows.append(["  RM training (counted, as asked)" if rm_counted else
                     "RM training: separate, NOT counted in the total or the budget",
                     f"{fmt_flops(card.rm_training_total)} ({each})",
                     fmt_pct(shares["rm_training"]) if rm_counted else "-"])
    sec.add(Text(f"All {len(done)} finished runs of the study together spent {fmt_flops(tot)} "
                 f"({fmt_pct(tot / card.budget_flops if card.budget_flops else np.nan)} of their budgets) in "
                 f"{done['wall_s'].fillna(0).sum():,.0f} wall seconds."
                 + (f" The study's other {n_prefix} runs are prefixes of these (nested pilots: each read where a "
                    "run of a smaller budget would stop), counted once, inside the runs they were read from."
                    if n_prefix else "")
                 + (f" With the reward models' training counted (as asked), the study counts {fmt_flops(counted)} "
                    f"({fmt_pct(counted / card.budget_flops if card.budget_flops else np.nan)} of the budgets)."
                    if rm_counted else "")),
            Table(["item", "FLOPs", "share"], rows, "Split by axis (sum over runs)"))
    by_model = done.groupby("model", sort=False).agg(params=("model_params", "first"), runs=("run_id", "size"),
                                                     flops=("total_flops", "sum")).reset_index()
    by_model = by_model.sort_values("params")
    sec.add(Table(["model size", "parameters", "runs", "FLOPs", "share"],
                  [[str(m), fmt_num(n), str(r), fmt_flops(f), fmt_pct(f / tot if tot else np.nan)]
                   for m, n, r, f in by_model.itertuples(index=False)], "Split by model size"))
    if len(st.validation_runs):
        sec.add(_validation_text(st, done, tot))
    if st.ledger is not None:
        sec.add(_ledger_table(st.ledger, done))
    sec.data = {"report_card": jsonable(card.to_dict()), "by_model": jsonable(by_model), "total_flops": tot,
                "counted_flops": counted}
    return sec


def _validation_text(st: Any, done: pd.DataFrame, tot: float) -> Text:
    """The pilots' and the validation runs' FLOPs apart: a target run that continued a pilot
    counts only what it ran beyond it (the pilot's share of it named)."""
    fin = finished(st.runs)  # what each run executed itself: a target run that continued a pilot holds its FLOPs
    own = fin["own_flops"] if "own_flops" in fin.columns else fin["total_flops"].where(~is_prefix(fin), 0.0)
    val = float(own[fin["run_id"].isin(st.validation_ids)].sum())
    reused = float(done.loc[done["run_id"].isin(st.validation_ids), "total_flops"].sum()) - val
    shares = sorted(1 - o / t for o, t in zip(own[fin["run_id"].isin(st.validation_ids)],
                                              fin.loc[fin["run_id"].isin(st.validation_ids), "total_flops"])
                    if t and o < t)
    share = (fmt_pct(shares[0]) if len(shares) == 1 else f"{fmt_pct(shares[0])}-{fmt_pct(shares[-1])}"
             if shares else "")
    return Text(f"Pilot grid: {fmt_flops(tot - val)}; validation runs: {fmt_flops(val)}"
                + (f" beyond the {fmt_flops(reused)} of pilots they continued (counted once, as pilots: the "
                   f"continued pilot was {share} of its target run)." if reused > 0.005 * max(tot, 1.0)
                   else "."))


def _ledger_table(ledger: pd.DataFrame, done: pd.DataFrame) -> Table:
    """FLOPs and seconds per ledger phase of the finished runs, counted ones first."""
    led = ledger[ledger["run_id"].isin(set(done["run_id"]))]
    g = led.groupby(["phase", "counted"]).agg(flops=("flops", "sum"), seconds=("seconds", "sum")).reset_index()
    g = g.sort_values(["counted", "flops"], ascending=[False, False])
    return Table(["phase", "counted in budget", "FLOPs", "seconds"],
                 [[str(p), "yes" if c else "no (recorded only)", fmt_flops(f), f"{s:,.1f}" if is_num(s) else "n/a"]
                  for p, c, f, s in g.itertuples(index=False)], "Per phase, from the ledger")


def target_regimes(ctx: Context, target: str) -> pd.DataFrame:
    return ctx.cached(f"regimes:{target}", lambda: regimes(ctx.evals, ctx.runs, target, n_boot=ctx.n_boot,
                                                           rng=ctx.rng).assign(target=target))


def frontier_section(ctx: Context) -> Section:
    sec = Section("frontier", "Allocation frontier")
    winners, envs, ctls = [], [], []
    for t in ctx.targets:
        winners.append(target_regimes(ctx, t))
        env = frontier_envelope(ctx.evals, ctx.runs, t, n_grid=25)
        envs.append(env.rename(columns={"reward_system": "condition"}).assign(target=t))
        fin = final_scores(ctx.evals, ctx.runs, t, at="equal")
        rnd = fin[is_control(fin)]  # random-reward controls (race.analysis.tables.is_control)
        if len(rnd):
            ctls.append(rnd.groupby("budget", as_index=False)["score"].mean().assign(target=t))
    w = pd.concat(winners, ignore_index=True)
    env = pd.concat(envs, ignore_index=True) if envs else None
    ctl = pd.concat(ctls, ignore_index=True) if ctls else None
    sec.add(Text("Best allocation at each pilot budget, per reward system and evaluation target (points: seed-mean "
                 "score of the winner, bars: 95% bootstrap interval over seeds and problems; dashed: the best "
                 "score any allocation had reached by that much training compute)."),
            figure("frontier", "Frontier: best score vs FLOP budget", lambda: F.frontier_figure(w, env, ctl)))
    if w["budget"].nunique() < 2:
        sec.add(Note("only one budget: the frontier is a single point per condition; a pilot grid needs budgets "
                     "spanning >= 10x", "warn"))
    sec.add(Table(["target", "reward system", "budget", "best allocation", "score [95%]", "runner-up", "its score"],
                  [[r.target, str(r.condition), fmt_flops(r.budget), r.winner,
                    f"{fmt_score(r.score)} {fmt_interval(r.lo, r.hi)}", text_or(r.compared_to),
                    fmt_score(r.compared_score)] for r in w.itertuples()]))
    sec.data = {"winners": jsonable(w), "random_controls": jsonable(ctl) if ctl is not None else []}
    return sec


def split_section(ctx: Context) -> Section:
    sec = Section("split", "Compute split per allocation")
    cols = ["rollout_flops", "learning_flops", "feedback_flops", "total_flops"]
    if ctx.prepared[cols].isna().all().any():
        sec.missing = "the runs table has no per-phase FLOPs (rollout_flops, learning_flops, feedback_flops)"
        return sec
    runs = ctx.runs.copy()
    for c in ("zero_var_frac", "trunc_rate"):
        runs[c] = runs[c].astype(float)
    wt = waste_table(runs, by=("allocation",))
    sec.add(Text("Share of each run's FLOPs in rollout/search, learning (policy update and log-prob passes) and "
                 "feedback (reward), averaged over the allocation's runs. The hatched part of rollout is spent on "
                 "groups whose rewards were all equal: zero advantage, so they teach nothing."),
            figure("compute_split", "Compute split per allocation", lambda: F.compute_split_figure(wt, ctx.labels)),
            Table(["allocation", "runs", "rollout", "of which wasted", "learning", "feedback"],
                  [[r.allocation, str(r.n_runs), fmt_pct(r.rollout_share), fmt_pct(r.wasted_share),
                    fmt_pct(r.learning_share), fmt_pct(r.feedback_share)] for r in wt.itertuples()]))
    sec.data = {"split": jsonable(wt)}
    return sec


def isoflop_section(ctx: Context) -> Section:
    sec = Section("isoflop", f"IsoFLOP profiles ({ctx.primary})")
    n_sizes = int(ctx.prepared["model_params"].nunique())
    table = isoflop_table(ctx.evals, ctx.runs, ctx.primary, n_boot=ctx.n_boot, rng=ctx.rng)
    sec.data = {"table": jsonable(table)}
    if table.empty or table["n_sizes"].max() < 3:
        sec.missing = (f"needs >= 3 model sizes at one budget (the study has {n_sizes}): add sizes to the grid's "
                       "model axis to locate the best size per budget")
        return sec
    sec.add(Text("Best score at each model size for a fixed budget; a parabola in ln(parameters) is fitted at each "
                 "budget with >= 3 sizes, its vertex (star) is the best size, with a 95% interval from a bootstrap over "
                 "seeds and problems plus the parabola's own misfit (residuals, with 4 or more sizes). Three sizes "
                 "give a parabola through three points: the optimum is then only bracketed, not located."),
            figure("isoflop", "IsoFLOP profiles", lambda: F.isoflop_figure(table)))
    rows = []
    for r in table.itertuples():
        interior = is_num(r.opt_params)
        bracketed = interior and getattr(r, "located", None) is False
        ci = (f"[{fmt_num(r.ci_low)}, {fmt_num(r.ci_high)}]" if interior and is_num(r.ci_low) and is_num(r.ci_high)
              else "-")
        best = ("-" if not interior else
                f"bracketed between {fmt_num(r.ci_low)} and {fmt_num(r.ci_high)}, not located"
                if bracketed and is_num(r.ci_low) else
                "not located (3 sizes)" if getattr(r, "located", None) is False else fmt_num(r.opt_params))
        rows.append([fmt_flops(r.budget), str(r.condition), str(r.n_sizes), best, "-" if bracketed else ci,
                     fmt_score(r.opt_score) if interior and is_num(r.opt_score) else "-"])
        if r.warnings and r.n_sizes >= 3:
            sec.add(Note(f"budget {fmt_flops(r.budget)} ({r.condition}): {r.warnings}", "warn"))
    few = table[table["n_sizes"] < 3]
    for cond, g in few.groupby(few["condition"].fillna("all"), sort=True):
        sec.add(Note(f"{cond}: only {int(g['n_sizes'].max())} model size(s) at {len(g)} budget(s): no parabola "
                     "(needs >= 3 sizes)"))
    sec.add(Table(["budget", "reward system", "sizes", "best size N*", "95% interval", "score at N*"], rows))
    trends = {}
    for cond, g in table.groupby(table["condition"].fillna("all")):
        inside = g[~g["warnings"].str.contains("outside the grid", regex=False)]  # only optima the grid brackets
        tr = optimal_size_trend(inside)
        trends[cond] = tr
        if tr["n_budgets"] >= 2:
            sec.add(Text(f"{cond}: the best size grows as N* ~ C^{tr['exponent']:.2f} over the {tr['n_budgets']} "
                         "budgets whose optimum lies inside the grid."))
    sec.data["size_trend"] = jsonable(trends)
    return sec


def curves_section(ctx: Context) -> Section:
    sec = Section("curves", f"Learning curves ({ctx.primary})")
    curves = learning_curves(ctx.evals, ctx.runs, target=ctx.primary)
    sec.add(Text("Score against cumulative training FLOPs, one panel per budget: thin lines are single seeds, "
                 "bold lines their mean."),
            figure("learning_curves", "Learning curves on a FLOP axis",
                   lambda: F.learning_curves_figure(curves, ctx.labels)))
    nb = curves["budget"].nunique()
    if nb > 6:
        sec.add(Note(f"the study has {nb} budgets; the figure shows the 6 largest"))
    sec.data = {"n_points": int(len(curves)), "n_runs": int(curves["run_id"].nunique())}
    return sec


def seconds_section(ctx: Context) -> Section:
    sec = Section("seconds", "FLOPs and wall-clock seconds")
    runs = finished(ctx.runs)
    runs = runs[runs["wall_s"].notna() & (runs["wall_s"] > 0) & (runs["total_flops"] > 0)]
    if runs.empty:
        sec.missing = "no wall-clock seconds recorded for the runs (runs.wall_s is empty)"
        return sec
    phase = None
    led = ctx.study.ledger
    if led is not None and "seconds" in led.columns and led["seconds"].notna().any():
        led = led[led["run_id"].isin(set(runs["run_id"])) & led["counted"].astype(bool)]
        phase = led.groupby("phase", as_index=False).agg(flops=("flops", "sum"), seconds=("seconds", "sum"))
        phase = phase[(phase["flops"] > 0) | (phase["seconds"] > 0)]
    sec.add(Text("RACE budgets FLOPs, but at small scale FLOPs and seconds disagree: small models are "
                 "overhead-bound, and decoding costs more time per FLOP than the batched update. Both axes are "
                 "shown so a budget in FLOPs can be read as time."),
            figure("flops_seconds", "FLOPs vs seconds", lambda: F.flops_seconds_figure(runs, phase)))
    rate = (runs["total_flops"] / runs["wall_s"]).groupby(runs["model"].astype(str)).median()
    sec.add(Table(["model", "median FLOP/s per run"], [[m, f"{v:.3g}"] for m, v in rate.items()]))
    sec.data = {"flops_per_second": jsonable(rate.to_dict()), "phases": jsonable(phase) if phase is not None else []}
    return sec


__all__ = ["summary_section", "card_section", "frontier_section", "split_section", "isoflop_section",
           "curves_section", "seconds_section", "target_regimes"]
