"""Loading never builds; the callers above race.builds build on demand.

A warm start or a RACE reward model that is not in the cache makes the loaders
(race.models.loading, race.rewards) raise NotBuiltError naming the command that builds it;
race.builds.demand builds it when a caller asks, and a run's setup
(race.engines.common.load_run_policy) asks before it seeds, so a run that builds its
artefacts starts from the same random state as one that finds them cached. Tiny recipes
are swapped in (a few optimizer steps), so nothing here is packaged and every build runs."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from race.artefacts.cache import NotBuiltError  # noqa: E402
from race.models.base_recipes import SFTRecipe  # noqa: E402
from race.rewards.rm_recipes import RM_RECIPES  # noqa: E402

TINY_SFT = SFTRecipe(steps=2, batch_size=4, warmup_steps=1, n_eval_test=2, n_eval_hard=2)
TINY_PRM = dataclasses.replace(RM_RECIPES["prm-xs"], steps=2, batch_size=4, warmup_steps=1, n_eval=8)


@pytest.fixture
def tiny_recipes(monkeypatch):
    import race.models.base_recipes as br

    monkeypatch.setattr(br, "DEFAULT_RECIPE", TINY_SFT)
    monkeypatch.setitem(RM_RECIPES, "prm-xs", TINY_PRM)


def test_a_missing_warm_start_is_not_built_by_loading_but_by_the_builds(tmp_path, tiny_recipes):
    from race.builds.demand import ensure_base
    from race.models.base_recipes import base_path
    from race.models.loading import load_policy

    with pytest.raises(NotBuiltError, match=r"tiny model 'tiny-xs' has no warm-start checkpoint at .*: run "
                                            r"`race base build --sizes tiny-xs` or let a run build it"):
        load_policy("tiny-xs", device="cpu", cache_dir=tmp_path)
    assert not (tmp_path / "base").exists() or not any((tmp_path / "base").iterdir())  # nothing was trained
    info = ensure_base("tiny-xs", cache_dir=tmp_path)
    assert not info.reused and info.steps == TINY_SFT.steps
    model, _ = load_policy("tiny-xs", device="cpu", cache_dir=tmp_path)
    assert str(base_path("tiny-xs", cache_dir=tmp_path)) == info.path and model.config.vocab_size == 100
    assert ensure_base("tiny-xs", cache_dir=tmp_path).reused  # the second ask finds it
    assert ensure_base(str(tmp_path / "some-dir"), cache_dir=tmp_path) is None  # a path: nothing RACE builds


def test_a_missing_reward_model_is_not_built_by_the_reward_but_by_the_builds(tmp_path, tiny_recipes):
    from race.builds.demand import ensure_reward
    from race.rewards import make_reward
    from race.rewards.rm_recipes import rm_path

    message = (r"reward model 'prm-xs' is not built \(no checkpoint at .*\): run `race rm build --names prm-xs` "
               r"or let a run build it")
    with pytest.raises(NotBuiltError, match=message):
        make_reward("prm:prm-xs:min+partial", device="cpu", cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="race rm build"):  # NotBuiltError is a FileNotFoundError
        rm_path("prm-xs", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="'orm-xs' is an ORM, not a PRM: write orm:orm-xs"):  # the wrong kind,
        ensure_reward("prm:orm-xs", cache_dir=tmp_path)  # refused as make_reward refuses it (learned_target)
    assert ensure_reward("rule:partial", cache_dir=tmp_path) is None
    info = ensure_reward("prm:prm-xs:min+partial", cache_dir=tmp_path)
    assert not info.reused and info.steps == TINY_PRM.steps and info.path == str(rm_path("prm-xs", cache_dir=tmp_path))
    reward = make_reward("prm:prm-xs:min+partial", device="cpu", cache_dir=tmp_path)
    assert reward.name == "prm-xs" and ensure_reward("prm:prm-xs", cache_dir=tmp_path).reused


def test_a_run_builds_what_it_loads_before_it_seeds(tmp_path, tiny_recipes, monkeypatch):
    """load_run_policy builds the warm start and the RM of a run, and the random state it
    leaves equals the one of a run that found both cached (the builds reseed torch)."""
    from race.engines.common import load_run_policy
    from race.models.base_recipes import cached_base
    from race.rewards.rm_recipes import read_info, rm_dir
    from race.spec.run import run_config_from_dict

    monkeypatch.setenv("RACE_CACHE", str(tmp_path))
    cfg = run_config_from_dict(dict(model="tiny-xs", reward="prm:prm-xs", budget_flops=1e9, seed=5, torch_threads=1,
                                    device="cpu"))
    threads = torch.get_num_threads()
    try:
        built = load_run_policy(cfg)
        after_build = torch.rand(4)
        assert cached_base("tiny-xs") is not None and read_info(rm_dir("prm-xs")) is not None
        cached = load_run_policy(cfg)
        after_cached = torch.rand(4)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(after_build, after_cached)
    assert built.shape == cached.shape and built.model.config.vocab_size == 100
