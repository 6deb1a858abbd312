"""The racing protocol's settings (``protocol: race`` in a grid file): rungs toward the target.

```yaml
protocol: race
budgets: [2.0e+10]                   # optional: where the first rung is also read (nested), below it
seeds: [0]                           # the first rung's seeds (1 is the default design: reach beats seeds)
race:
  target_budget: 2.0e+12             # T: the expensive run the study plans
  rungs: auto                        # (default) sized by the grid and the cap: race.spec.rungs.choose_schedule;
                                     # or fractions of T, ascending, the last 2-3x below T: [1/64, 1/8, 1/3]
  later_seeds: 1                     # seeds that go on past the first rung (the first ones listed)
  pilot_targets: [greedy]            # what the rungs evaluate (default: eval.targets[0], what decisions read);
                                     # the target run evaluates every target of eval:
  rule: {floor_steps: 5}             # overrides of race.analysis.racing.RacingRule, by field name
```

With ``rungs: auto`` the protocol chooses the rungs for this grid (``race.protocol.racing.
race_schedule``: successive-halving keep counts down to ``rule.keep_last`` allocations on the
last rung, the largest first rung whose worst case fits the cap on unreused pilot compute,
each allocation's first rung raised to where it has taken its warmup + ``rule.floor_steps``
optimizer steps); ``race grid plan`` prints the schedule and its cost, and says what to cut
when the grid is too large for the cap. The first rung runs every allocation with every
seed, nested (evaluated where a run of each of ``budgets`` would stop). After each rung the
racing rule says which allocations go on (``race.protocol.racing``); each goes on by
*extending* its first ``later_seeds`` runs: the next rung's run resumes the last checkpoint
of the previous rung's run with the larger budget at the same constant learning rate, so the
shorter run is a prefix of the longer one (same steps, FLOPs and outcomes) and nothing is
charged twice. After the last rung the pick's continued run is the start of the target run
(``race validate`` continues it to T).

Refused, with what to change: rungs that are not ``auto`` nor ascending fractions in (0, 1)
whose last is 2-3x below T, explicit rungs with ``budgets`` that are neither below the first
rung nor a rung's budget, ``later_seeds`` beyond the seeds, ``gang: true``; per cell
(``race.spec.cells.prefix_refusal``): a decaying learning rate, several optimizer steps per
generation on the TRL engine, and an evaluation schedule that depends on the run's own budget.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from race.accounting.guard import is_budget

#: The last rung's budget must lie this many times below the target budget (inclusive).
LAST_RUNG_REACH = (2.0, 3.0)
RUNG_RTOL = 1e-6  # budgets closer than this (relative) are the same budget


class RaceSettings(BaseModel):
    """``race:`` of a grid file with ``protocol: race`` (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    target_budget: float = Field(..., description="T: FLOPs of the expensive run the study plans")
    rungs: Literal["auto"] | list[float] = Field("auto", description="auto: sized by the grid and the cap "
                                                 "(race.spec.rungs); or rung budgets as fractions of T, ascending "
                                                 "(numbers or 'a/b' strings), the last 2-3x below T")
    later_seeds: int = Field(1, ge=1, description="seeds that go on past the first rung: the first ones of seeds:")
    pilot_targets: list[Literal["greedy", "pass@k", "pass@1", "hard"]] | None = Field(
        None, description="the targets the rungs' runs evaluate (default: the primary target only, what the "
        "decisions read); the target run evaluates every target of eval:")
    rule: dict[str, Any] = Field(default_factory=dict, description="overrides of the racing rule's parameters "
                                 "(race.analysis.racing.RacingRule fields), by name")

    @field_validator("target_budget")
    @classmethod
    def _target(cls, v: float) -> float:
        if not is_budget(v):
            raise ValueError(f"race.target_budget must be a positive number of FLOPs, got {v!r}")
        return float(v)

    @field_validator("rungs", mode="before")
    @classmethod
    def _fractions(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip() == "auto":
            return "auto"
        if not isinstance(v, list):
            return v
        out = []
        for x in v:
            try:
                out.append(float(Fraction(x.replace(" ", ""))) if isinstance(x, str) else x)
            except (ValueError, ZeroDivisionError):
                raise ValueError(f"race.rungs: {x!r} is not a fraction of the target budget; write 0.125 or '1/8'")
        return out

    @field_validator("rungs")
    @classmethod
    def _rungs(cls, v: "list[float] | str") -> "list[float] | str":
        if v == "auto":
            return v
        if not v:
            raise ValueError("race.rungs is empty: write rungs: auto, or fractions of T such as [1/64, 1/8, 1/3]")
        bad = [f for f in v if not (math.isfinite(f) and 0 < f < 1)]
        if bad:
            raise ValueError(f"race.rungs {v}: each rung is a fraction of the target budget in (0, 1), e.g. "
                             "[1/64, 1/8, 1/3]; the target run itself is not a rung")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"race.rungs {v}: list the rungs in ascending order, each larger than the one before")
        lo, hi = LAST_RUNG_REACH
        reach = 1 / v[-1]
        if not lo * (1 - RUNG_RTOL) <= reach <= hi * (1 + RUNG_RTOL):
            raise ValueError(f"race.rungs: the last rung is {v[-1]:.4g} of the target budget, {reach:.3g}x below it: "
                             f"put it {lo:g}-{hi:g}x below the target (between 1/{hi:g} and 1/{lo:g}), so the pick "
                             "is decided at short reach and its pilot is a real share of the target run")
        return v

    @property
    def explicit(self) -> bool:
        """Whether the grid file lists its rungs (else ``auto``: the study's schedule sizes them)."""
        return self.rungs != "auto"

    def rung_budgets(self) -> list[float]:
        """The listed rungs' budgets in FLOPs, ascending (``rungs: auto`` has none until the study's
        schedule is chosen: ``race.protocol.racing.race_schedule``)."""
        if not self.explicit:
            raise ValueError("rungs: auto: the rungs come from the study's schedule (race.protocol.racing."
                             "race_schedule), not from the grid file")
        return [f * self.target_budget for f in self.rungs]


def same_budget(a: float, b: float) -> bool:
    return abs(a - b) <= RUNG_RTOL * max(abs(a), abs(b))


def race_budgets(race: RaceSettings, budgets: list[float], seeds: list[int], gang: bool) -> list[float]:
    """Check a racing grid's ``budgets``, ``seeds`` and ``gang`` against its ``race:`` and
    return the study's budgets: the first rung's reads (``budgets`` below the first rung) and,
    for listed rungs, every rung's budget, ascending. Raises ValueError saying what to change."""
    if not seeds:
        raise ValueError("seeds is empty: list the first rung's seeds (1 is the default design: [0])")
    if race.later_seeds > len(seeds):
        raise ValueError(f"race.later_seeds={race.later_seeds} but seeds lists {len(seeds)}: the seeds that go on "
                         "are the first-rung runs they extend; lower later_seeds or add seeds")
    if gang:
        raise ValueError("gang: true does not combine with protocol: race (a rung extends single runs from their "
                         "checkpoints, which gangs do not do): set gang: false")
    if not race.explicit:
        return sorted(set(budgets))
    rungs = race.rung_budgets()
    bad = [b for b in budgets if b >= rungs[0] * (1 - RUNG_RTOL) and not any(same_budget(b, r) for r in rungs)]
    if bad:
        raise ValueError(
            f"budgets {bad} contradict the rungs: in a racing grid budgets lists where the first rung is also read "
            f"(below its {rungs[0]:.4g} FLOPs) and may repeat a rung's budget ({', '.join(f'{r:.4g}' for r in rungs)}); "
            "the rungs come from race.rungs x race.target_budget: drop these budgets or change the rungs")
    reads = [b for b in budgets if b < rungs[0] * (1 - RUNG_RTOL)]
    return sorted(set(reads)) + rungs


__all__ = ["LAST_RUNG_REACH", "RUNG_RTOL", "RaceSettings", "race_budgets", "same_budget"]
