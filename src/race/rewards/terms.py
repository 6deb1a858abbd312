"""How a learned reward mixes its model score with rule terms (``race.spec.reward``
weights): the aggregation of a PRM's step scores and the rule terms of a completion."""

from __future__ import annotations

import math
from typing import Any, Sequence

from race.rewards.mathverify import math_correct
from race.rewards.text import verify_terms
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


def rule_terms(problem: Any, completion: str, needed: Sequence[str]) -> dict[str, float]:
    """The rule-based terms ``needed`` for one completion (0 FLOPs)."""
    outcome, partial, fmt = verify_terms(problem, completion)
    out = {"outcome": outcome, "partial": partial, "format": fmt}
    if "math" in needed:
        out["math"] = 1.0 if math_correct(problem, completion) else 0.0
    return out


def weighted(weights: dict[str, float], terms: dict[str, float]) -> float:
    """The reward: ``sum(weight * term)`` over the spec's terms."""
    return sum(w * terms[t] for t, w in weights.items())
