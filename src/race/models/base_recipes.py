"""The tiny family's warm starts: their recipe, its hash, where each one lives and whether
it is built. Torch-free; training them is :mod:`race.builds.warmstart`'s job.

A warm start of size ``name`` lives at ``<cache>/base/<name>-<recipe hash>/``
(safetensors + tokenizer + ``info.json``, :class:`BaseInfo`); the hash covers the recipe,
the size's config and the tokenizer alphabet, so a changed recipe has a new directory and
an unchanged one is found again (the packaged copies included, whatever the clone's path).
:func:`base_path` is what a loader asks: the directory of a built warm start, or a
:class:`~race.artefacts.cache.NotBuiltError` naming ``race base build``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from race.accounting import train_flops
from race.artefacts.cache import ArtefactCache, NotBuiltError, recipe_digest
from race.artefacts.recipe import RecipeSchedule
from race.models.family import tiny_config_kwargs
from race.models.tokenizer import ALPHABET, SPECIAL_TOKENS
from race.tasks.arith import ArithTask, solution_text

#: Bumped when the training code changes in a way the recipe fields do not capture.
WARMSTART_VERSION = 1
CACHE = ArtefactCache("base")


@dataclass(frozen=True)
class SFTRecipe(RecipeSchedule):
    """The one warm-start recipe shared by every size (all fields enter the hash)."""

    steps: int = 500
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    seed: int = 0
    task: dict[str, Any] = field(default_factory=lambda: ArithTask().describe())
    n_eval_test: int = 500
    n_eval_hard: int = 200
    #: ``None``: every size trains ``steps`` steps. A size name: every size trains for the
    #: SFT FLOPs that ``steps`` steps of THAT size cost (:meth:`steps_for`), so smaller
    #: sizes take more steps (warm starts comparable at equal compute).
    equal_flops_to: str | None = None

    def __post_init__(self) -> None:
        self._check_schedule()

    def steps_for(self, name: str) -> int:
        """Optimizer steps of size ``name``: ``steps``, or with ``equal_flops_to = ref``
        round(steps x F(ref) / F(name)), F = ``train_flops`` of one batch of
        ``batch_size`` sequences at the task's mean prompt + solution length (the ratio
        barely depends on that length)."""
        if self.equal_flops_to is None or self.equal_flops_to == name:
            return self.steps
        from race.models.refs import tiny_shape

        task = self.make_task()
        sample = task.problems("train", 64, seed=0)
        length = round(sum(len(p.prompt) + len(solution_text(p)) + 1 for p in sample) / len(sample))
        ref, own = (train_flops(tiny_shape(n), [length] * self.batch_size) for n in (self.equal_flops_to, name))
        return max(1, round(self.steps * ref / own))

    def for_size(self, name: str) -> "SFTRecipe":
        """This recipe with the steps of size ``name`` (what :func:`race.builds.warmstart.sft` runs)."""
        n = self.steps_for(name)
        return self if n == self.steps else dataclasses.replace(self, steps=n, equal_flops_to=None)


DEFAULT_RECIPE = SFTRecipe()


@dataclass
class BaseInfo:
    """What ``info.json`` holds about a warm-start checkpoint. ``seconds`` is the SFT
    wall time (model build + training), ``eval_seconds`` the greedy evaluation after it;
    ``reused`` is not stored: True when this call found the checkpoint instead of
    training it."""

    name: str
    path: str
    recipe: dict[str, Any]
    recipe_hash: str
    non_embedding_params: int
    lm_head_params: int
    total_params: int
    steps: int
    tokens_processed: int
    real_tokens: int
    loss_tokens: int
    sft_flops: float
    seconds: float
    final_loss: float
    test_accuracy: float
    hard_accuracy: float
    config: dict[str, Any] = field(default_factory=dict)
    eval_seconds: float = 0.0
    torch_threads: int = 0
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("reused")
        return d


def _recipe(recipe: SFTRecipe | None) -> SFTRecipe:
    # resolved at call time, so swapping the module's DEFAULT_RECIPE (tests) takes effect
    return DEFAULT_RECIPE if recipe is None else recipe


def recipe_hash(name: str, recipe: SFTRecipe | None = None) -> str:
    """12 hex digits over the recipe, the size's config and the tokenizer alphabet."""
    recipe = _recipe(recipe)
    fields = dataclasses.asdict(recipe)
    if fields["equal_flops_to"] is None:  # added later: recipes without it keep their hashes
        del fields["equal_flops_to"]
    return recipe_digest(dict(version=WARMSTART_VERSION, recipe=fields,
                              config=tiny_config_kwargs(name), alphabet="".join(ALPHABET), special=SPECIAL_TOKENS))


def base_dir(name: str, *, cache_dir: str | os.PathLike[str] | None = None,
             recipe: SFTRecipe | None = None) -> Path:
    """Directory of the warm start of ``name`` under ``recipe`` (default
    :data:`DEFAULT_RECIPE`)."""
    return CACHE.directory(name, recipe_hash(name, recipe), cache_dir)


def cached_base(name: str, *, cache_dir: str | os.PathLike[str] | None = None,
                recipe: SFTRecipe | None = None) -> BaseInfo | None:
    """The cached warm start of ``name`` for ``recipe`` (default: the family's), or
    ``None`` when it has not been built; builds nothing."""
    return read_base_info(base_dir(name, cache_dir=cache_dir, recipe=_recipe(recipe)))


def base_path(name: str, *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Directory of the built warm start of ``name`` (the family's recipe); a
    :class:`NotBuiltError` naming the command that builds it when there is none."""
    path = base_dir(name, cache_dir=cache_dir)
    if read_base_info(path) is None:
        raise NotBuiltError(f"tiny model {name!r} has no warm-start checkpoint at {path}: run "
                            f"`race base build --sizes {name}` or let a run build it")
    return path


def current_recipe() -> SFTRecipe:
    """The family's canonical warm-start recipe (``DEFAULT_RECIPE``, read at call time)."""
    return _recipe(None)


def _info_of(data: dict[str, Any]) -> BaseInfo:
    known = {f.name for f in dataclasses.fields(BaseInfo)} - {"reused"}
    return BaseInfo(**{k: v for k, v in data.items() if k in known}, reused=True)


def read_base_info(path: Path) -> BaseInfo | None:
    """The :class:`BaseInfo` of the warm start at ``path``, ``None`` when none is built there."""
    return CACHE.read_info(path, _info_of)


__all__ = ["CACHE", "DEFAULT_RECIPE", "WARMSTART_VERSION", "BaseInfo", "SFTRecipe", "base_dir", "base_path",
           "cached_base", "current_recipe", "read_base_info", "recipe_hash"]
