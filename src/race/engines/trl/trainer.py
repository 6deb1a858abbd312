"""``GRPOTrainer`` with the built-in engine's learning-rate schedule."""

from __future__ import annotations

from typing import Any, Callable


def trainer_class() -> Any:
    """``RaceGRPOTrainer``: a ``GRPOTrainer`` whose scheduler is ``LambdaLR(lr_factor)``
    (warmup, then constant/cosine/linear over the steps the budget buys, per batch of
    prompts), ``lr_factor`` given to the constructor. Built on call: trl imports slowly."""
    from torch.optim.lr_scheduler import LambdaLR
    from trl import GRPOTrainer

    class RaceGRPOTrainer(GRPOTrainer):
        def __init__(self, *args: Any, lr_factor: Callable[[int], float], **kwargs: Any) -> None:
            self.race_lr_factor = lr_factor
            super().__init__(*args, **kwargs)

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None:
                self.lr_scheduler = LambdaLR(optimizer or self.optimizer, self.race_lr_factor)
                self._created_lr_scheduler = True
            return self.lr_scheduler

    return RaceGRPOTrainer
