"""RACE's own reward models by recipe: what each one is, its cache key and its shape.

Torch-free: ``race flops --reward prm:prm-s``, planning and the build planner read these
without building anything. Training lives in :mod:`race.rewards.training`; the cache
is :mod:`race.builds` (``<cache>/rm/<name>-<recipe hash>/``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from race.accounting import ModelShape
from race.builds.cache import ArtefactCache, recipe_digest
from race.builds.recipe import RecipeSchedule
from race.models.family import tiny_config_kwargs
from race.models.tokenizer import ALPHABET, SPECIAL_TOKENS
from race.models.warmstart import recipe_hash as base_hash
from race.rewards.rm_encoding import MARKERS, MAX_LENGTH
from race.tasks.arith import END_MARK, ArithTask

#: Bumped when the data, model or training code changes in a way the recipe does not capture.
RM_VERSION = 1
CACHE = ArtefactCache("rm")


@dataclass(frozen=True)
class RMRecipe(RecipeSchedule):
    """How one reward model is trained (every field enters the cache hash)."""

    kind: str  # "prm" | "orm"
    backbone: str  # tiny family size whose dims the RM uses
    steps: int = 400
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    seed: int = 0
    correct_frac: float = 0.4
    task: dict[str, Any] = field(default_factory=lambda: ArithTask().describe())
    n_eval: int = 400
    init: str = "scratch"  # "scratch": random init; "base": start from the backbone's warm start

    def __post_init__(self) -> None:
        if self.kind not in ("prm", "orm"):
            raise ValueError(f"RMRecipe.kind must be 'prm' or 'orm', got {self.kind!r}")
        if self.init not in ("base", "scratch"):
            raise ValueError(f"RMRecipe.init must be 'base' or 'scratch', got {self.init!r}")
        tiny_config_kwargs(self.backbone)  # raises KeyError naming the family
        self._check_schedule()

    @property
    def num_labels(self) -> int:
        return 2 if self.kind == "prm" else 1


#: The reward models RACE builds (``race rm build``): two sizes per kind, so feedback
#: strength is an axis of the grid. Sized to train in well under a minute each on 2 CPU
#: cores (the tiny-s dims run ~2.5x slower per step, hence fewer steps).
RM_RECIPES: dict[str, RMRecipe] = {
    "prm-xs": RMRecipe("prm", "tiny-xs", steps=400),
    "prm-s": RMRecipe("prm", "tiny-s", steps=300),
    "orm-xs": RMRecipe("orm", "tiny-xs", steps=400),
    "orm-s": RMRecipe("orm", "tiny-s", steps=300),
}


def known_rms() -> list[str]:
    return list(RM_RECIPES)


def recipe_for(name: str) -> RMRecipe:
    if name not in RM_RECIPES:
        raise KeyError(f"unknown reward model {name!r}; RACE builds: {', '.join(RM_RECIPES)} "
                       "(or pass a local HF directory as orm:/path or prm:/path)")
    return RM_RECIPES[name]


def recipe_hash(name: str, recipe: RMRecipe | None = None) -> str:
    """12 hex digits over the recipe, the backbone config, the tokenizer alphabet and (for
    ``init="base"``) the warm start's own recipe hash, so a new warm start rebuilds the RM."""
    recipe = recipe or recipe_for(name)
    base = ""
    if recipe.init == "base":
        base = base_hash(recipe.backbone)
    return recipe_digest(dict(version=RM_VERSION, name=name, recipe=dataclasses.asdict(recipe), base=base,
                              config=tiny_config_kwargs(recipe.backbone), alphabet="".join(ALPHABET),
                              special=SPECIAL_TOKENS))


def rm_dir(name: str, *, cache_dir: str | os.PathLike[str] | None = None, recipe: RMRecipe | None = None) -> Path:
    """Directory of reward model ``name`` under ``recipe`` (default :data:`RM_RECIPES`)."""
    return CACHE.directory(name, recipe_hash(name, recipe), cache_dir)


def shape_of_rm(name: str) -> Any:
    """``ModelShape`` of RACE's RM ``name`` from its recipe alone (no torch, nothing
    built): for ``race flops --reward prm:prm-s`` and planning."""
    from dataclasses import replace

    recipe = recipe_for(name)
    base = ModelShape.from_hf_config(dict(tiny_config_kwargs(recipe.backbone), model_type="qwen2"), name=name)
    return replace(base, head=((base.hidden, recipe.num_labels),), head_bias=recipe.kind == "prm",
                   tie_embeddings=False)


def rm_settings(recipe: RMRecipe, max_length: int = MAX_LENGTH) -> dict[str, Any]:
    """``race_rm.json`` of a RACE-built RM (how ``race.rewards.hf`` reads it)."""
    d: dict[str, Any] = dict(kind=recipe.kind, chat_template=False, max_length=max_length)
    if recipe.kind == "prm":
        d.update(markers=list(MARKERS), final_marker=END_MARK)
    return d


def rm_settings(recipe: RMRecipe, max_length: int = MAX_LENGTH) -> dict[str, Any]:
    """``race_rm.json`` of a RACE-built RM (how ``race.rewards.hf`` reads it)."""
    d: dict[str, Any] = dict(kind=recipe.kind, chat_template=False, max_length=max_length)
    if recipe.kind == "prm":
        d.update(markers=list(MARKERS), final_marker=END_MARK)
    return d
