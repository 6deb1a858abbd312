"""The budget's vocabulary: the phases a GRPO step is charged to, and the split of those
phases into search, learning and feedback (the report card's three axes). One home,
imported everywhere else (``tests/test_layers.py`` fails on a copy)."""

from __future__ import annotations

from typing import Mapping

PHASES = ("rollout", "old_logprobs", "reference", "reward", "update")  # the phases a budget is charged
#: The counted phases by axis of the budget's split (search / learning / feedback).
SPLIT = {"search": ("rollout",), "learning": ("update", "old_logprobs", "reference"), "feedback": ("reward",)}
#: The runs-table column holding each axis's FLOPs (the rollout column is the search axis).
SPLIT_COLUMNS = {"search": "rollout_flops", "learning": "learning_flops", "feedback": "feedback_flops"}


def split_sums(phase_flops: Mapping[str, int]) -> dict[str, int]:
    """FLOPs per axis of the budget's split from FLOPs per phase: each axis of :data:`SPLIT`
    sums its phases in order (search = rollout, learning = update + old_logprobs + reference,
    feedback = reward), exactly in the type given (ints stay exact)."""
    return {axis: sum(phase_flops[p] for p in phases) for axis, phases in SPLIT.items()}


__all__ = ["PHASES", "SPLIT", "SPLIT_COLUMNS", "split_sums"]
