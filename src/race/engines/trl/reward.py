"""A ``race.rewards`` system as a TRL reward function, charging its FLOPs to the ledger."""

from __future__ import annotations

import math
from typing import Any, Callable


class RaceReward:
    """A TRL reward function around a ``race.rewards`` system: looks the problems up by the
    dataset's ``problem_idx`` column, scores the completions, charges the reward's FLOPs
    to the ledger and keeps the batch's statistics for the metrics row."""

    def __init__(self, reward: Any, problems: list[Any], num_generations: int, charge: Callable[..., None],
                 eos_ids: set[int]) -> None:
        self.reward, self.problems, self.G = reward, problems, num_generations
        self.charge, self.eos_ids = charge, eos_ids
        self.__name__ = f"race_{reward.name}".replace(":", "_")
        self.last: dict[str, Any] = {}

    def __call__(self, prompts: list[Any], completions: list[str], completion_ids: list[list[int]],
                 problem_idx: list[int], **_: Any) -> list[float]:
        probs = [self.problems[i] for i in problem_idx]
        out = self.reward.score(probs, list(completions))
        comps = dict(out.components) if out.components else {"reward/score": 0}
        key = next(iter(comps))
        self.charge(comps, tokens={key: out.tokens} if out.tokens else None, seconds={key: out.seconds})
        r = out.rewards
        groups = [r[i:i + self.G] for i in range(0, len(r), self.G)]
        mean = sum(r) / len(r)
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1)) if len(r) > 1 else 0.0
        self.last = {
            "reward_mean": mean, "reward_std": std,
            "verified_mean": sum(out.verified) / max(1, len(out.verified)),
            "zero_var_frac": sum(1 for g in groups if max(g) == min(g)) / len(groups),
            "trunc_rate": sum(1 for ids in completion_ids if not ids or ids[-1] not in self.eos_ids) / len(r),
            "completion_len": sum(len(ids) for ids in completion_ids) / len(r),
            "kept_sequences": len(r), **out.extra,
        }
        return list(r)
