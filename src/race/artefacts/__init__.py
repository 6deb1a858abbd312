"""Where RACE's cached artefacts live and whether they are built: the warm starts of the
tiny family and RACE's reward models. Finding, never building: a loader (``race.models``,
``race.rewards``) asks here for an artefact's directory and raises
:class:`~race.artefacts.cache.NotBuiltError` when it is missing; ``race.builds`` (above
the rewards) trains and publishes artefacts.

    cache.py    the cache root, the recipe hash, an artefact's directory, info.json read
                back, the packaged copies (``race/data/artefacts``), NotBuiltError
    recipe.py   what the recipes share: schedule checks, the task, the learning-rate schedule

The recipes themselves sit with what they describe: ``race.models.base_recipes`` (warm
starts) and ``race.rewards.rm_recipes`` (reward models). Standard library and
``race.tasks`` only.
"""

from race.artefacts.cache import ArtefactCache, NotBuiltError, cache_root, recipe_digest
from race.artefacts.recipe import RecipeSchedule

__all__ = ["ArtefactCache", "NotBuiltError", "RecipeSchedule", "cache_root", "recipe_digest"]
