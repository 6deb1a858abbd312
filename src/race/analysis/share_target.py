"""The regime call checked at the target: the seed study's claim that regime calls from
pilots hold where their gains do not, tested end to end.

From the pilots (a study of :func:`race.analysis.update_share.share_table` at one budget),
per line (one reward system):

* the **call**: the regime of the line's best p (:func:`race.analysis.update_share.best_share`:
  update-heavy when learning takes at least half the FLOPs, else search- or feedback-heavy;
  "not identified" when no allocation scores below the best beyond the noise, or the best
  setting of another regime ties with it);
* the **settings** (:func:`regime_settings`): per regime, the allocation with the best pilot
  score among those whose measured split puts them in it (the best update-heavy setting and
  the best setting below p = 0.5).

Then the two settings run at the target budget T (>= 3 seeds), and :func:`regime_check` reads
the paired difference ``d_T = score_T(the called regime's setting) - score_T(the other's)``
over seeds and the same problems (the target study's joint replicates): the call was
**right** when d_T's interval lies above 0, **wrong** when below, **not decided at T** when
it covers 0. Where the pilots made no call (not identified), the pilot best's regime stands
for the call and the verdict says so. The pilots' own difference between the two settings is
reported beside it (the gain the pilots saw, against the one T shows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .bootstrap import BootstrapResult, Difference, difference
from .update_share import Regime, best_share, regime_of

#: Budgets closer than this (relative) are one budget.
RTOL = 0.05


@dataclass
class RegimeCheck:
    """The pilots' regime call of one line and what the target said (module docstring)."""

    line: str
    reward: str
    pilot_budget: float
    target_budget: float
    call: Regime  # the pilots' call (not identified: the response was flat)
    called: Regime  # the regime whose setting the check backs: the call, or the pilot best's regime
    other: Regime
    settings: dict[str, str]  # regime -> allocation
    pilot: dict[str, tuple[float, float, float]]  # regime -> (p, p_policy, score) at the pilot budget
    target: dict[str, tuple[float, float, float, float]]  # regime -> (p, p_policy, score, n_runs) at T
    pilot_diff: Difference  # called - other at the pilot budget
    target_diff: Difference  # called - other at T
    verdict: str  # "right" | "wrong" | "not decided at T" (prefixed "no call ..." where the pilots made none)

    def text(self) -> str:
        d = self.target_diff
        return (f"{self.reward}: pilots call {self.call}; at T {self.called} - {self.other} = {d.diff:+.3f} "
                f"[{d.lo:+.3f}, {d.hi:+.3f}]: {self.verdict}")


def regime_settings(line: pd.DataFrame) -> dict[Regime, str]:
    """Per regime, the best-scoring allocation of one (budget, line) of ``share_table``
    among those whose measured split (``p``, ``search_share``, ``feedback_share``) puts them in it."""
    reg = [regime_of(float(r.p), float(r.search_share), float(r.feedback_share)) for r in line.itertuples()]
    ranked = line.assign(pos=range(len(line))).sort_values(["score", "allocation"], ascending=[False, True],
                                                           kind="mergesort")
    out: dict[Regime, str] = {}
    for r in ranked.itertuples():
        out.setdefault(reg[r.pos], str(r.allocation))
    return out


def _at(table: pd.DataFrame, boot: BootstrapResult, budget: float, allocation: str) -> tuple[pd.Series, int]:
    rows = table[np.isclose(table["budget"].to_numpy(float), budget, rtol=RTOL) & (table["allocation"] == allocation)]
    if rows.empty:
        raise ValueError(f"no runs of {allocation!r} at budget {budget:.3g}: run it there first")
    r = rows.iloc[0]
    return r, boot.index_of(budget=r["budget"], allocation=allocation)


def _diff(table: pd.DataFrame, boot: BootstrapResult, budget: float, a: str, b: str, level: float) -> Difference:
    (ra, ia), (rb, ib) = _at(table, boot, budget, a), _at(table, boot, budget, b)
    return difference(float(ra["score"]), float(rb["score"]), boot.reps[:, ia], boot.reps[:, ib], level=level)


def regime_check(pilot_table: pd.DataFrame, pilot_boot: BootstrapResult, target_table: pd.DataFrame,
                 target_boot: BootstrapResult, *, pilot_budget: float, target_budget: float,
                 level: float = 0.95) -> list[RegimeCheck]:
    """The check of every pilot line that holds two regimes (module docstring): pilot tables
    and target tables from :func:`race.analysis.update_share.share_table` (allocations keyed
    alike: the same grid settings), read at ``pilot_budget`` and ``target_budget``."""
    pil = pilot_table[np.isclose(pilot_table["budget"].to_numpy(float), pilot_budget, rtol=RTOL)]
    if pil.empty:
        raise ValueError(f"no pilot allocations at budget {pilot_budget:.3g}")
    out = []
    for line, g in pil.groupby("line", sort=True):
        settings = regime_settings(g)
        best = best_share(g, pilot_boot, level=level)
        called = best.regime if best.regime != Regime.NOT_IDENTIFIED else regime_of(
            best.best_p, *g.loc[g["allocation"] == best.best_allocation, ["search_share", "feedback_share"]].iloc[0])
        others = [r for r in settings if r != called]  # in the order of their best pilot score
        if called not in settings or not others:
            continue  # one regime only: nothing to check
        other = Regime.UPDATE_HEAVY if Regime.UPDATE_HEAVY in others else others[0]
        a, b = settings[called], settings[other]
        pilot = {str(r): tuple(float(_at(pil, pilot_boot, pilot_budget, settings[r])[0][k])
                               for k in ("p", "p_policy", "score")) for r in (called, other)}
        target = {str(r): tuple(float(_at(target_table, target_boot, target_budget, settings[r])[0][k])
                                for k in ("p", "p_policy", "score", "n_runs")) for r in (called, other)}
        d_t = _diff(target_table, target_boot, target_budget, a, b, level)
        verdict = "right" if d_t.lo > 0 else "wrong" if d_t.hi < 0 else "not decided at T"
        if best.regime == Regime.NOT_IDENTIFIED:
            verdict = f"no call (the pilots did not identify the regime); the pilot best's regime at T: {verdict}"
        out.append(RegimeCheck(line=str(line), reward=str(g["reward"].iloc[0]), pilot_budget=float(pilot_budget),
                               target_budget=float(target_budget), call=best.regime, called=called, other=other,
                               settings={str(r): settings[r] for r in (called, other)}, pilot=pilot, target=target,
                               pilot_diff=_diff(pil, pilot_boot, pilot_budget, a, b, level), target_diff=d_t,
                               verdict=verdict))
    return out


__all__ = ["RTOL", "RegimeCheck", "regime_check", "regime_settings"]
