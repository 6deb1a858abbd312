"""What racing would have cost and picked here: the pilot designs replayed on a study of complete
trajectories (``race.protocol.replay``), for a flat study whose every allocation ran to its
largest budget with the same 2+ seeds and was read at several smaller budgets (nested).

Every design reads only prefixes of the study's own runs (at a constant learning rate a
prefix is the shorter run), and is scored against the study's own scores at its largest
budget, the truth beside them, with a paired interval over seeds x problems.
"""

from __future__ import annotations

from typing import Any

from .doc import Context, Note, Section, Table, Text
from .fmt import fmt_flops, jsonable


def replay_section(ctx: Context) -> Section:
    from race.protocol import ReportError
    from race.protocol.replay import StudySource, replay

    sec = Section("replay", "What racing would have cost and picked here")
    st = ctx.study
    if st.race is not None:
        sec.missing = "a racing study: it ran one design (the racing section); replay needs every allocation at T"
        return sec
    try:
        src = StudySource(ctx.runs, ctx.evals, ctx.primary)
    except ReportError as e:
        sec.missing = f"not a study of complete trajectories ({e})"
        return sec
    out: dict[str, Any] = replay(ctx.runs, ctx.evals, seed=ctx.rng, source=src)
    T = out["target_budget"]
    sec.add(Text(
        f"Every allocation ran to T = {fmt_flops(T)} with seeds {out['seeds']} and was read at "
        f"{len(out['reads'])} budgets, so each pilot design below is replayed on prefixes of these runs (at a "
        "constant learning rate a prefix is the shorter run) and its pick is scored against the study's own score "
        f"at T: the best allocation there is {ctx.label(out['best'])} ({out['truth'][out['best']]:.3f}). Regret is "
        "the truth of the best minus the pick's, with a 95% interval over seeds and problems resampled together."))
    rows = []
    for name, r in out["designs"].items():
        rows.append([name, f"{r['pilot']:.2f}", f"{r['unreused']:.2f}", ctx.label(r["pick"]),
                     f"{r['regret']:.3f} [{r['regret_lo']:.3f}, {r['regret_hi']:.3f}]", f"{r['p_regret_le_0.01']:.2f}",
                     "yes" if r["best_alive"] else "no"])
    sec.add(Table(["design", "pilots / T", "not reused / T", "pick", "regret [95%]", "P(regret <= 0.01)",
                   "best alive at the last rung"], rows, "Designs replayed on the study's trajectories"))
    sec.add(Note("`race replay STUDY_DIR` prints this table (and --json); docs/analysis.md describes the designs"))
    sec.data = jsonable(out)
    return sec


__all__ = ["replay_section"]
