"""The racing section of the report (``protocol: race``): the rungs (who went on, why, at what
compute), the pick and its interval at short reach, and the target run as the continued pilot.

Renders what the protocol read: the study's ``race:`` settings and stored rung decisions
(``Study.race``, ``Study.ladder``, ``Study.rung_decisions``), its runs table (``own_flops``: what each
row's run executed itself, so an extended run's FLOPs and the run it extends are counted
once; ``extends``) and its recorded target run (``validation.json``'s ``continued``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from race.schema import FINISHED

from .doc import Callout, Context, KeyValues, Note, Section, Table, Text, finished
from .fmt import fmt_flops, fmt_interval, fmt_pct, fmt_prob, fmt_score, is_num, jsonable


def _units(flops: float, T: float) -> str:
    return f"{fmt_flops(flops)} ({flops / T:.2f} T)"


def _fraction(b: float, T: float) -> str:
    return f"T/{T / b:.3g}"


def _target_run(ctx: Context, T: float) -> dict[str, Any] | None:
    """The recorded target run of the pick: its run, the pilot it continued, and their FLOPs."""
    v = ctx.study.validation_for(ctx.target_budget, ctx.primary) or ctx.study.validation_for(T)
    if not v or v.get("protocol") != "race" or not v.get("continued"):
        return None
    runs = ctx.study.runs.set_index("run_id")
    pick = (v.get("recommendation") or {}).get("allocation") or (v.get("allocations") or [None])[0]
    pick_seeds = (v.get("seeds") or {}).get(pick, [])
    for run_id, pilot in v["continued"].items():
        if run_id not in runs.index or not pilot or pilot not in runs.index:
            continue
        r, p = runs.loc[run_id], runs.loc[pilot]
        if int(r["seed"]) not in pick_seeds[:1] or str(r["status"]) not in FINISHED:
            continue
        return {"run_id": run_id, "pilot": pilot, "seed": int(r["seed"]), "allocation": pick,
                "total_flops": float(r["total_flops"]), "pilot_flops": float(p["total_flops"]),
                "pilot_budget": float(p["budget"]), "share": float(p["total_flops"]) / float(r["total_flops"])}
    return None


def _eval_cost(ctx: Context, run_ids: set[str]) -> tuple[float, float, float, float]:
    """(training FLOPs, training seconds, evaluation FLOPs, evaluation seconds) the ledger holds
    for ``run_ids`` (evaluation is recorded, never charged to a budget)."""
    led = ctx.study.ledger
    if led is None or led.empty:
        return (float("nan"),) * 4
    led = led[led["run_id"].isin(run_ids)]
    ev = led["phase"].astype(str) == "eval"
    train = led["counted"].astype(bool) & ~ev
    sec = pd.to_numeric(led["seconds"], errors="coerce").fillna(0.0)
    return (float(led.loc[train, "flops"].sum()), float(sec[train].sum()), float(led.loc[ev, "flops"].sum()),
            float(sec[ev].sum()))


def _decision_table(ctx: Context, d: dict[str, Any], T: float) -> Table:
    rows = []
    for r in d.get("rows", []):
        steps = "-" if r.get("steps") is None else (f"{r['steps']}" + ("" if r.get("measured", True) else
                                                                          f" (< {r.get('steps_needed')}: floor)"))
        rows.append([ctx.label(r["allocation"]), f"{fmt_flops(r.get('budget', d['budget']))}", steps,
                     f"{fmt_score(r.get('observed'))}",
                     f"{fmt_score(r.get('forecast'))} {fmt_interval(r.get('forecast_lo'), r.get('forecast_hi'))}",
                     fmt_prob(r.get("p_best")), fmt_prob(r.get("p_beats_leader")),
                     str(r.get("decision", "-")), str(r.get("reason", ""))])
    return Table(["allocation", "budget", "steps", "observed", "forecast at T [interval]",
                  "P(best) of all", "P(beats the leader)", "decision", "why"], rows,
                 f"Rung {d['rung']} ({fmt_flops(d['budget'])} = {_fraction(d['budget'], T)}): the decision")


def race_section(ctx: Context) -> Section:
    st = ctx.study
    sec = Section("race", "Racing: rungs toward the target")
    if st.race is None:
        sec.missing = "not a racing study (protocol: flat): every allocation ran at every budget of the grid"
        return sec
    T = float(st.race.target_budget)
    ladder = st.ladder
    rungs = ladder.budgets()
    sched = st.schedule
    decisions = {int(d["rung"]): d for d in st.rung_decisions}
    runs = finished(ctx.runs)
    keys = dict(zip(ctx.prepared["run_id"], ctx.prepared["allocation"]))
    own = pd.to_numeric(runs.get("own_flops", runs["total_flops"]), errors="coerce").fillna(0.0)
    pilot_flops = float(own.sum())
    keep = f" ranked onto them: {', '.join(str(k) for k in sched.keep)}" if sched is not None else ""
    raised = ({a: sched.budget_of(a, 0) for a in ladder.names if sched.budget_of(a, 0) > rungs[0] * (1 + 1e-9)}
              if sched is not None else {})
    sec.add(Text(
        f"Pilots raced toward the target budget T = {fmt_flops(T)} in {len(rungs)} rungs "
        f"({', '.join(f'{fmt_flops(b)} = {_fraction(b, T)}' for b in rungs)}; allocations{keep}), "
        + (f"sized for {len(ladder.names)} allocations and the cap of {sched.cap} T on pilot compute the target run "
           "does not reuse. " if sched is not None and not st.race.explicit else "as the grid file lists them. ")
        + "The first rung ran every allocation with every seed; after each rung the best measured ones by the "
        "racing rule went on, each by extending its run (its checkpoint resumed with the larger budget at the same "
        "constant learning rate: the shorter run is the longer one's prefix, its FLOPs counted once). "
        + (f"{len(raised)} allocation(s) started higher, where they had taken their warmup and the floor's steps (the "
           "step floor: none is stopped before it is measured). " if raised else "")
        + f"The pilots spent {_units(pilot_flops, T)} in all."))
    rows, data_rungs = [], []
    for k, b in enumerate(rungs):
        budget_of = {a: (sched.budget_of(a, k) if sched is not None else b) for a in ladder.names}
        at = runs[[abs(float(x) - budget_of.get(keys.get(r, ""), b)) <= 1e-6 * b
                   for r, x in zip(runs["run_id"], runs["budget"])]]
        spent = float(own[at.index].sum())
        d = decisions.get(k)
        alive = sorted({ctx.label(keys.get(r, r)) for r in at["run_id"]})
        go_on = [ctx.label(a) for a in d["go_on"]] if d else []
        rows.append([str(k), f"{fmt_flops(b)} ({_fraction(b, T)})", str(len(alive)), str(len(at)),
                     _units(spent, T), ", ".join(go_on) if d else "not decided yet",
                     str(len(d.get("stopped") or {})) if d else "-"])
        data_rungs.append({"rung": k, "budget": b, "allocations": alive, "runs": len(at), "flops": spent,
                           "go_on": list(d["go_on"]) if d else None, "stopped": d.get("stopped") if d else None,
                           "exempt": list(d.get("exempt") or []) if d else None})
    sec.add(Table(["rung", "budget", "allocations", "runs", "compute (own FLOPs)", "go on (leader first)", "stopped"],
                  rows, "Rungs: who ran, what it cost, who went on"))
    train_f, train_s, eval_f, eval_s = _eval_cost(ctx, set(runs["run_id"]))
    if is_num(eval_f):
        sec.add(KeyValues([("training (counted)", f"{_units(train_f, T)}, {train_s:.0f} s"),
                           ("evaluation (recorded, not counted)", f"{_units(eval_f, T)}, {eval_s:.0f} s")]))
    against = []
    for k, d in sorted(decisions.items()):
        sec.add(_decision_table(ctx, d, T))
        against += [(k, a) for a, why in (d.get("stopped") or {}).items() if "against the forecast's odds" in why]
    if against:
        sec.add(Note("stopped by the schedule against the forecast's own odds (P(beats the leader at T) >= 0.5): "
                     + "; ".join(f"{ctx.label(a)} at rung {k}" for k, a in against), "warn"))
    last = decisions.get(len(rungs) - 1)
    data: dict[str, Any] = {"target_budget": T, "rungs": data_rungs, "pilot_flops": pilot_flops,
                            "pilot_flops_T": pilot_flops / T, "rule": (last or {}).get("rule"),
                            "schedule": sched.as_dict() if sched is not None else None,
                            "training_flops": train_f, "training_s": train_s, "eval_flops": eval_f, "eval_s": eval_s,
                            "stopped_against_odds": [{"rung": k, "allocation": a} for k, a in against]}
    if last is not None:
        pick = last.get("leader")
        row = next((r for r in last.get("rows", []) if r.get("allocation") == pick), {})
        lo, hi = row.get("forecast_lo"), row.get("forecast_hi")
        width = hi - lo if is_num(lo) and is_num(hi) else float("nan")
        n_all = len(ladder.names)
        sec.add(Callout("The pick", [
            f"{ctx.label(pick)}: forecast {fmt_score(row.get('forecast'))} {fmt_interval(lo, hi)} at T, from its last "
            f"rung {T / rungs[-1]:.3g}x below T (interval width {fmt_score(width)}); P(best) {fmt_prob(row.get('p_best'))} "
            f"over all {n_all} allocations the study ran (those stopped earlier at their last readings)."],
            label=ctx.label(pick) or "-"))
        data.update(pick=pick, pick_forecast=row.get("forecast"), pick_lo=lo, pick_hi=hi, reach=T / rungs[-1],
                    pick_p_best=row.get("p_best"))
    tr = _target_run(ctx, T)
    if tr is None:
        sec.add(Note("no target run yet: `race validate` continues the pick's pilot (its continued run at the last "
                     "rung) to the target budget"))
    else:
        sec.add(KeyValues([
            ("target run", f"{tr['run_id']} ({ctx.label(tr['allocation'])}, seed {tr['seed']}): "
                           f"{fmt_flops(tr['total_flops'])}"),
            ("continued pilot", f"{tr['pilot']} at {fmt_flops(tr['pilot_budget'])}: {fmt_flops(tr['pilot_flops'])}, "
                                f"{fmt_pct(tr['share'])} of the target run (counted once)"),
            ("pilots not reused by the target run", _units(pilot_flops - tr["pilot_flops"], T))]))
        data["target_run"] = tr
    sec.data = jsonable(data)
    return sec


__all__ = ["race_section"]
