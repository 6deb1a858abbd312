"""What the warm-start and reward-model recipes share."""

from __future__ import annotations

import math
from typing import Any


class RecipeSchedule:
    """A mixin without fields, so the recipes' dataclass fields and cache hashes stay their
    own: checks of ``steps``, ``batch_size`` and ``warmup_steps``, the task from its
    description, and the learning-rate schedule. Needs ``steps, batch_size, warmup_steps,
    learning_rate, min_lr_ratio, task`` on the dataclass (and ``seed, betas,
    weight_decay, max_grad_norm`` for :func:`race.builds.train.optimise`)."""

    steps: int
    batch_size: int
    warmup_steps: int
    learning_rate: float
    min_lr_ratio: float
    task: dict[str, Any]

    def _check_schedule(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"{type(self).__name__} needs steps >= 1 and batch_size >= 1, "
                             f"got {self.steps}, {self.batch_size}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} must lie in 0..steps ({self.steps})")

    def make_task(self) -> Any:
        from race.tasks.arith import ArithTask

        return ArithTask.from_description(self.task)

    def lr_at(self, step: int) -> float:
        """Learning rate at optimizer step ``step`` (0-based): linear warmup, then cosine
        from ``learning_rate`` down to ``min_lr_ratio * learning_rate``."""
        if step < self.warmup_steps:
            return self.learning_rate * (step + 1) / self.warmup_steps
        span = max(1, self.steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        cos = 0.5 * (1 + math.cos(math.pi * progress))
        return self.learning_rate * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cos)
