"""The diagnostics section: what says when to distrust a gain. Wasted rollouts (groups with
zero reward variance) and truncation, over-optimisation (training reward rising while
verified accuracy falls) and the random-reward control."""

from __future__ import annotations

import numpy as np
import pandas as pd

from race.analysis import overoptimisation, random_control, waste_table

from .doc import Context, Note, Section, Table, Text, is_prefix
from .fmt import fmt_flops, fmt_interval, fmt_pct, fmt_score, is_num, jsonable


def diagnostics_section(ctx: Context) -> Section:
    sec = Section("diagnostics", "Diagnostics")
    runs = ctx.runs.copy()
    data: dict = {}
    _waste(ctx, runs, sec, data)
    _overoptimisation(ctx, runs, sec, data)
    _random_control(ctx, sec, data)
    sec.data = data
    return sec


def _waste(ctx: Context, runs: pd.DataFrame, sec: Section, data: dict) -> None:
    """Wasted rollouts (zero reward variance) and truncation, per budget and allocation;
    ``runs``' statistics become floats for the checks after it."""
    if runs[["zero_var_frac", "trunc_rate"]].astype(float).isna().all().all():
        sec.add(Note("no zero-variance or truncation statistics recorded (runs.zero_var_frac, runs.trunc_rate)"))
        return
    for c in ("zero_var_frac", "trunc_rate"):
        runs[c] = runs[c].astype(float)
    wt = waste_table(runs)
    p = ctx.prepared
    p = p[~is_prefix(p)]  # a nested grid's prefixes are inside the runs they were read from
    wasted = float((p["zero_var_frac"].astype(float) * p["rollout_flops"]).sum())
    total = float(p["total_flops"].sum())
    trunc = float(p["trunc_rate"].astype(float).mean())
    sec.add(Text(f"Wasted rollouts: {fmt_pct(p['zero_var_frac'].astype(float).mean())} of groups had "
                 f"zero reward variance on average; the rollouts spent on them ({fmt_flops(wasted)}) are "
                 f"{fmt_pct(wasted / total if total else np.nan)} of all pilot FLOPs. Mean truncation rate: "
                 f"{fmt_pct(trunc)}."), )
    if is_num(trunc) and trunc > 0.1:
        sec.add(Note("over 10% of completions hit the length limit: raise max_completion_length or the scores "
                     "measure truncation", "warn"))
    sec.add(Table(["budget", "allocation", "zero-variance groups", "wasted rollout FLOPs", "wasted share",
                   "truncation"],
                  [[fmt_flops(r.budget), r.allocation, fmt_pct(r.zero_var_frac), fmt_flops(r.wasted_rollout_flops),
                    fmt_pct(r.wasted_share), fmt_pct(r.trunc_rate)] for r in wt.itertuples()],
                  "Zero-variance share and truncation per budget and allocation"))
    data["waste"] = jsonable(wt)
    data["wasted_share"] = wasted / total if total else None
    data["trunc_rate"] = trunc


def _overoptimisation(ctx: Context, runs: pd.DataFrame, sec: Section, data: dict) -> None:
    """Runs whose training reward rises while verified accuracy falls (needs a per-step log)."""
    has_trend = {"proxy_reward_trend", "verified_trend"} <= set(runs.columns)
    train = ctx.study.train
    has_train = train is not None and "reward_mean" in train.columns
    prm = ctx.prepared["reward_system"].astype(str) == "prm"  # the typed column (race.schema.REWARD_COLUMNS)
    if not has_trend and not has_train:
        sec.add(Note("over-optimisation not checked: no per-step training log (train table with reward_mean)"))
        return
    oo = overoptimisation(runs, train if has_train else None, ctx.evals, target=ctx.primary)
    flagged = oo[oo["overoptimised"]]
    scope = ("process-RM runs: " + str(int(prm.sum()))) if prm.any() else "no process-RM runs in the study"
    sec.add(Text(f"Over-optimisation (proxy reward rising while verified {ctx.primary} accuracy falls): "
                 f"{len(flagged)} of {len(oo)} runs flagged ({scope})."))
    if len(flagged):
        sec.add(Note(f"{len(flagged)} run(s) over-optimise the reward: their training reward rises while "
                     "verified accuracy falls", "warn"),
                Table(["run", "allocation", "budget", "proxy slope", "verified slope"],
                      [[r.run_id, r.allocation, fmt_flops(r.budget), f"{r.proxy_slope:+.3f}",
                        f"{r.verified_slope:+.3f}"] for r in flagged.itertuples()]))
    data["overoptimisation"] = jsonable(oo)


def _random_control(ctx: Context, sec: Section, data: dict) -> None:
    """The (budget, allocation) cells against the random-reward control, beyond the noise."""
    rc = random_control(ctx.evals, ctx.runs, ctx.primary, n_boot=ctx.n_boot, rng=ctx.rng)
    if rc.empty:
        sec.add(Note("no random-reward control (reward: random): add one per model size to expose false gains "
                     "(format learning, evaluation noise)", "warn"))
    else:
        n_beat = int(rc["beats_control"].sum())
        if n_beat == 0:
            sec.add(Note("nothing beats the random-reward control beyond noise: the gains may be false", "warn"))
        else:
            sec.add(Text(f"Random-reward control: {n_beat} of {len(rc)} (budget, allocation) cells beat it beyond "
                         "the noise."))
        sec.add(Table(["budget", "allocation", "score", "control", "difference [95%]", "beats control"],
                      [[fmt_flops(r.budget), r.allocation, fmt_score(r.score), fmt_score(r.control_score),
                        f"{fmt_score(r.diff)} {fmt_interval(r.lo, r.hi)}", "yes" if r.beats_control else "no"]
                       for r in rc.itertuples()], f"Against the random-reward control ({ctx.primary})"))
    data["random_control"] = jsonable(rc)
