"""The built-in engine's lifecycle, declared: what ``BuiltinEngine.setup()`` builds for a run
(:class:`BuiltinState`, fixed for the run's length) and where the run's results go once it
knows where it starts (:class:`RunBooks`: ledger, budget guard, metrics, the lr schedule's
length, the step it resumed from).

A run goes: ``begin()`` (the run directory, then ``setup()``'s state) -> its resume point
(a checkpoint's weights, optimizer and schedule restored; ledger and metrics cut back) ->
``open_books()`` -> steps -> finish. The gang engine drives each member through the same
methods; nothing sets an engine's attributes from outside (``tests/test_layers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from race.accounting import BudgetGuard, FlopLedger, LoRA, ModelShape, StepPlan
from race.engines.run_io import MetricsLog


@dataclass(frozen=True)
class BuiltinState:
    """A run's models and the objects built around them, fixed for the run's length."""

    model: Any  # the policy: LoRA-wrapped when cfg.lora is set; trained in place
    ref_model: Any  # a frozen copy of the base for full fine-tuning with beta != 0, else None (the adapter off)
    tok: Any  # the policy's tokenizer
    lora: LoRA | None  # the accounting's LoRA (rank, targets), checked against the shape
    shape: ModelShape  # the policy's shape, for every FLOP charge
    device: Any  # where the policy lives
    task: Any  # the run's task (training prompts, evaluation problems)
    reward: Any  # the run's reward system (race.rewards)
    optimizer: Any  # AdamW over the trainable parameters
    evaluator: Any  # the run's evaluation targets (race.engines.evaluation.Evaluator)
    step_plan: StepPlan  # a step's shapes and settings: what the accounting charges per phase
    share_prompts: bool  # the learning passes run each prompt once per group (fast_forward.supports)
    recompute_early_stop: bool  # torch's non-reentrant checkpointing stops its recompute early


@dataclass(frozen=True)
class RunBooks:
    """Where a run's results go, opened once the run knows where it starts."""

    ledger: FlopLedger  # every FLOP the run executed (race.accounting.ledger)
    guard: BudgetGuard  # every budget decision of the run, over ``ledger``
    metrics: MetricsLog  # training and evaluation rows
    total_steps: int  # steps the budget buys: the lr schedule's length
    resumed_from: int | None  # the checkpoint's step when the run resumed, else None


__all__ = ["BuiltinState", "RunBooks"]
