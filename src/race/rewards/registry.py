"""Reward systems by name (verl-style registry).

A spec string is parsed once (the grammar in :mod:`race.spec.reward`) and resolved once
(:func:`race.rewards.systems.resolve_reward`: its row, its model, its cost); the builder its
row names in the reward-kind table (``race.accounting.reward_kinds``: ``"module:function"``,
imported on first use, so the learned kinds' torch and transformers load only when one is
built) turns the :class:`~race.rewards.systems.ResolvedReward` into a ``RewardFunction``.
Adding a kind is its row and its builder; :func:`register` replaces a row's builder (a
plugin, a test).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from race.accounting.reward_kinds import REWARD_KINDS, entry_point
from race.rewards.base import RewardFunction
from race.rewards.systems import ResolvedReward, resolve_reward
from race.spec.reward import RewardSpec

Builder = Callable[..., RewardFunction]  # (ResolvedReward, **kwargs) -> RewardFunction
_BUILDERS: dict[str, Builder] = {}


def register(kind: str) -> Callable[[Builder], Builder]:
    """Register ``fn(reward: ResolvedReward, **kwargs)`` as the builder of ``kind`` (in
    place of the one its row names)."""
    def deco(fn: Builder) -> Builder:
        _BUILDERS[kind] = fn
        return fn

    return deco


def builder(kind: str) -> Builder:
    """The builder of ``kind``: registered, else its row's (imported on first use)."""
    if kind not in _BUILDERS and kind in REWARD_KINDS:
        module, func = entry_point(REWARD_KINDS[kind].builder)
        _BUILDERS[kind] = getattr(importlib.import_module(module), func)
    if kind not in _BUILDERS:
        kinds = ", ".join(sorted(set(_BUILDERS) | set(REWARD_KINDS)))
        raise ValueError(f"no reward builder for kind {kind!r}; kinds: {kinds}")
    return _BUILDERS[kind]


def make_reward(spec: "str | RewardSpec | ResolvedReward", **kwargs: Any) -> RewardFunction:
    """Build the reward system named by ``spec`` (a string in the grammar of
    :mod:`race.spec.reward`, its parsed form, or its resolved form, which passes through).
    ``kwargs`` go to the builder (seed, device, dtype, conventions, cache_dir, tokenizer, ...)."""
    reward = resolve_reward(spec)
    return builder(reward.spec.kind)(reward, **kwargs)
