"""The report's feedback section: what learned feedback cost and what it bought.

Per allocation, the share of its FLOPs spent on feedback (the reward phase) beside the
quality of the reward model behind it (step AUC, bad-step recall, outcome AUC, from the
RM's ``info.json``: :mod:`race.rewards.rm_card`); per learned-reward arm, the point at which
the proxy (the RM's score) keeps rising while the verified score falls
(:func:`race.analysis.divergence_table`), or "no divergence within the pilots"; and what
training the RMs cost, which the compute report card shows as a separate line, counted in
its total only when asked (``report.count_rm_training`` in the grid, ``race report
--count-rm-training``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from race.analysis import divergence_table, feedback_comparisons, waste_table
from race.protocol import reward_model_cards

from .doc import Context, Note, Section, Table, Text, is_prefix
from .fmt import fmt_flops, fmt_interval, fmt_num, fmt_pct, fmt_score, is_num, jsonable


def rm_cards(ctx: Context) -> dict[str, dict[str, Any] | None]:
    """Reward spec -> the RM card of the model behind it (``None``: a rule), for every
    reward of the study's pilot runs (``race.protocol.reward_model_cards``); read once per
    report."""
    return ctx.cached("rm_cards", lambda: reward_model_cards(ctx.runs))


def rm_training(ctx: Context) -> dict[str, int]:
    """RM name -> FLOPs that trained it (training + sampling its data), for each RM found
    behind a reward of the study: each RM once, however many arms read it, and a pool of
    policy samples shared by several RMs once (with the first of them by name)."""
    found = {c["name"]: c for c in rm_cards(ctx).values() if c and c.get("found")}
    out: dict[str, int] = {}
    pools: set[str] = set()
    for name, card in sorted(found.items()):
        pool = card.get("pool_digest") or ""
        shared = bool(pool) and pool in pools
        pools.add(pool)
        out[name] = int(card.get("train_flops") or 0) + (0 if shared else int(card.get("sampling_flops") or 0))
    return out


def _auc(card: dict[str, Any] | None, key: str, system: str) -> str:
    if card is None:  # no learned model: a rule is exact, the random control is noise by design
        return "-" if key == "outcome_auc" else "exact (rule)" if system == "rule" else "-"
    return fmt_score(card.get(key)) if card.get("found") and is_num(card.get(key)) else "n/a"


def _divergence_text(r: Any) -> str:
    if not r.diverged:
        return "no divergence within the pilots"
    return f"{fmt_flops(r.flops)} (step {r.step})"


def feedback_section(ctx: Context) -> Section:
    sec = Section("feedback", "Feedback: what it cost and what it bought")
    cards = rm_cards(ctx)
    learned = {k: c for k, c in cards.items() if c is not None}
    if not learned:
        sec.missing = ("no learned reward in the study (rule rewards only): there is no reward model whose quality, "
                       "training cost or over-optimisation to report")
        return sec
    p = ctx.prepared
    wt = waste_table(ctx.runs.assign(zero_var_frac=ctx.runs["zero_var_frac"].astype(float),
                                     trunc_rate=ctx.runs["trunc_rate"].astype(float)), by=("allocation",))
    first = p.drop_duplicates("allocation").set_index("allocation")
    reward_of, system_of = first["reward"].astype(str), first["reward_system"].astype(str)
    train = ctx.study.train
    div = (divergence_table(ctx.runs, train) if train is not None and
           {"run_id", "step", "flops", "verified_mean"} <= set(train.columns) else None)
    div_of = {r.allocation: r for r in div.itertuples()} if div is not None else {}
    sec.add(Text("Each allocation's share of FLOPs spent on feedback (the reward phase, counted in its budget) "
                 "beside the quality of the reward model behind it, as its build measured it: step AUC (how well "
                 "p(step ok) ranks good steps above bad ones), bad-step recall (bad steps flagged at the RM's "
                 "threshold) and outcome AUC (the trajectory score against final-answer correctness). Rules give "
                 "exact credit. The last column is where the arm's proxy starts to diverge from the verified "
                 "score (below)."))
    rows = []
    for r in wt.itertuples():
        reward, system = reward_of.get(r.allocation, ""), system_of.get(r.allocation, "")
        card = cards.get(reward)
        rm = "-" if card is None else card.get("name", "?") + ("" if card.get("found") else " (no info)")
        on = "-" if card is None else card.get("quality_on", "-") if card.get("found") else card.get("note", "")
        d = div_of.get(r.allocation)
        rows.append([r.allocation, fmt_pct(r.feedback_share), rm, _auc(card, "step_auc", system),
                     _auc(card, "bad_step_recall", system), _auc(card, "outcome_auc", system), on,
                     _divergence_text(d) if d is not None else "-"])
    sec.add(Table(["allocation", "feedback share", "reward model", "step AUC", "bad-step recall", "outcome AUC",
                   "quality measured on", "proxy diverges at"], rows, "Feedback share and reward-model quality"))
    if any(c.get("found") and c.get("quality_on") == "programmatic test mixture" for c in learned.values()):
        sec.add(Note("a 'programmatic test mixture' figure is the RM build's own test (corrupted reference solutions, "
                     "threshold 0.5), not the policies' samples: RMs measured on policy samples (`race rm eval`, "
                     "docs/reward-models.md) are not comparable with it", "warn"))
    for c in learned.values():
        if not c.get("found"):
            sec.add(Note(f"{c.get('name')}: {c.get('note')}", "warn"))
    comp = _comparison_block(ctx, sec, learned)
    _divergence_block(ctx, sec, div)
    _cost_block(ctx, sec, learned)
    sec.data = {"rms": jsonable({k: v for k, v in cards.items()}),
                "allocations": [dict(zip(["allocation", "feedback_share", "reward_model", "step_auc", "bad_step_recall",
                                          "outcome_auc", "quality_on", "divergence"], row)) for row in rows],
                "divergence": jsonable(div.drop(columns=["per_seed"])) if div is not None else [],
                "divergence_per_seed": jsonable({r.allocation: r.per_seed for r in div.itertuples()}
                                                if div is not None else {}),
                "comparisons": jsonable(comp) if comp is not None else [],
                "rm_training_flops": rm_training(ctx), "count_rm_training": ctx.count_rm_training}
    return sec


def strength_of(cards: dict[str, dict[str, Any] | None]) -> dict[str, float]:
    """Reward spec -> the strength of its RM: step AUC (a PRM), else outcome AUC, as recorded."""
    out = {}
    for reward, c in cards.items():
        if c and c.get("found"):
            v = c.get("step_auc") if is_num(c.get("step_auc")) else c.get("outcome_auc")
            if is_num(v):
                out[reward] = float(v)
    return out


def _comparison_block(ctx: Context, sec: Section, learned: dict[str, dict[str, Any]]) -> pd.DataFrame | None:
    comp = feedback_comparisons(ctx.evals, ctx.runs, ctx.primary, strength_of(learned), n_boot=ctx.n_boot,
                                rng=ctx.rng)
    if comp.empty:
        sec.add(Note("no two rewards of one allocation group to compare at equal FLOPs (a learned reward beside a "
                     "weaker RM, the rule it mixes in, or rule:partial)"))
        return comp
    sec.add(Text(f"Did the feedback pay? Paired differences of {ctx.primary} at equal counted FLOPs (each budget's "
                 "runs read at the smallest FLOPs all reached; 95% bootstrap intervals over seeds and problems, one "
                 "problem draw shared by every run): a stronger RM (higher step AUC) against a weaker one, each "
                 "learned reward against the rule it mixes in alone, and against rule:partial (exact dense credit). "
                 "Won: the interval is above 0; lost: below; tied: it covers 0. The RM's inference is charged, so "
                 "a stronger RM buys fewer steps at the same budget."))
    counts = comp.groupby(["budget", "kind"])["verdict"].value_counts().unstack(fill_value=0)
    sec.add(Table(["budget", "comparison", "won", "tied", "lost"],
                  [[fmt_flops(b), k, str(int(r.get("won", 0))), str(int(r.get("tied", 0))), str(int(r.get("lost", 0)))]
                   for (b, k), r in counts.iterrows()], "Verdicts per budget"))
    sec.add(Table(["budget", "allocations (reward = *)", "comparison", "a", "b", "a - b [95%]", "verdict"],
                  [[fmt_flops(r.budget), r.group, r.kind, r.a, r.b, f"{fmt_score(r.diff)} {fmt_interval(r.lo, r.hi)}",
                    r.verdict] for r in comp.itertuples()], f"Feedback at equal FLOPs ({ctx.primary})"))
    return comp


def _divergence_block(ctx: Context, sec: Section, div: pd.DataFrame | None) -> None:
    if div is None:
        sec.add(Note("proxy-vs-verified divergence not checked: the study has no per-step training log with the "
                     "verified score of the training samples (train table with verified_mean)"))
        return
    if div.empty:
        return
    settings = div["settings"].dropna()
    s = settings.iloc[0] if len(settings) else {}
    sec.add(Text("Proxy vs verified, per learned-reward arm: the proxy is the RM's own score (rm_score_mean) on the "
                 "training samples, the verified score their final-answer correctness (verified_mean), both per "
                 "step, averaged over the arm's seeds (each seed's longest run). The divergence point is the step "
                 "from which, to the end of the run, the proxy rises and the verified score falls, each by at least "
                 f"{s.get('min_change', 0.05)} and {s.get('z', 2.0):g} standard errors of a least-squares line; of "
                 "the steps that qualify, the one where the smoothed verified score peaks. 'No divergence within the "
                 "pilots' means no step qualified in the longest pilot run."))
    rows = []
    for r in div.itertuples():
        past = ", ".join(fmt_flops(b) for b in r.budgets_past) if isinstance(r.budgets_past, list) and r.budgets_past \
            else "-"
        rows.append([r.allocation, str(r.proxy or "-"), f"{r.seeds_diverged} of {r.n_seeds}",
                     _divergence_text(r), f"{r.proxy_change:+.3f}" if is_num(r.proxy_change) else "-",
                     f"{r.verified_change:+.3f}" if is_num(r.verified_change) else "-", past])
    sec.add(Table(["arm", "proxy", "seeds diverging", "divergence point (seed mean)", "proxy change after",
                   "verified change after", "pilot budgets past it"], rows,
                  "Proxy-vs-verified divergence (changes: fitted, from the point to the end; from mid-run when none)"))
    n = int(div["diverged"].sum())
    sec.add(Text(f"{n} of {len(div)} learned-reward arm(s) diverge within the pilots." if n else
                 f"None of the {len(div)} learned-reward arm(s) diverges within the pilots: over the longest pilot "
                 "runs the proxy never rose while the verified score fell beyond the noise."))


def _cost_block(ctx: Context, sec: Section, learned: dict[str, dict[str, Any]]) -> None:
    found = {c["name"]: c for c in learned.values() if c.get("found")}
    if not found:
        return
    total = float(ctx.prepared.loc[~is_prefix(ctx.prepared), "total_flops"].sum())  # prefixes counted once
    rm_tot = sum(rm_training(ctx).values())
    sec.add(Table(["reward model", "kind", "parameters", "inference FLOPs / token", "training FLOPs",
                   "of which: sampling its data", "warm-start SFT behind it (not counted)"],
                  [[n, c.get("kind", ""), fmt_num(c.get("params")),
                    f"{c['flops_per_token']:.3g}" if is_num(c.get("flops_per_token")) else "n/a",
                    fmt_flops(c["training_flops"]), fmt_flops(c["sampling_flops"]) if c["sampling_flops"] else "-",
                    fmt_flops(c["base_sft_flops"]) if c["base_sft_flops"] else "-"]
                   for n, c in sorted(found.items())], "What the reward models cost to build (from info.json)"))
    how = ("COUNTED in the compute report card's total (count_rm_training)" if ctx.count_rm_training else
           "a separate line of the compute report card, NOT counted in the pilot budget or the total (set "
           "report.count_rm_training: true in the grid, or race report --count-rm-training, to count it)")
    sec.add(Text(f"Training the study's reward models cost {fmt_flops(rm_tot)} (training plus sampling their data, a "
                 "pool that several RMs share counted once; "
                 f"{fmt_pct(rm_tot / total) if total else 'n/a'} of the pilot runs' {fmt_flops(total)}): {how}. "
                 "Each RM is counted once, however many arms read it. A likelihood PRM is read off a warm start; "
                 "that warm start's SFT is shown beside it and never counted, as the policies' warm starts are not."))


__all__ = ["feedback_section", "rm_cards", "rm_training"]
