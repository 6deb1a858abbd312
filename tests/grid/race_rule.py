"""A small deterministic racing rule for the driver's tests (the real one is
``race.analysis.racing.rung_decision``): at each rung, the allocations whose mean final
greedy score at the rung's budget is in the upper half go on (the best one at the last rung).
Same signature and result shape as the real rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Decision:
    data: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.data)


def top_half(runs: Any, evals: Any, *, schedule: Any, rung: int, target: str = "greedy", rule: Any = None,
             seed: int = 0, condition: Any = None) -> Decision:
    from race.analysis import prepare_runs

    rung_budgets, target_budget = list(schedule.budgets), schedule.target_budget
    budget = rung_budgets[rung]
    p = prepare_runs(runs)
    at = p[np.isclose(p["budget"].astype(float), budget, rtol=1e-9)]
    ev = evals[(evals["target"] == target) & evals["run_id"].isin(set(at["run_id"]))]
    last = ev.sort_values("step").groupby("run_id")["score"].last()
    means = at.assign(score=at["run_id"].map(last)).groupby("allocation")["score"].mean()
    ranked = sorted(means.index, key=lambda a: (-means[a], a))
    final = rung == len(rung_budgets) - 1
    go_on = ranked[:1] if final else ranked[: max(1, (len(ranked) + 1) // 2)]
    return Decision({"rung": rung, "budget": budget, "next_budget": None if final else rung_budgets[rung + 1],
                     "target_budget": target_budget, "go_on": list(go_on), "leader": ranked[0],
                     "stopped": {a: "lower half" for a in ranked if a not in go_on},
                     "rows": [{"allocation": a, "observed": float(means[a]),
                               "decision": "go on" if a in go_on else "stop"} for a in ranked],
                     "rule": {"kind": "top half"}})
