"""Rule-based rewards (0 accelerator FLOPs): final-answer verification, partial credit,
format, weighted combinations; and the random-reward control.

Verification parses the completion (``race.tasks.verify``) and never evaluates it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from race.accounting.reward_kinds import RULE_TERMS
from race.rewards.base import RewardOutput
from race.rewards.rule_terms import outcome, rule_terms


@dataclass
class RuleReward:
    """Weighted sum of rule terms (``race.accounting.reward_kinds.RULE_TERMS``, each scored
    by its row's scorer in ``race.rewards.rule_terms``): ``outcome`` (0/1 final answer),
    ``partial`` ((valid steps + correct answer) / (ops + 1)), ``format`` (the answer
    format, whatever its values)."""

    weights: dict[str, float] = field(default_factory=lambda: {"outcome": 1.0})
    name: str = "rule"
    kind: str = "rule"

    def __post_init__(self) -> None:
        terms = [t for t, row in RULE_TERMS.items() if row.in_rule]
        bad = set(self.weights) - set(terms)
        if bad:
            raise ValueError(f"rule reward terms {sorted(bad)} unknown; use {', '.join(terms)}")

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput:
        t0 = time.perf_counter()
        rewards, verified = [], []
        for p, c in zip(problems, completions, strict=True):
            terms = rule_terms(p, c, list(self.weights))
            rewards.append(sum(w * terms[k] for k, w in self.weights.items()))
            verified.append(terms["outcome"])
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
        verified = [outcome(p, c) for p, c in zip(problems, completions, strict=True)]
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


def build_rule(reward: Any, **_: Any) -> RuleReward:
    """The builder of kind ``rule`` from a resolved reward (``race.rewards.systems``): its
    spec's terms and weights."""
    spec = reward.spec
    return RuleReward(dict(spec.weights), name="rule" + (f":{spec.rule_arg}" if spec.rule_arg else ""))


def build_random(reward: Any, *, seed: int = 0, **_: Any) -> RandomReward:
    """The builder of kind ``random``: coin flips seeded by the run's seed."""
    return RandomReward(seed=seed)
