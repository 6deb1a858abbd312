"""Reward-model fixtures: RACE's RMs with reduced recipes (a few optimizer steps, random
init) built once per session into the session cache, so tests stay fast. The registered
recipes are swapped for the session and restored afterwards."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from race.builds import rm_training as training  # noqa: E402
from race.rewards import rm_recipes  # noqa: E402



def _fast(r: rm_recipes.RMRecipe) -> rm_recipes.RMRecipe:
    if r.scoring == "likelihood":  # the packaged tiny-s warm start, 8 problems sampled, 5 L-BFGS iterations
        return dataclasses.replace(r, steps=5, n_eval=16, policies=("tiny-s",), n_train_problems=8,
                                   n_val_problems=6)
    return dataclasses.replace(r, steps=4, batch_size=8, warmup_steps=1, n_eval=16, init="scratch")


#: What the tests build instead of the real recipes (seconds, not minutes).
FAST = {name: _fast(r) for name, r in rm_recipes.RM_RECIPES.items()}


@pytest.fixture(autouse=True)
def _quiet(quiet_warnings):
    yield


@pytest.fixture(scope="session", autouse=True)
def fast_recipes():
    """Swap in the fast recipes for the whole session (restored afterwards)."""
    from race.builds import rm_eval

    saved = dict(rm_recipes.RM_RECIPES)
    protocol = (rm_eval.EVAL_POLICIES, rm_eval.N_HELDOUT_PROBLEMS, rm_eval.N_VAL_PROBLEMS)
    rm_recipes.RM_RECIPES.update(FAST)
    # the held-out protocol at test size: one policy, a handful of problems
    rm_eval.EVAL_POLICIES, rm_eval.N_HELDOUT_PROBLEMS, rm_eval.N_VAL_PROBLEMS = ("tiny-s",), 6, 6
    torch.set_num_threads(1)
    yield FAST
    rm_recipes.RM_RECIPES.clear()
    rm_recipes.RM_RECIPES.update(saved)
    rm_eval.EVAL_POLICIES, rm_eval.N_HELDOUT_PROBLEMS, rm_eval.N_VAL_PROBLEMS = protocol


@pytest.fixture(scope="session")
def built_rms(fast_recipes, _race_cache):
    """prm-xs and orm-xs built (fast recipes) into the session cache."""
    return {n: training.build_rm(n) for n in ("prm-xs", "orm-xs")}


@pytest.fixture(scope="session")
def arith():
    from race.tasks import ArithTask

    return ArithTask()
