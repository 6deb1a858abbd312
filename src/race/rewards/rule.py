"""Rule-based rewards (0 accelerator FLOPs): final-answer verification, partial credit,
format, weighted combinations; and the random-reward control.

Verification parses the completion (``race.tasks.verify``) and never evaluates it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from race.rewards.base import RewardOutput
from race.rewards.text import verify_terms as _verify


@dataclass
class RuleReward:
    """Weighted sum of rule-based terms: ``outcome`` (0/1 final answer), ``partial``
    ((valid steps + correct answer) / (ops + 1)) and ``format`` (exact layout)."""

    weights: dict[str, float] = field(default_factory=lambda: {"outcome": 1.0})
    name: str = "rule"
    kind: str = "rule"

    def __post_init__(self) -> None:
        bad = set(self.weights) - {"outcome", "partial", "format"}
        if bad:
            raise ValueError(f"rule reward terms {sorted(bad)} unknown; use outcome, partial, format")

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput:
        t0 = time.perf_counter()
        rewards, verified = [], []
        for p, c in zip(problems, completions, strict=True):
            outcome, partial, fmt = _verify(p, c)
            terms = {"outcome": outcome, "partial": partial, "format": fmt}
            rewards.append(sum(w * terms[k] for k, w in self.weights.items()))
            verified.append(outcome)
        return RewardOutput(rewards, verified, seconds=time.perf_counter() - t0)

    def step_bound(self, n_sequences: int, max_prompt_len: int, max_completion_len: int, *,
                   problems: Sequence[Any] | None = None) -> int:
        return 0


@dataclass
class RandomReward:
    """Control run: each completion's reward is a coin flip (Bernoulli(p)), independent of
    the text, at the same cost as a rule (0 FLOPs). Gains under this reward are not due to
    the reward signal. Seeded per call from (seed, call index) for determinism."""

    seed: int = 0
    p: float = 0.5
    name: str = "random"
    kind: str = "random"
    _calls: int = 0

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput:
        rng = random.Random(f"{self.seed}:{self._calls}")
        self._calls += 1
        rewards = [1.0 if rng.random() < self.p else 0.0 for _ in completions]
        verified = [_verify(p, c)[0] for p, c in zip(problems, completions, strict=True)]
        return RewardOutput(rewards, verified)

    @property
    def call_index(self) -> int:
        """Calls scored so far: the index of the next call's stream (a checkpoint stores it)."""
        return self._calls

    def set_call_index(self, i: int) -> None:
        """Resume support: continue the random stream at call ``i``."""
        self._calls = i

    def step_bound(self, n_sequences: int, max_prompt_len: int, max_completion_len: int, *,
                   problems: Sequence[Any] | None = None) -> int:
        return 0
