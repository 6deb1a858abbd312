"""The quality table of RACE's reward models (``race rm eval``): every packaged (or
requested) RM scored afresh under the shared held-out protocol of
:mod:`race.builds.rm_eval`, beside its training and sampling FLOPs from ``info.json``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from race.artefacts.cache import PACKAGED
from race.rewards.rm_recipes import known_rms, read_info, recipe_for, rm_path


def packaged_rms() -> list[str]:
    """Registered RM names whose CURRENT recipe hash ships with the package."""
    from race.rewards.rm_recipes import recipe_hash

    return [n for n in known_rms() if (PACKAGED / "rm" / f"{n}-{recipe_hash(n)}" / "info.json").is_file()]


def quality_rows(names: Sequence[str] | None = None, *, cache_dir: str | os.PathLike[str] | None = None
                 ) -> list[dict[str, Any]]:
    """One row per RM (default: :func:`packaged_rms`): held-out quality (computed now; the
    RMs are loaded, never built), parameters, training FLOPs, sampling FLOPs, CPU seconds."""
    from race.rewards.learned import load_race_rm
    from race.builds.rm_eval import heldout_for
    from race.builds.rm_samples import training_pool

    rows = []
    for name in names or packaged_rms():
        recipe = recipe_for(name)
        path = rm_path(name, cache_dir=cache_dir)
        info = read_info(path)
        assert info is not None, path
        scorer = load_race_rm(name, device="cpu", cache_dir=cache_dir)
        pool, _ = training_pool(recipe, cache_dir=cache_dir)
        rows.append(dict(name=name, kind=recipe.kind, backbone=recipe.backbone, params=info.total_params,
                         train_flops=info.train_flops, base_sft_flops=info.origin.get("base_sft_flops", 0),
                         sampling_flops=info.data.get("sampling_flops", 0),
                         cpu_seconds=info.cpu_seconds, steps=info.steps,
                         heldout=heldout_for(recipe, scorer, pool, cache_dir=cache_dir)))
    return rows
