"""Every artefact RACE trains once and caches by recipe, and its training: the tiny
family's warm starts and RACE's reward models. This floor sits above ``race.rewards``
(training needs models, tasks and the reward encoding); where an artefact lives and
whether it is built is ``race.artefacts`` (low), the recipes sit with what they describe
(``race.models.base_recipes``, ``race.rewards.rm_recipes``). Nothing below this floor
trains an artefact; the callers above build on demand through :mod:`race.builds.demand`.

    demand.py          build what a run, a grid or a command needs before it loads
    store.py           publishing a built artefact (atomic rename), build-or-reuse
    train.py           the optimizer loop both trainers run (AdamW, schedule, clipping, tail loss)
    warmstart.py       the warm starts: SFT on worked solutions, greedy evaluation
    rm_data.py         RM training data: worked solutions and labelled corruptions
    rm_samples.py      RM training and evaluation data: what the warm starts write
    rm_training.py     RM training, evaluation on the recipe mixture, the cached build
    rm_calibration.py  likelihood RMs: the calibration fitted on policy samples
    rm_eval.py         RM quality on held-out policy samples (the shared protocol)
    rm_report.py       the quality table of ``race rm eval``

Importing this package is cheap: torch loads inside the functions that train.
"""

from race.builds.demand import ensure_base, ensure_reward, ensure_rm, ensure_run

__all__ = ["ensure_base", "ensure_reward", "ensure_rm", "ensure_run"]
