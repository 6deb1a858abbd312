"""The optimizer loop the warm-start and reward-model trainers share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def optimise(model: Any, recipe: Any, loss_at: Callable[[int], Any],
             progress: Callable[[int, int, float], None] | None = None) -> float:
    """``recipe.steps`` AdamW steps on ``model`` (in place; train mode during, eval after):
    ``loss_at(step)`` draws step ``step``'s batch and returns its loss; the learning rate
    follows ``recipe.lr_at``, gradients are clipped to ``recipe.max_grad_norm``.
    ``progress(step, steps, loss)`` after every step. Returns the mean loss of the last 5%
    of steps. Deterministic under ``recipe.seed`` (same threads)."""
    import torch

    torch.manual_seed(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, betas=recipe.betas,
                            weight_decay=recipe.weight_decay)
    model.train()
    tail, tail_n = 0.0, max(1, recipe.steps // 20)
    for step in range(recipe.steps):
        for g in opt.param_groups:
            g["lr"] = recipe.lr_at(step)
        loss = loss_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        opt.step()
        value = float(loss.detach())
        if step >= recipe.steps - tail_n:
            tail += value / tail_n
        if progress is not None:
            progress(step + 1, recipe.steps, value)
    model.eval()
    return tail
