"""Reward systems by name (verl-style registry).

Spec strings: ``rule`` (0/1 final answer), ``rule:partial`` (partial credit per valid
step), ``rule:outcome+format`` (terms joined by ``+``, equal weights), ``random``,
``orm:NAME``, ``prm:NAME[:AGG]``, ``judge:NAME``. Learned reward models register their
builders here from their own modules.
"""

from __future__ import annotations

from typing import Any, Callable

from race.rewards.base import RewardFunction
from race.rewards.rule import RandomReward, RuleReward

Builder = Callable[..., RewardFunction]
_BUILDERS: dict[str, Builder] = {}


def register(kind: str) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        _BUILDERS[kind] = fn
        return fn

    return deco


@register("rule")
def _rule(arg: str, **_: Any) -> RewardFunction:
    terms = [t for t in (arg or "outcome").split("+") if t]
    return RuleReward({t: 1.0 / len(terms) for t in terms}, name="rule" + (f":{arg}" if arg else ""))


@register("random")
def _random(arg: str, *, seed: int = 0, **_: Any) -> RewardFunction:
    return RandomReward(seed=seed)


def _load_model_builders() -> None:
    """Import the modules that register learned reward models (orm, prm, judge)."""
    import importlib

    for mod in ("race.rewards.models",):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def make_reward(spec: str, **kwargs: Any) -> RewardFunction:
    """Build the reward system named by ``spec`` (see module docstring). ``kwargs`` go to
    the builder (seed, device, dtype, conventions, cache_dir, ...)."""
    kind, _, arg = spec.partition(":")
    if kind not in _BUILDERS:
        _load_model_builders()
    if kind not in _BUILDERS:
        known = sorted(set(_BUILDERS) | {"orm", "prm", "judge"})
        raise ValueError(f"unknown reward {spec!r}; kinds: {', '.join(known)}")
    return _BUILDERS[kind](arg, **kwargs)
