"""One machine for the artefacts RACE trains once and caches by recipe: the tiny family's
warm starts (``race.models.warmstart``) and RACE's reward models (``race.rewards.rm_train``).

    cache.py    the cache root, the recipe hash, the artefact directory, info.json, the
                atomic publish (temporary directory renamed into place), build-or-reuse
    recipe.py   what the recipes share: schedule checks, the task, the learning-rate schedule
    train.py    the optimizer loop both trainers run (AdamW, schedule, clipping, tail loss)

Standard library and ``race.tasks`` at import time; torch only inside the training loop.
"""

from race.builds.cache import ArtefactCache, cache_root, recipe_digest
from race.builds.recipe import RecipeSchedule

__all__ = ["ArtefactCache", "RecipeSchedule", "cache_root", "recipe_digest"]
