"""Reward systems by name (verl-style registry).

The spec string is parsed once, by the grammar in :mod:`race.spec.reward` (``rule``,
``rule:partial``, ``rule:outcome+format``, ``random``, ``math``, ``orm:NAME``,
``prm:NAME[:TERMS]``, ``judge:NAME``); a builder per kind turns the parsed
:class:`~race.spec.reward.RewardSpec` into a ``RewardFunction``. The learned kinds' modules
(torch, transformers) load only when one of them is built.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from race.rewards.base import RewardFunction
from race.rewards.rule import RandomReward, RuleReward
from race.spec.reward import RewardSpec, parse_reward

Builder = Callable[..., RewardFunction]  # (RewardSpec, **kwargs) -> RewardFunction
_BUILDERS: dict[str, Builder] = {}
#: Kinds whose builders live in modules loaded on first use ("module:function").
_LAZY = {"math": "race.rewards.mathverify:build_math", "orm": "race.rewards.learned:build_learned",
         "prm": "race.rewards.learned:build_learned", "judge": "race.rewards.learned:build_judge"}


def register(kind: str) -> Callable[[Builder], Builder]:
    """Register ``fn(spec: RewardSpec, **kwargs)`` as the builder of ``kind``."""
    def deco(fn: Builder) -> Builder:
        _BUILDERS[kind] = fn
        return fn

    return deco


@register("rule")
def _rule(spec: RewardSpec, **_: Any) -> RewardFunction:
    return RuleReward(dict(spec.weights), name="rule" + (f":{spec.rule_arg}" if spec.rule_arg else ""))


@register("random")
def _random(spec: RewardSpec, *, seed: int = 0, **_: Any) -> RewardFunction:
    return RandomReward(seed=seed)


def builder(kind: str) -> Builder:
    """The builder registered for ``kind`` (loading its module on first use)."""
    if kind not in _BUILDERS and kind in _LAZY:
        module, func = _LAZY[kind].split(":")
        _BUILDERS[kind] = getattr(importlib.import_module(module), func)
    if kind not in _BUILDERS:
        raise ValueError(f"no reward builder for kind {kind!r}; kinds: {', '.join(sorted(set(_BUILDERS) | set(_LAZY)))}")
    return _BUILDERS[kind]


def make_reward(spec: str | RewardSpec, **kwargs: Any) -> RewardFunction:
    """Build the reward system named by ``spec`` (a string in the grammar of
    :mod:`race.spec.reward`, or its parsed form). ``kwargs`` go to the builder (seed,
    device, dtype, conventions, cache_dir, tokenizer, ...)."""
    parsed = parse_reward(spec)  # a parsed spec (RunConfig.reward) passes through as it is
    return builder(parsed.kind)(parsed, **kwargs)
