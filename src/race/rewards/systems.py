"""Reward spec -> ``race.accounting.RewardSystem``: what a reward system costs, for
planning (``race flops``, ``race plan``, the grid's dry run). Torch-free: RACE's own
reward models are read from their recipes, other models from presets or config files."""

from __future__ import annotations

from dataclasses import replace

from race.accounting import RewardSystem
from race.models.refs import resolve_shape
from race.spec.reward import RewardSpec, parse_reward


def reward_system(spec: str | RewardSpec) -> RewardSystem:
    """The accounting view of a reward spec: ``rule``/``math`` and ``random`` cost 0 FLOPs
    (kind ``rule``/``random``); ``orm``/``prm``/``judge`` carry the model's shape (a RACE
    RM's from its recipe; a causal LM's with a scoring head in place of the vocabulary
    when it serves as an ORM or PRM). ``ValueError`` (bad spec) or ``AccountingError``
    (unknown model) say what to write."""
    parsed = parse_reward(spec)  # a parsed spec (RunConfig.reward) passes through as it is
    if not parsed.learned:
        return RewardSystem("random" if parsed.kind == "random" else "rule")
    kind, model = parsed.kind, parsed.target
    if kind in ("orm", "prm"):
        from race.rewards.rm_recipes import learned_target, shape_of_rm  # RACE's own reward models (torch-free)

        if learned_target(kind, model).source == "recipe":  # ValueError for an RM of the other kind
            return RewardSystem(kind, shape_of_rm(model), model)  # type: ignore[arg-type]
    shape = resolve_shape(model)
    if kind in ("orm", "prm") and shape.is_lm:
        # A reward model scores with a small head, not the vocabulary.
        head = ((shape.hidden, 1),) if kind == "orm" else ((shape.hidden, 2),)
        shape = replace(shape, head=head, head_bias=False)
    return RewardSystem(kind, shape, model)  # type: ignore[arg-type]


def race_rms_of(specs: "list[RewardSpec]") -> list[str]:
    """The RACE-built reward models (``prm-xs``, ...) that parsed reward specs name, in order
    (``race.rewards.rm_recipes.learned_target``: a path named like a recipe is no RACE RM;
    ``ValueError`` for a recipe of the other kind, ``prm:orm-xs``)."""
    from race.rewards.rm_recipes import learned_target

    out = []
    for parsed in specs:
        if parsed.kind in ("orm", "prm") and parsed.target not in out \
                and learned_target(parsed.kind, parsed.target).source == "recipe":
            out.append(parsed.target)
    return out


__all__ = ["race_rms_of", "reward_system"]
