"""Which of a prompt's rollouts the update trains on: ``num_update_generations`` (PODS,
arXiv 2504.13818) and the rules the selection table names (``race.spec.selection``).

A step generates ``n = num_generations`` rollouts per prompt, scores all of them, and with
``num_update_generations: m < n`` keeps ``m`` per prompt for the learning passes
(old-policy and reference log-probs, the update): :func:`update_rows`. Each rule is a pure
function ``(rewards, m, rng) -> indices`` of one prompt's rewards (standard library only):

- :func:`max_variance`: the m-subset with the largest reward variance, PODS's max-variance
  down-sampling. PODS shows that some optimal subset is the k highest and the m - k lowest
  rewards for some k in 0..m, so one sort and m + 1 candidates find it; the variances are
  compared exactly (the float rewards as fractions), so ties are real ties.
- :func:`uniform`: m rollouts uniformly at random (PODS's control), from ``rng``.

Ties, stated once: rewards are ordered by (value, index), so of equal rewards the "lowest"
are the earliest rows and the "highest" the latest; among the k whose subsets have the
same variance the largest k wins (more high-reward rollouts: with binary rewards, 3
correct of 8 and m = 3 keeps 2 correct and 1 wrong rather than 1 and 2). The indices come
back ascending, so the kept rows stay in generation order.

What follows the selection (the engines' ``score``): advantages are computed on the m
selected rollouts alone (their group mean, and with ``scale_rewards: group`` their std;
``batch``: the std of every selected reward of the step), which is PODS's GRPO-PODS as
we read section 3 of the paper (the update phase uses only the selected rollouts); a
group whose m selected rewards are all equal is dropped when
``drop_zero_variance_groups`` is on, as any zero-variance group is.
"""

from __future__ import annotations

import importlib
import math
import random
from fractions import Fraction
from typing import TYPE_CHECKING, Callable, Sequence

from race.spec.selection import update_selection
from race.tasks import step_seed

if TYPE_CHECKING:
    import torch

#: A rule: one prompt's rewards, the rollouts to keep, a generator -> the kept indices, ascending.
Rule = Callable[[Sequence[float], int, random.Random], list[int]]
_RULES: dict[str, Rule] = {}


def _check(rewards: Sequence[float], m: int) -> list[float]:
    r = [float(x) for x in rewards]
    if not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= len(r):
        raise ValueError(f"keep m={m!r} of {len(r)} rollouts: m must be a whole number in 1..{len(r)}")
    if not all(math.isfinite(x) for x in r):
        raise ValueError(f"rewards {r}: every reward must be finite to choose rollouts by them")
    return r


def max_variance(rewards: Sequence[float], m: int, rng: random.Random | None = None) -> list[int]:
    """The indices (ascending) of the ``m`` rewards whose variance is the largest: the k
    highest and the m - k lowest for the best k (module docstring: PODS's result, the ties).
    The variance of a subset is ``(m * sum(x^2) - sum(x)^2) / m^2``, compared exactly over the
    m + 1 candidates with prefix sums after one sort: O(n log n). ``rng`` is not used."""
    r = _check(rewards, m)
    order = sorted(range(len(r)), key=lambda i: (r[i], i))
    x = [Fraction(r[i]) for i in order]
    low, high = [Fraction(0)], [Fraction(0)]  # sums of the j lowest / highest, and of their squares
    low2, high2 = [Fraction(0)], [Fraction(0)]
    for j in range(m):
        low.append(low[-1] + x[j])
        low2.append(low2[-1] + x[j] * x[j])
        high.append(high[-1] + x[-1 - j])
        high2.append(high2[-1] + x[-1 - j] * x[-1 - j])
    best_k, best = 0, None
    for k in range(m + 1):  # k highest, m - k lowest (disjoint: m <= n)
        s, s2 = low[m - k] + high[k], low2[m - k] + high2[k]
        spread = m * s2 - s * s  # m^2 x the variance
        if best is None or spread >= best:
            best_k, best = k, spread
    n = len(r)
    return sorted(order[:m - best_k] + order[n - best_k:])


def uniform(rewards: Sequence[float], m: int, rng: random.Random) -> list[int]:
    """``m`` indices drawn uniformly without replacement from ``rng``, ascending (the rewards
    are not read: PODS's random down-sampling, the control of :func:`max_variance`)."""
    r = _check(rewards, m)
    return sorted(rng.sample(range(len(r)), m))


def rule(name: str) -> Rule:
    """The rule of selection ``name``: the function its row of ``race.spec.selection`` names
    (imported on first use)."""
    if name not in _RULES:
        module, _, func = update_selection(name).rule.partition(":")
        _RULES[name] = getattr(importlib.import_module(module), func)
    return _RULES[name]


def selection_rng(seed: int, step: int) -> random.Random:
    """The generator of the selection draws a run with seed ``seed`` makes at step ``step``
    (``step_seed(seed, step, "selection")``): a gang member draws what its solo run draws."""
    return random.Random(step_seed(seed, step, "selection"))


def update_rows(rewards: "torch.Tensor", group: int, m: int, selection: str, seed: int, step: int) -> "torch.Tensor":
    """The rows the update trains on: for each prompt's ``group`` consecutive rewards the
    ``m`` rollouts :func:`rule` ``(selection)`` keeps, as indices into the step's rows
    (ascending; prompt after prompt, ``m`` each). ``m == group`` keeps every row."""
    import torch

    values = rewards.detach().cpu().double().tolist()
    n_prompts = len(values) // group
    if n_prompts * group != len(values):
        raise ValueError(f"{len(values)} rewards do not form groups of {group}")
    if m == group:
        return torch.arange(len(values))
    choose, rng = rule(selection), selection_rng(seed, step)
    rows = [p * group + i for p in range(n_prompts) for i in choose(values[p * group:(p + 1) * group], m, rng)]
    return torch.tensor(rows, dtype=torch.long)


__all__ = ["Rule", "max_variance", "rule", "selection_rng", "uniform", "update_rows"]
