"""Build on demand: what a caller needs built before it loads, built (or found) first.

The loaders below this floor only FIND artefacts (``race.models.loading`` a warm start,
``race.rewards.learned`` a RACE reward model) and raise
:class:`~race.artefacts.cache.NotBuiltError` for a missing one. The callers above the
builds ask here first: a run's setup (:func:`ensure_run`, from
``race.engines.common.load_run_policy``, before the run seeds its random state, so a run
that builds draws the same numbers as one that finds its artefacts cached), the grid's
prebuild stage (``race.grid.prebuild``) and the CLI (``race base build``, ``race rm build``).

    ensure_base(model)     the warm start of a tiny size (nothing for a path or hub name)
    ensure_rm(name)        a RACE reward model (and the warm starts it starts from)
    ensure_reward(spec)    what a (resolved) reward spec loads: the RACE RM of ``prm:``/``orm:``,
                           the warm start of ``judge:`` on a tiny size
    ensure_run(cfg)        the run's policy and reward

Each returns the artefact's info (``BaseInfo`` / ``RMInfo``; ``reused`` when it was
cached) or ``None`` when nothing RACE builds is named. Torch loads only when a build runs.
"""

from __future__ import annotations

import os
from typing import Any

CacheDir = str | os.PathLike[str] | None


def ensure_base(model: Any, *, cache_dir: CacheDir = None) -> Any:
    """The warm start of tiny size ``model`` (trained when missing: minutes), or ``None``
    when ``model`` is not a tiny family name."""
    from race.models.family import is_tiny_name

    if not is_tiny_name(str(model)):
        return None
    from race.builds.warmstart import build_base

    return build_base(str(model), cache_dir=cache_dir)


def ensure_rm(name: str, *, cache_dir: CacheDir = None) -> Any:
    """RACE reward model ``name`` (trained when missing: about half a minute for prm-xs)."""
    from race.builds.rm_training import build_rm

    return build_rm(name, cache_dir=cache_dir)


def ensure_reward(spec: Any, *, cache_dir: CacheDir = None) -> Any:
    """What reward ``spec`` (a string, a parsed ``RewardSpec`` or a resolved one:
    ``race.rewards.systems.resolve_reward``) loads, built when missing: the RACE RM a
    classifier kind names (``prm:NAME``/``orm:NAME``), the warm start a generative kind
    names on a tiny size (``judge:TINY-SIZE``). A spec that names a path or an unknown RM
    builds nothing (``make_reward`` then loads it or says what to write); one that names a
    RACE RM of the other kind (``prm:orm-xs``) raises the ``ValueError`` of
    ``race.rewards.rm_recipes.learned_target``, which says what to write."""
    from race.rewards.systems import resolve_reward

    reward = resolve_reward(spec)
    if reward.race_rm is not None:
        return ensure_rm(reward.race_rm, cache_dir=cache_dir)
    if reward.kind.head == "decode":
        return ensure_base(reward.spec.target, cache_dir=cache_dir)
    return None


def ensure_run(cfg: Any, *, cache_dir: CacheDir = None) -> None:
    """The artefacts run ``cfg`` loads: its policy's warm start and its reward's model."""
    ensure_base(cfg.model, cache_dir=cache_dir)
    ensure_reward(cfg.reward, cache_dir=cache_dir)


__all__ = ["ensure_base", "ensure_reward", "ensure_rm", "ensure_run"]
