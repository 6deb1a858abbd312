"""How a learned reward mixes its model score with rule terms (``race.spec.reward``
weights): the aggregation of a PRM's step scores and the weighted sum (the rule terms
themselves: ``race.rewards.rule_terms``)."""

from __future__ import annotations

import math
from typing import Sequence

from race.spec.reward import AGGREGATIONS


def aggregate(scores: Sequence[float], how: str) -> float:
    """Step scores -> one reward: ``min``, ``last``, ``mean`` or ``prod`` (0 when empty)."""
    if not scores:
        return 0.0
    if how == "min":
        return float(min(scores))
    if how == "last":
        return float(scores[-1])
    if how == "mean":
        return float(sum(scores) / len(scores))
    if how == "prod":
        return float(math.prod(scores))
    raise ValueError(f"unknown aggregation {how!r}; choose one of {', '.join(AGGREGATIONS)}")


def weighted(weights: dict[str, float], terms: dict[str, float]) -> float:
    """The reward: ``sum(weight * term)`` over the spec's terms."""
    return sum(w * terms[t] for t, w in weights.items())
