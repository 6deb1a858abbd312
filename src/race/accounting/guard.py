"""The budget guard: the one owner of "the budget is never exceeded". Standard library only.

Every budget decision of RACE is made here, from the same numbers, for the planner
(``race plan``, ``race flops``, ``race grid plan``), the built-in engine and the TRL
callback:

- **what counts** (:func:`counted`): a ``phase/component`` FLOP count is charged to the
  budget unless its phase is one of :data:`UNCOUNTED_PHASES` (``recompute`` hardware
  FLOPs, ``eval``, ``warmstart``, ``overrun``, ``executed``). The ledger marks its records with the same
  rule (``LedgerRecord.counted``).
- **a budget** (:func:`check_budget`): a finite number of FLOPs > 0.
- **whether FLOPs fit** (:func:`fits`): ``spent + flops <= budget``; no budget fits anything.
- **the steps a budget buys** (:func:`steps_bought`; :func:`steps_in_budget` for a run,
  which refuses a budget that buys no step): ``floor(budget / step_flops)``, capped by
  ``max_steps``.
- **a step's bound** (:func:`step_bound`, :func:`plan_step_bound`): the policy's counted
  FLOPs at the maximum lengths plus the reward's bound; every engine's decisions take it.
- **where a smaller budget stops** (:func:`stops_before`): the stop rule for a run's
  prefix standing in for a run of a smaller budget.
- **the stop** (:class:`BudgetGuard`): before a step, the step's upper bound must fit, or
  the run stops; once a step's exact cost is known, the part still to run must fit with
  what ran, or what ran is recorded as uncounted ``overrun`` and the run stops; a charge
  the ledger would refuse is recorded as ``overrun`` and the run stops. Every stop is a
  clean ``budget`` stop (:attr:`BudgetGuard.stop_reason`). A budget that cannot take even
  the first step is refused (:meth:`BudgetGuard.check_first_step`).

The one object the per-step formulas take is :class:`StepPlan` (``race.accounting.grpo``, re-exported
here): a step's model shape and settings (group size, LoRA, iterations, beta, recompute, shared
prompts, reward system, conventions), so the engines and the planner pass one value instead of ten.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .errors import AccountingError
from .grpo import StepPlan  # re-exported: the step's settings the formulas take live with them

#: Phases recorded in a ledger but never charged to the budget.
UNCOUNTED_PHASES = ("recompute", "eval", "warmstart", "overrun", "executed")
BUDGET_STOP = "budget"


class BudgetExceededError(AccountingError):
    """Charging a record would take the counted total past the budget."""


# -- the rules ------------------------------------------------------------------------------
def is_counted(key: str) -> bool:
    """Whether a ``phase/component`` key (or a bare phase) is charged to the budget."""
    return key.partition("/")[0] not in UNCOUNTED_PHASES


def counted(components: dict[str, int]) -> int:
    """FLOPs of ``phase/component`` entries the budget is charged: every phase but
    :data:`UNCOUNTED_PHASES`."""
    return sum(int(v) for k, v in components.items() if is_counted(k))


def is_budget(budget: Any) -> bool:
    """Whether ``budget`` is a FLOP budget: a finite number > 0."""
    try:
        value = float(budget)
    except (TypeError, ValueError):
        return False
    return math.isfinite(value) and value > 0


def check_budget(budget: Any, name: str = "budget") -> float:
    """``budget`` as a float when it is a finite FLOP count > 0; else ``AccountingError``
    saying so (``name`` is the setting's name in the message)."""
    if not is_budget(budget):
        raise AccountingError(f"{name} must be > 0 and finite (a FLOP count), got {budget!r}")
    return float(budget)


def fits(spent: float, flops: float, budget: float | None) -> bool:
    """Whether ``flops`` more FLOPs fit a budget of which ``spent`` is spent
    (``spent + flops <= budget``); ``None``: no budget, everything fits."""
    return budget is None or spent + flops <= budget


def overspent(spent: float, budget: float | None) -> bool:
    """Whether a finished run counted more than its budget (``not fits(spent, 0, budget)``):
    a run trained outside RACE (``race import``) whose stated budget it did not keep."""
    return not fits(spent, 0.0, budget)


def reaches(flops: float, budget: float) -> bool:
    """Whether ``flops`` reach ``budget`` (``flops >= budget``): a lower bound of what is
    planned that reaches the budget leaves room for nothing more (the TRL engine's dataset
    stops growing once its batches' floors reach it)."""
    return flops >= budget


def steps_bought(budget: float, step_flops: float, max_steps: int | None = None) -> int:
    """``floor(budget / step_flops)`` whole steps (0 when not even one fits), at most
    ``max_steps`` when given."""
    if not step_flops > 0:
        raise AccountingError(f"a step must cost > 0 FLOPs, got {step_flops!r}")
    n = int(budget // step_flops)
    return min(n, max_steps) if max_steps else n


def steps_in_budget(budget: float, step_flops: float, max_steps: int | None = None, *,
                    run: str | None = None) -> int:
    """The steps a run's budget buys at ``step_flops`` FLOPs a step (an engine's lr
    schedule length, a dry run's step count): :func:`steps_bought`, at most ``max_steps``.
    Refuses a budget that is not one or that buys not even one step, saying what one step
    costs (and naming ``run``, when given)."""
    check_budget(budget)
    n = steps_bought(budget, step_flops)
    if n < 1:
        msg = (f"budget {budget:.4g} FLOPs is smaller than one step ({step_flops:.4g} FLOPs); "
               f"raise the budget to at least {step_flops:.4g} or shrink the step (prompts, group, lengths)")
        raise AccountingError(f"run {run!r}: {msg}" if run is not None else msg)
    return min(n, max_steps) if max_steps else n


# -- the step bound and the budgets it stops -------------------------------------------------------
#: A reward's FLOP bound for one generation: ``f(sequences, max prompt len, max completion len)``.
RewardBound = Callable[[int, int, int], int]


def step_bound(policy: int, reward: RewardBound | None, sequences: int, prompt_len: int, completion_len: int) -> int:
    """The bound every budget decision takes for one generation of a step: ``policy`` (the
    counted FLOPs of the policy's passes at the maximum lengths: ``StepPlan.bound``,
    ``trl_batch_bound``, a TRL generation) + ``reward(sequences, prompt_len,
    completion_len)``, the reward's bound for its ``sequences`` sequences at those lengths
    (``None``: a reward that spends no FLOPs)."""
    return int(policy) + (int(reward(sequences, prompt_len, completion_len)) if reward is not None else 0)


def plan_step_bound(plan: StepPlan, prompts: int, prompt_len: int, completion_len: int,
                    reward: RewardBound | None) -> int:
    """:func:`step_bound` of a step of ``plan`` (the built-in engine's): ``prompts`` prompts
    at ``prompt_len`` tokens, every completion at ``completion_len``, no group dropped
    (:meth:`StepPlan.bound`), plus the reward's bound for its ``prompts * num_generations``
    sequences."""
    return step_bound(plan.bound(prompts, prompt_len, completion_len), reward, prompts * plan.num_generations,
                      prompt_len, completion_len)


def stops_before(budget: float, spent: float, bound: float) -> bool:
    """Whether a run of budget ``budget`` that has spent ``spent`` counted FLOPs stops
    before a step bounded by ``bound`` (:meth:`BudgetGuard.may_start`'s rule: the bound
    does not fit). Where a longer run stands in for the run of a smaller budget (its
    prefix, ``eval.at_budgets``)."""
    return not fits(spent, bound, budget)


# -- the stop ---------------------------------------------------------------------------------
def record_overrun_step(ledger, step: int, components: dict[str, int], *, tokens: dict[str, int] | None = None,
                        seconds: dict[str, float] | None = None) -> int:
    """Record a step the budget could not take: its FLOPs as uncounted ``overrun``, except
    its ``executed/*`` records (what part of a charge really ran, never charged), which
    are kept as they are. Returns the FLOPs recorded as ``overrun``."""
    kept = {k: v for k, v in components.items() if k.startswith("executed/")}
    over = ledger.record_overrun(step, {k: v for k, v in components.items() if k not in kept}, tokens=tokens,
                                 seconds=seconds)
    if kept:
        ledger.add_components(step, kept, tokens=tokens)
    return int(over)


class BudgetGuard:
    """The budget decisions of one run over its ledger (a ``FlopLedger``: ``total``,
    ``budget``, ``add_components``, ``record_overrun``). See the module docstring.

    ``stop_reason`` is ``"budget"`` once the guard has stopped the run, else ``None``."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.stop_reason: str | None = None

    @property
    def budget(self) -> float | None:
        return self.ledger.budget

    def fits(self, flops: float) -> bool:
        """Whether ``flops`` more counted FLOPs fit what is left of the budget."""
        return fits(self.ledger.total, flops, self.ledger.budget)

    def steps_bought(self, step_bound: float, max_steps: int | None = None, *, run: str | None = None) -> int:
        """Steps the (whole) budget buys at ``step_bound`` FLOPs a step, at most
        ``max_steps``; refuses a budget smaller than one step (naming ``run``)."""
        if self.budget is None:
            raise AccountingError("no budget: steps_bought needs a ledger with a budget")
        return steps_in_budget(self.budget, step_bound, max_steps, run=run)

    def check_first_step(self, step_bound: float, *, step: str = "one step",
                         shrink: str = "prompts, group, lengths") -> None:
        """Before a run's first step (or the first after a resume): refuses, with an
        ``AccountingError`` saying what to change, a budget whose remaining part cannot take
        one ``step`` bounded by ``step_bound`` (``shrink``: the settings that make it
        smaller)."""
        if not self.fits(step_bound):
            raise AccountingError(
                f"budget {self.budget:.4g} FLOPs ({self.ledger.remaining:.4g} left) is smaller than {step} "
                f"({step_bound:.4g} FLOPs at the maximum lengths); raise the budget or shrink the step ({shrink})")

    def _stop(self) -> bool:
        self.stop_reason = BUDGET_STOP
        return False

    def may_start(self, step_bound: float) -> bool:
        """Before a step: True when a step costing up to ``step_bound`` fits; False stops
        the run (a clean budget stop)."""
        return True if self.fits(step_bound) else self._stop()

    def may_continue(self, step: int, ran: dict[str, int], to_run: dict[str, int] | None = None, *,
                     tokens: dict[str, int] | None = None, seconds: dict[str, float] | None = None) -> bool:
        """A step's exact cost is known before its last phases run: ``ran`` executed,
        ``to_run`` would. True when both fit; else ``ran`` is recorded as uncounted
        ``overrun`` and the run stops (False)."""
        if self.fits(counted(ran) + counted(to_run or {})):
            return True
        self.ledger.record_overrun(step, ran, tokens=tokens, seconds=seconds)
        return self._stop()

    def charge(self, step: int, components: dict[str, int], *, tokens: dict[str, int] | None = None,
               seconds: dict[str, float] | None = None) -> int:
        """Charge a step's ``phase/component`` FLOPs. Returns 0; or, when the budget cannot
        take them (a bound was low), records them as uncounted ``overrun``, stops the run
        and returns the FLOPs recorded."""
        try:
            if not self.fits(counted(components)):
                raise BudgetExceededError("the step does not fit")
            self.ledger.add_components(step, components, tokens=tokens, seconds=seconds)
            return 0
        except BudgetExceededError:
            over = record_overrun_step(self.ledger, step, components, tokens=tokens, seconds=seconds)
            self._stop()
            return int(over)

    def stop_after(self, overrun: int, next_bound: Callable[[], float], control: Any = None) -> bool:
        """After a step was charged (``overrun``: what :meth:`charge` returned): True when
        the run stops, because the step overran or the next step's bound
        (``next_bound()``, called only when needed) does not fit. ``control`` (a
        transformers ``TrainerControl``) gets ``should_training_stop`` set."""
        stop = bool(overrun) or not self.fits(next_bound())
        if stop:
            self._stop()
            if control is not None:
                control.should_training_stop = True
        return stop


__all__ = ["BUDGET_STOP", "BudgetExceededError", "BudgetGuard", "StepPlan", "UNCOUNTED_PHASES", "check_budget",
           "counted", "fits", "is_budget", "overspent", "reaches", "is_counted", "record_overrun_step", "steps_bought",
           "steps_in_budget",
           "RewardBound", "plan_step_bound", "step_bound", "stops_before"]
