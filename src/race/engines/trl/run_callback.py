"""The run's own bookkeeping inside TRL's training loop: metrics rows, evaluations at their
FLOP schedule and where a run of each smaller budget would stop (``eval.at_budgets``),
divergence, and the state a checkpoint needs to resume. It runs after the
ledger callback (``race.engines.trl.callback``) has charged the step, reads that ledger, and
calls nothing back: the engine builds it, hands it what it needs, and reads it at the end."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from race.engines.common import EvalSchedule, Progress, RunDir
from race.engines.run_io import MetricsLog, write_json_atomic

#: The file in each TRL checkpoint that holds RACE's resume state.
RACE_STATE = "race_state.json"


class RunCallback(TrainerCallback):
    """Metrics, evaluation and resumable state of one ``TrlEngine`` run."""

    def __init__(self, out: RunDir, *, ledger_cb: Any, reward_fn: Any, reward: Any, evaluator: Any,
                 schedule: EvalSchedule, progress: Progress | None = None) -> None:
        self.out, self.ledger_cb, self.reward_fn, self.reward = out, ledger_cb, reward_fn, reward
        self.evaluator, self.schedule, self.progress = evaluator, schedule, progress
        self.model: Any = None  # the trainer's model (attach)
        self.metrics: MetricsLog | None = None
        self.steps = 0
        self.diverged: str | None = None

    def attach(self, trainer: Any) -> None:
        """Evaluate ``trainer``'s model (built after this callback, which it is handed)."""
        self.model = trainer.model

    def evaluate(self, step: int) -> None:
        """Run the evaluation targets (hooks paused: evaluation is not training)."""
        assert self.metrics is not None and self.ledger_cb.ledger is not None
        with self.ledger_cb.tracker.paused():
            self.schedule.evaluate(self.evaluator, self.model, self.ledger_cb.ledger, self.metrics, step)

    def reach_budgets(self, state: Any) -> None:
        """Before the next optimizer step: evaluate where a run of each smaller budget
        (``eval.at_budgets``) would stop, by the rule the ledger callback's budget stop
        follows (the next step's bound, ``race.accounting.guard.stops_before``): the
        built-in engine's ``EvalSchedule.reach_budgets``, at TRL's steps. Not past
        ``max_steps`` (the built-in engine stops there before it reads a budget)."""
        step = int(state.global_step)
        if not self.schedule.at_budgets or (state.max_steps and step >= state.max_steps):
            return
        cb = self.ledger_cb
        assert self.metrics is not None and cb.ledger is not None and cb.ledgers is not None
        bound = cb.ledgers.global_bound(cb.next_step_bound(state))
        with cb.tracker.paused():
            self.schedule.reach_budgets(self.evaluator, self.model, cb.ledger, self.metrics, step, bound)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        self.steps = step
        self.metrics = MetricsLog(self.out.path / "metrics.jsonl")
        self.metrics.truncate_after(step)
        if step == 0:
            self.schedule.last_step, self.schedule.next_at = -1, 0.0
            self.evaluate(0)
        self.reach_budgets(state)  # on a resume too: an extension may pass a smaller budget where it resumes

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs or state.global_step <= self.steps:
            return
        led = self.ledger_cb.ledger
        assert led is not None and self.metrics is not None
        step = int(state.global_step)
        loss = float(logs["loss"])
        row = {"kind": "train", "step": step, "flops": led.total, **self.reward_fn.last, "loss": loss,
               "clip_frac": float(logs.get("clip_ratio/region_mean", 0.0)), "kl": float(logs.get("kl", 0.0)),
               "lr": float(logs.get("learning_rate", 0.0))}
        self.metrics.append([row])
        if not math.isfinite(loss):
            self.diverged = f"non-finite loss ({loss}) at step {step}; kept the last good checkpoint"
            control.should_training_stop = True
            control.should_save = False  # keep the last good checkpoint (save_total_limit=1 would drop it)
            return
        if self.schedule.due(led.total):
            self.evaluate(step)
        self.reach_budgets(state)
        self.steps = step
        if self.progress:
            self.progress({"step": step, "flops": led.total, "budget": self.out.cfg.budget_flops, **row})

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if ckpt.is_dir():
            write_json_atomic(ckpt / RACE_STATE, self.out.checkpoint_meta(self.schedule, self.reward))
