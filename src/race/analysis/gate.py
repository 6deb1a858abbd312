"""The learning gate: did an allocation learn anything before we forecast from it?

For allocation k at its largest pilot budget b_k, with m_k runs r (seeds) there:

    gain_k = mean_r [ end_r - start_r ]

end_r is the run's score at equal counted FLOPs within b_k, start_r its step-0 score (the
same base model on the same problems). Its standard error has two parts:

- **seeds**: the between-seed variance POOLED over every tested cell (each allocation at
  its largest budget, and the random-reward controls there): s^2 = sum_k sum_r (g_r -
  mean_k g)^2 / sum_k (m_k - 1), with nu_s = sum_k (m_k - 1) degrees of freedom; the seed
  part of the variance of gain_k is s^2 / m_k. Two seeds per cell give one degree of
  freedom each; pooling over K cells gives K.
- **problems**: the gain on problem j, delta_j = mean_r end_rj - start_j, varies over the
  P problems; its part is var_j(delta_j) / P with P - 1 degrees of freedom (it overlaps
  the seed part, which makes the test conservative, not liberal).

t_k = gain_k / se_k is compared with Student's t at 1 - alpha / K (one-sided Bonferroni
over the K allocations tested) with the Welch-Satterthwaite degrees of freedom
(a + b)^2 / (a^2 / nu_s + b^2 / (P - 1)) (a, b the two variance parts). So with 2 seeds
the threshold is far above a normal z (the seed variance is barely known), and with
nothing learned anywhere every allocation fails with probability >= 1 - alpha. Where
random-reward controls of the same model ran at b_k, the allocation must also beat them:
diff = mean end_k - mean end_control, seed part s^2 (1/m_k + 1/m_c), same test. A study
with one seed per cell has no seed variance to pool: only the problem part is used and
the reason says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from .joint import Replicates, StudyMatrix
from .tables import is_control

GATE_COLUMNS = ["allocation", "budget", "start", "end", "gain", "gain_lo", "gain_hi", "gain_z", "control",
                "control_diff", "control_lo", "control_hi", "control_z", "threshold_z", "df", "passed", "n_seeds",
                "end_flops", "reason"]


def pooled_seed_variance(groups: list[np.ndarray]) -> tuple[float, int]:
    """(s^2, nu): sum of squared deviations from each group's mean / sum (m_g - 1)."""
    ss = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups if len(g) > 1)
    nu = sum(len(g) - 1 for g in groups if len(g) > 1)
    return (ss / nu, nu) if nu > 0 else (float("nan"), 0)


def t_test(diff: float, seed_var: float, nu_s: int, prob_var: float, nu_p: int) -> tuple[float, float, float]:
    """(t, se, Welch-Satterthwaite df) of ``diff`` with variance parts seed_var (nu_s df) and prob_var (nu_p df)."""
    a = seed_var if nu_s > 0 and np.isfinite(seed_var) else 0.0
    b = prob_var if nu_p > 0 and np.isfinite(prob_var) else 0.0
    se = float(np.sqrt(a + b))
    terms = (a * a / nu_s if a > 0 else 0.0) + (b * b / nu_p if b > 0 else 0.0)
    df = float((a + b) ** 2 / terms) if terms > 0 else float("inf")
    if not np.isfinite(diff):
        return float("nan"), se, df
    if se <= 0:
        return (float("inf") if diff > 0 else float("-inf") if diff < 0 else 0.0), se, df
    return diff / se, se, df


def _problem_var(sm: StudyMatrix, plus: np.ndarray, minus_pp: np.ndarray | None) -> tuple[float, int]:
    """var_j(delta_j) / P and P - 1 for delta_j = mean over ``plus`` runs' end outcomes - ``minus_pp``."""
    if sm.end_pp is None or minus_pp is None or np.isnan(minus_pp).all():
        return 0.0, 0
    delta = np.nanmean(sm.end_pp[plus], axis=0) - minus_pp
    P = delta.size
    return (float(np.var(delta, ddof=1)) / P, P - 1) if P > 1 else (0.0, 0)


def learning_gate(sm: StudyMatrix, reps: Replicates | None, allocations: list[str], alpha: float = 0.05,
                  level: float = 0.95) -> pd.DataFrame:
    """One row per allocation (columns :data:`GATE_COLUMNS`); see the module docstring.

    ``gain_z`` / ``control_z`` are t statistics, ``threshold_z`` the Bonferroni t threshold
    at ``df`` degrees of freedom; ``gain_lo/gain_hi`` the ``level`` t interval (for display).
    ``reason`` says why a row failed. ``reps`` is not needed (kept for the call signature).
    """
    runs = sm.runs
    k = max(1, len(allocations))
    q = (1 - level) / 2
    cells: dict[str, np.ndarray] = {}
    for alloc in allocations:
        mine = runs[runs["allocation"] == alloc]
        if len(mine):
            b = float(mine["budget"].max())
            cells[alloc] = mine.index[mine["budget"] == b].to_numpy()
    gains = [sm.end[i] - sm.start[i] for i in cells.values() if np.isfinite(sm.start[i]).all()]
    ctl_cells = {}
    for alloc, idx in cells.items():
        mine = runs.loc[idx]
        ctl = runs[is_control(runs) & (runs["model"] == mine["model"].iloc[0])
                   & np.isclose(runs["budget"].to_numpy(float), float(mine["budget"].iloc[0]))]
        if len(ctl) and not is_control(mine).iloc[0]:
            ctl_cells[alloc] = ctl.index.to_numpy()
    seen = set()
    for cidx in ctl_cells.values():
        if tuple(cidx) not in seen:
            seen.add(tuple(cidx))
            gains.append(sm.end[cidx])
    s2, nu_s = pooled_seed_variance(gains)
    rows = []
    for alloc, idx in cells.items():
        mine = runs.loc[idx]
        b = float(mine["budget"].iloc[0])
        m = len(idx)
        start, end = float(np.mean(sm.start[idx])), float(np.mean(sm.end[idx]))
        row = dict(allocation=alloc, budget=b, start=start, end=end, n_seeds=m,
                   end_flops=float(np.mean(mine["end_flops"])), control=None, control_diff=np.nan,
                   control_lo=np.nan, control_hi=np.nan, control_z=np.nan, threshold_z=np.nan, df=np.nan)
        if not np.isfinite(start):
            row.update(gain=np.nan, gain_lo=np.nan, gain_hi=np.nan, gain_z=np.nan, passed=False,
                       reason="no step-0 evaluation to compare with")
            rows.append(row)
            continue
        start_pp = np.nanmean(sm.start_pp[idx], axis=0) if sm.start_pp is not None else None
        pv, nu_p = _problem_var(sm, idx, start_pp)
        gain = end - start
        tz, se, df = t_test(gain, s2 / m, nu_s, pv, nu_p)
        thr = float(student_t.ppf(1 - alpha / k, df))
        half = float(student_t.ppf(1 - q, df)) * se
        row.update(gain=gain, gain_lo=gain - half, gain_hi=gain + half, gain_z=tz, threshold_z=thr, df=df)
        passed = tz > thr
        reason = "" if passed else f"gain {gain:+.3f} is within the noise (t {tz:.2f} <= {thr:.2f}, {df:.0f} df)"
        if nu_s == 0 and m < 2:
            reason += ("; one seed per cell: seed noise is NOT in the test" if reason else
                       "one seed per cell: seed noise is NOT in the test")
        if alloc in ctl_cells:
            cidx = ctl_cells[alloc]
            diff = end - float(np.mean(sm.end[cidx]))
            ctl_pp = np.nanmean(sm.end_pp[cidx], axis=0) if sm.end_pp is not None else None
            pvc, nu_pc = _problem_var(sm, idx, ctl_pp)
            cz, cse, cdf = t_test(diff, s2 * (1 / m + 1 / len(cidx)), nu_s, pvc, nu_pc)
            cthr = float(student_t.ppf(1 - alpha / k, cdf))
            chalf = float(student_t.ppf(1 - q, cdf)) * cse
            row.update(control=f"random@{mine['model'].iloc[0]}", control_diff=diff, control_lo=diff - chalf,
                       control_hi=diff + chalf, control_z=cz)
            if passed and not cz > cthr:
                passed = False
                reason = (f"does not beat the random-reward control beyond the noise "
                          f"({diff:+.3f}, t {cz:.2f} <= {cthr:.2f})")
        row.update(passed=bool(passed), reason=reason)
        rows.append(row)
    return pd.DataFrame(rows, columns=GATE_COLUMNS)


def what_to_change(gate: pd.DataFrame) -> str:
    """Advice when no allocation passes the gate."""
    tips = ["larger pilot budgets or more optimizer steps per cell (the gain grows with steps)",
            "a denser reward (e.g. `rule:partial` partial credit instead of 0/1)",
            "more evaluation problems (a paired difference of d needs about 7.8 x disagreement / d^2 problems)"]
    if len(gate) and gate["n_seeds"].min() < 3:
        tips.append("3 or more seeds per cell (2 seeds leave the seed variance with 1 degree of freedom per cell)")
    return "; ".join(tips)
