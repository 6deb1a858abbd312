"""Replay pilot designs on a study of complete trajectories: what racing would have cost and picked.

A study is *replayable* when every allocation ran, with the same seeds, to one budget T at a
constant learning rate and was read at several smaller budgets on the way (a nested grid:
``nested: true`` with log-spaced ``budgets`` up to T, e.g. ``configs/replay-lr.yaml``; or
runs imported with ``race import --budgets``). At a constant learning rate a run's prefix IS
the shorter run, so each trajectory holds every pilot a design could have run, and the
study's own scores at T are the truth beside them. :class:`StudySource` serves those
prefixes to the designs of :mod:`race.analysis.designs` (the racing rule and the literature's
baselines) exactly as a racing grid's store would hold them, and :func:`replay` scores each
design's pick against the truth at T, with a paired interval over seeds x problems.

A design's rungs are snapped down to the budgets the study read (:meth:`StudySource.snap`):
a replay reads only what was evaluated, as the grid would have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .errors import ReportError

RTOL = 1e-6
#: a rung within this (relative) of a read is read there (grid files round budgets: 6.6667e11 for T/3)
SNAP_RTOL = 1e-4
#: the fewest budgets (T included) a replayable study was read at
MIN_READS = 3
#: the first rung is also read at the study's budgets within this factor below it (the racing grid's nested reads)
NESTED_SPAN = 4.0


@dataclass
class StudySource:
    """A study of complete trajectories as a source for :mod:`race.analysis.designs`."""

    runs: pd.DataFrame
    evals: pd.DataFrame
    target: str = "greedy"
    target_budget: float | None = None
    names: list[str] = field(init=False)
    seeds: list[int] = field(init=False)

    def __post_init__(self) -> None:
        from race.analysis.tables import prepare_runs, without_controls

        runs = without_controls(prepare_runs(self.runs))
        if runs.empty:
            raise ReportError("the study has no complete runs to replay")
        T = float(runs["budget"].max()) if self.target_budget is None else float(self.target_budget)
        at_t = runs[np.isclose(runs["budget"].to_numpy(float), T, rtol=RTOL, atol=0.0)]
        if at_t.empty:
            raise ReportError(f"no run reached the target budget {T:.3g}: replay reads complete trajectories; the "
                              f"study's budgets are {sorted(set(runs['budget'].round(6)))}")
        names = sorted(set(runs["allocation"]))
        short = sorted(set(names) - set(at_t["allocation"]))
        if short:
            raise ReportError(f"{len(short)} allocation(s) did not run to the target budget {T:.3g} ({short[:3]}): "
                              "every allocation must run to T to be replayed (run the grid with every allocation at "
                              "its largest budget, nested: true)")
        seeds = [set(at_t.loc[at_t["allocation"] == a, "seed"]) for a in names]
        common = sorted(set.intersection(*seeds))
        if len(common) < 2:
            raise ReportError(f"replay needs the same 2 or more seeds of every allocation at T; the common seeds are "
                              f"{common}: run more seeds")
        self.target_budget, self.names, self.seeds = T, names, [int(s) for s in common]
        self._runs = runs[runs["budget"].to_numpy(float) <= T * (1 + RTOL)]
        self._runs = self._runs[self._runs["seed"].isin(self.seeds)]
        self.reads = sorted(set(float(b) for b in self._runs["budget"]))
        if len(self.reads) < MIN_READS:
            raise ReportError(f"the study was read at {len(self.reads)} budget(s) up to T: replay needs {MIN_READS} or "
                              "more (8 or more log-spaced serve it best: nested: true with budgets from about T/64 "
                              "to T)")
        self._by = {(a, int(s)): g for (a, s), g in self._runs.groupby(["allocation", "seed"])}

    # -- what a design reads ------------------------------------------------------------
    def snap(self, budgets: list[float]) -> list[float]:
        """Each budget down to the largest read at or below it (the smallest read if none), kept
        increasing (a rung that would repeat the one below moves down a read where it can)."""
        out: list[float] = []
        for b in budgets:
            below = [r for r in self.reads if r <= b * (1 + SNAP_RTOL)]
            out.append(below[-1] if below else self.reads[0])
        for j in range(len(out) - 2, -1, -1):
            if out[j] >= out[j + 1]:
                lower = [r for r in self.reads if r < out[j + 1]]
                out[j] = lower[-1] if lower else out[j]
        return out

    def snap_up(self, budget: float) -> float:
        """The least read at or above ``budget`` (T when none is)."""
        above = [r for r in self.reads if r >= budget * (1 - SNAP_RTOL)]
        return above[0] if above else self.reads[-1]

    def tables(self, reached: dict[tuple[int, int], int], budgets: "list[float] | dict[int, list[float]]",
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The rows a racing study's store would hold: per trajectory its readings at the rungs it
        reached and at the study's reads just below its first rung (the grid's nested reads)."""
        rows = []
        for (k, seed), top in sorted(reached.items()):
            # an allocation's own ladder repeats a budget where its floor spans rungs: each budget
            # snaps on its own (the shared rungs snap increasing)
            ladder = ([self.snap([b])[0] for b in budgets[k]] if isinstance(budgets, dict)
                      else self.snap(list(budgets)))
            g = self._by[(self.names[k], int(seed))]
            b = g["budget"].to_numpy(float)
            rung = np.isclose(b[:, None], np.array(ladder[: top + 1])[None, :], rtol=RTOL, atol=0.0).any(axis=1)
            nested = (b < ladder[0] * (1 - RTOL)) & (b >= ladder[0] / NESTED_SPAN * (1 - RTOL))
            rows.append(g[rung | nested])
        runs = pd.concat(rows).drop_duplicates("run_id")
        evals = self.evals[self.evals["run_id"].isin(set(runs["run_id"])) & (self.evals["target"] == self.target)]
        return runs, evals

    def min_budgets(self, floor_steps: int) -> dict[str, float]:
        """Per allocation the budget its runs needed for warmup + ``floor_steps`` steps, from the
        FLOPs per step its trajectories counted (the costliest seed's)."""
        out = {}
        for a in self.names:
            g = self._runs[(self._runs["allocation"] == a) & (pd.to_numeric(self._runs["steps"], errors="coerce") > 0)]
            per = float((g["total_flops"].astype(float) / g["steps"].astype(float)).max())
            warm = pd.to_numeric(g["warmup_steps"], errors="coerce").max() if "warmup_steps" in g.columns else 0
            out[a] = per * (floor_steps + (int(warm) if pd.notna(warm) else 0)) * 1.02
        return out

    def least_budget(self) -> float:
        return 0.0

    def flat(self) -> tuple[pd.DataFrame, pd.DataFrame, list[float]]:
        """A flat grid on the study: every allocation and seed at the reads nearest T/16, T/8, T/4."""
        T = self.target_budget
        want = [T / 16, T / 8, T / 4]
        picks = sorted({min(self.reads, key=lambda r: abs(np.log(r / w))) for w in want})
        runs = self._runs[np.isin(np.round(self._runs["budget"].to_numpy(float), 3), np.round(picks, 3))]
        evals = self.evals[self.evals["run_id"].isin(set(runs["run_id"])) & (self.evals["target"] == self.target)]
        return runs, evals, picks

    # -- the truth at T -----------------------------------------------------------------
    def truth(self, n_boot: int = 1000, seed: int = 0) -> tuple[dict[str, float], np.ndarray]:
        """(seed-mean score at equal FLOPs at T per allocation, (R, K) joint replicates: problems
        resampled once per replicate for every allocation, seeds within each)."""
        from race.analysis.forecast import standings
        from race.analysis.joint import draw_replicates, study_matrix

        at_t = self._runs[np.isclose(self._runs["budget"].to_numpy(float), self.target_budget, rtol=RTOL, atol=0.0)]
        ev = self.evals[self.evals["run_id"].isin(set(at_t["run_id"]))]
        sm = study_matrix(ev, at_t, self.target)
        reps = draw_replicates(sm, n_boot, np.random.default_rng([seed, 47]))
        names, pts, R = standings(sm, reps, self.names, self.target_budget)
        order = [names.index(a) for a in self.names]
        return dict(zip(self.names, (float(pts[i]) for i in order))), R[:, order]


def replay(runs: pd.DataFrame, evals: pd.DataFrame, *, target: str = "greedy", target_budget: float | None = None,
           designs: list[str] | None = None, rule: Any = None, first_seeds: int | None = None, n_boot: int = 1000,
           seed: int = 0, source: "StudySource | None" = None) -> dict[str, Any]:
    """Every design of :data:`race.analysis.designs.DESIGNS` (or those named) on the study's
    complete trajectories, scored against its own truth at T (module docstring). Returns
    ``{"target_budget", "seeds", "truth": {allocation: score}, "best", "designs": {name: row}}``,
    a row holding the pick, pilots / T, unreused / T, the regret with its paired 95% interval,
    whether the true best was alive at the last rung, and the design's schedule. ``source``: the
    study already read as a :class:`StudySource` (then ``runs``, ``evals``, ``target`` and
    ``target_budget`` are its own)."""
    from race.analysis.designs import run_designs
    from race.analysis.racing import FIRST_SEEDS, RacingRule

    src = source if source is not None else StudySource(runs, evals, target, target_budget)
    truth, R = src.truth(n_boot, seed)
    best = max(truth, key=lambda a: (truth[a], a))
    out = {"target_budget": src.target_budget, "seeds": src.seeds, "reads": src.reads, "truth": truth, "best": best,
           "designs": {}}
    results = run_designs(src, rule or RacingRule(), FIRST_SEEDS if first_seeds is None else first_seeds, designs)
    for name, res in results.items():
        i = src.names.index(res.pick)
        reg = R.max(axis=1) - R[:, i]
        out["designs"][name] = {
            **res.as_dict(), "unreused": res.unreused, "regret": truth[best] - truth[res.pick],
            "regret_lo": float(np.quantile(reg, 0.025)), "regret_hi": float(np.quantile(reg, 0.975)),
            "p_regret_le_0.01": float(np.mean(reg <= 0.01)), "best_alive": best in res.alive_last,
            "rungs": res.schedule.get("budgets"), "keep": res.schedule.get("keep")}
    return out


def replay_table(result: dict[str, Any]) -> str:
    """The design table of :func:`replay` as Markdown."""
    T = result["target_budget"]
    lines = [f"replay at T = {T:.3g} FLOPs on seeds {result['seeds']} (reads: "
             + ", ".join(f"T/{T / b:.3g}" for b in result["reads"] if b < T) + "); truth at T: best "
             f"{result['best']} {result['truth'][result['best']]:.3f}", "",
             "| design | pilots / T | not reused / T | pick | regret [95%, seeds x problems] | P(regret <= 0.01) | "
             "best alive at last rung | rungs |", "|---|---:|---:|---|---:|---:|---|---|"]
    for name, r in result["designs"].items():
        rungs = ", ".join(f"T/{T / b:.3g}" for b in (r.get("rungs") or []))
        lines.append(f"| {name} | {r['pilot']:.2f} | {r['unreused']:.2f} | {r['pick']} | {r['regret']:.3f} "
                     f"[{r['regret_lo']:.3f}, {r['regret_hi']:.3f}] | {r['p_regret_le_0.01']:.2f} | "
                     f"{'yes' if r['best_alive'] else 'no'} | {rungs} |")
    return "\n".join(lines)


__all__ = ["StudySource", "replay", "replay_table"]
