"""The learning gate: did an allocation learn anything before we forecast from it?

For allocation k at its largest pilot budget b_k, with runs r (seeds) there:

    gain_k = mean_r [ end_r - start_r ]

end_r is the run's score at equal counted FLOPs within b_k, start_r its step-0 score (the
same base model on the same problems). Its replicates come from the joint bootstrap
(:mod:`race.analysis.joint`): the same problem weights for end and start (paired) and for
every allocation, seeds resampled within (k, b_k). When random-reward controls of the same
model ran at b_k, the allocation is also compared with them: control_diff_k = mean end_k -
mean end_control (problems paired, seeds resampled in each cell).

An allocation passes when its gain is above 0 beyond the noise at the family-wise level:
gain / se > z_(1 - alpha / K) over the K allocations tested (one-sided Bonferroni, se the
replicate standard deviation), and, where a control exists, so is control_diff. With
nothing learned anywhere, every allocation fails with probability >= 1 - alpha.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import norm

from .joint import Replicates, StudyMatrix
from .tables import is_control

GATE_COLUMNS = ["allocation", "budget", "start", "end", "gain", "gain_lo", "gain_hi", "gain_z", "control",
                "control_diff", "control_lo", "control_hi", "control_z", "threshold_z", "passed", "n_seeds",
                "end_flops", "reason"]


def _z(point: float, reps: np.ndarray) -> float:
    se = float(np.std(reps, ddof=1)) if len(reps) > 1 else 0.0
    if not np.isfinite(point):
        return float("nan")
    if se <= 0:
        return float("inf") if point > 0 else float("-inf") if point < 0 else 0.0
    return point / se


def learning_gate(sm: StudyMatrix, reps: Replicates, allocations: list[str], alpha: float = 0.05,
                  level: float = 0.95) -> pd.DataFrame:
    """One row per allocation (columns :data:`GATE_COLUMNS`); see the module docstring.

    ``gain_lo/gain_hi`` is the ``level`` percentile interval (for display); ``passed``
    uses the Bonferroni threshold ``threshold_z``. ``reason`` says why a row failed.
    """
    runs = sm.runs
    k = max(1, len(allocations))
    thr = float(norm.ppf(1 - alpha / k))
    q = (1 - level) / 2
    end_reps = reps.scores(sm.end_pp, sm.end)
    start_reps = reps.scores(sm.start_pp, sm.start)
    rows = []
    for alloc in allocations:
        mine = runs[runs["allocation"] == alloc]
        if mine.empty:
            continue
        b = float(mine["budget"].max())
        idx = mine.index[mine["budget"] == b].to_numpy()
        start = float(np.mean(sm.start[idx]))
        end = float(np.mean(sm.end[idx]))
        row = dict(allocation=alloc, budget=b, start=start, end=end, n_seeds=len(idx),
                   end_flops=float(np.mean(runs.loc[idx, "end_flops"])), threshold_z=thr, control=None,
                   control_diff=np.nan, control_lo=np.nan, control_hi=np.nan, control_z=np.nan)
        if not np.isfinite(start):
            row.update(gain=np.nan, gain_lo=np.nan, gain_hi=np.nan, gain_z=np.nan, passed=False,
                       reason="no step-0 evaluation to compare with")
            rows.append(row)
            continue
        g = reps.cell_mean(end_reps - start_reps, idx)
        gain = end - start
        row.update(gain=gain, gain_lo=float(np.quantile(g, q)), gain_hi=float(np.quantile(g, 1 - q)),
                   gain_z=_z(gain, g))
        passed = row["gain_z"] > thr
        reason = "" if passed else f"gain {gain:+.3f} is within the noise (z {row['gain_z']:.2f} <= {thr:.2f})"
        model = mine["model"].iloc[0]
        ctl = runs[is_control(runs) & (runs["model"] == model)
                   & np.isclose(runs["budget"].to_numpy(float), b)]
        if len(ctl) and not is_control(mine).iloc[0]:
            cidx = ctl.index.to_numpy()
            d = reps.cell_mean(end_reps, idx) - reps.cell_mean(end_reps, cidx)
            diff = end - float(np.mean(sm.end[cidx]))
            row.update(control=f"random@{model}", control_diff=diff, control_lo=float(np.quantile(d, q)),
                       control_hi=float(np.quantile(d, 1 - q)), control_z=_z(diff, d))
            if passed and not row["control_z"] > thr:
                passed = False
                reason = (f"does not beat the random-reward control beyond the noise "
                          f"({diff:+.3f}, z {row['control_z']:.2f} <= {thr:.2f})")
        row.update(passed=bool(passed), reason=reason)
        rows.append(row)
    return pd.DataFrame(rows, columns=GATE_COLUMNS)


def what_to_change(gate: pd.DataFrame) -> str:
    """Advice when no allocation passes the gate."""
    tips = ["larger pilot budgets or more optimizer steps per cell (the gain grows with steps)",
            "a denser reward (e.g. `rule:partial` partial credit instead of 0/1)",
            "more evaluation problems (a paired difference of d needs about 7.8 x disagreement / d^2 problems)"]
    if len(gate) and gate["n_seeds"].min() < 3:
        tips.append("3 or more seeds per cell")
    return "; ".join(tips)
