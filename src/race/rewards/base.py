"""The reward interface every reward system implements, and its output record.

A reward system turns (problem, completion text) pairs into scalar rewards, and says what
it executed: ``components`` holds ``reward/...`` FLOPs in the ledger's keys (0 for
rule-based and random rewards), computed from the tokens it actually scored. Verified
correctness rides along for diagnostics (over-optimisation of a learned RM shows as the
reward rising while ``verified`` falls).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclass
class RewardOutput:
    rewards: list[float]  # what the policy is trained on, one per completion
    verified: list[float]  # 0/1 verified final-answer correctness, one per completion
    components: dict[str, int] = field(default_factory=dict)  # reward/<component> -> FLOPs executed
    tokens: int = 0  # tokens the reward model processed (0 for rules)
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def flops(self) -> int:
        return sum(self.components.values())


@runtime_checkable
class RewardFunction(Protocol):
    """What the engines call. ``kind`` is rule | random | orm | prm | judge."""

    name: str
    kind: str

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput: ...

    def step_bound(self, n_sequences: int, max_prompt_len: int, max_completion_len: int, *,
                   problems: Sequence[Any] | None = None) -> int:
        """An upper bound of the reward FLOPs for one step of ``n_sequences`` (budget check).
        ``max_prompt_len`` is the policy's (possibly truncated) prompt length; ``problems``,
        when given, are the step's problems, whose full prompts a reward model reads."""
        ...


def reward_bound(reward: Any, n_sequences: int, max_prompt_len: int, max_completion_len: int,
                 problems: Sequence[Any] | None = None) -> int:
    """``reward.step_bound(...)`` with the step's ``problems`` when the reward takes them
    (a reward registered before ``problems`` existed is called without)."""
    import inspect

    try:
        takes = "problems" in inspect.signature(reward.step_bound).parameters
    except (TypeError, ValueError):
        takes = False
    if takes and problems is not None:
        return int(reward.step_bound(n_sequences, max_prompt_len, max_completion_len, problems=problems))
    return int(reward.step_bound(n_sequences, max_prompt_len, max_completion_len))
