"""A reward spec resolved once: its kind's row, the model it names, and what it costs.

:func:`resolve_reward` is the one place a parsed spec (``race.spec.reward.RewardSpec``)
becomes a :class:`ResolvedReward`: its row in the reward-kind table
(``race.accounting.reward_kinds``), which model a classifier kind's target names
(``race.rewards.rm_recipes.learned_target``, asked once) and the accounting's
:class:`~race.accounting.RewardSystem` (the model's shape: the cost model of the ledger, the
planner and the budget bound). The builder (``race.rewards.registry``), planning
(``race flops``, ``race plan``, the grid's dry run), building on demand
(``race.builds.demand``) and the run's reward take the resolved value; none resolves again.
Torch-free: RACE's own reward models are read from their recipes, other models from presets
or config files.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from race.accounting import RewardSystem
from race.accounting.reward_kinds import RewardKind, reward_kind
from race.models.refs import resolve_shape
from race.spec.reward import RewardSpec, parse_reward


@dataclass(frozen=True)
class ResolvedReward:
    """A reward spec with what it resolves to: ``spec`` (as parsed), ``kind`` (its table
    row), ``target`` (for a classifier kind, which model its target names:
    ``learned_target``'s answer; else None) and ``system`` (its cost, computed on first use:
    a preset or hub name is read only when something asks what it costs)."""

    spec: RewardSpec
    kind: RewardKind
    target: Any = None  # race.rewards.rm_recipes.LearnedTarget

    def __str__(self) -> str:
        return str(self.spec)

    @cached_property
    def system(self) -> RewardSystem:
        """The accounting's view: a rule kind costs 0 (``rule``/``random``; a ``py:`` function
        what its declared scoring model costs, ``race.rewards.python``, else 0); a model kind
        carries its model's shape (a RACE RM's from its recipe; a causal LM's with a scoring
        head of ``kind.labels`` outputs in place of the vocabulary when it serves as a
        classifier RM). ``AccountingError`` for an unknown model says what to write."""
        spec, row = self.spec, self.kind
        if not row.model:
            if row.argument == "import":  # your function: a rule's cost, or the scoring model it declares
                from race.rewards.python import declared_system

                declared = declared_system(spec.target, resolve_reward)
                if declared is not None:
                    return declared
            return RewardSystem("random" if spec.kind == "random" else "rule")
        if self.target is not None and self.target.source == "recipe":
            from race.rewards.rm_recipes import shape_of_rm  # RACE's own reward models (torch-free)

            return RewardSystem(spec.kind, shape_of_rm(spec.target), spec.target)
        shape = resolve_shape(spec.target)
        if row.labels and shape.is_lm:  # a classifier RM scores with a small head, not the vocabulary
            shape = replace(shape, head=((shape.hidden, row.labels),), head_bias=False)
        return RewardSystem(spec.kind, shape, spec.target)

    @property
    def race_rm(self) -> str | None:
        """The name of the RACE-built RM this reward loads (``prm-xs``, ...), else None."""
        return self.spec.target if self.target is not None and self.target.source == "recipe" else None


def resolve_reward(spec: "str | RewardSpec | ResolvedReward") -> ResolvedReward:
    """Resolve a reward spec (a string in the grammar of ``race.spec.reward``, its parsed
    form, or a resolved one, returned as it is). ``ValueError`` (bad spec, or an RM of the
    other kind: ``prm:orm-xs``) says what to write."""
    if isinstance(spec, ResolvedReward):
        return spec
    parsed = parse_reward(spec)  # a parsed spec (RunConfig.reward) passes through as it is
    row = reward_kind(parsed.kind)
    target = None
    if row.classifier:
        from race.rewards.rm_recipes import learned_target  # the one rule (torch-free)

        target = learned_target(parsed.kind, parsed.target)  # ValueError for an RM of the other kind
    return ResolvedReward(parsed, row, target)


def reward_system(spec: "str | RewardSpec | ResolvedReward") -> RewardSystem:
    """The accounting view of a reward spec (:attr:`ResolvedReward.system`)."""
    return resolve_reward(spec).system


def race_rms_of(specs: "list[RewardSpec]") -> list[str]:
    """The RACE-built reward models (``prm-xs``, ...) that parsed reward specs name, in order
    (:attr:`ResolvedReward.race_rm`; ``ValueError`` for a recipe of the other kind, ``prm:orm-xs``)."""
    out: list[str] = []
    for parsed in specs:
        name = resolve_reward(parsed).race_rm
        if name is not None and name not in out:
            out.append(name)
    return out


__all__ = ["ResolvedReward", "race_rms_of", "resolve_reward", "reward_system"]
