"""One rule for which reward model an ``orm:``/``prm:`` target names
(``race.rewards.rm_recipes.learned_target``), asked by the loader, the planner, build on
demand, the grid's prebuild and the RM card alike: a path first, then RACE's recipes (whose
kind must match), then a hub or preset name. Nothing here builds or loads a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from race.builds.demand import ensure_reward
from race.rewards import make_reward
from race.rewards.rm_card import rm_card
from race.rewards.rm_recipes import RM_RECIPES, learned_target, shape_of_rm
from race.rewards.systems import race_rms_of, reward_system
from race.spec.reward import parse_reward


def test_the_rule_classifies_recipes_paths_and_hub_names(tmp_path):
    t = learned_target("prm", "prm-xs")
    assert (t.source, t.name, t.ref, t.recipe) == ("recipe", "prm-xs", "prm-xs", RM_RECIPES["prm-xs"])
    assert learned_target("orm", "orm-xs").source == "recipe"
    assert learned_target("orm", "qwen2.5-0.5b").source == "hub" and learned_target("orm", "qwen2.5-0.5b").recipe is None
    p = learned_target("prm", str(tmp_path / "my-prm"))
    assert (p.source, p.name) == ("path", "my-prm")
    assert learned_target("prm", "./prm-xs").source == "path"  # written as a path: a path, even if absent


def test_the_specs_of_the_configs_and_the_demo_name_the_same_recipes():
    specs = [parse_reward(s) for s in ("prm:prm-xs", "prm:prm-xs:min+partial", "prm:prm-s:min+outcome",
                                       "prm:prm-m:min+outcome", "orm:orm-s", "orm:orm-xs", "math", "judge:tiny-s")]
    assert race_rms_of(specs) == ["prm-xs", "prm-s", "prm-m", "orm-s", "orm-xs"]
    for s in specs[:6]:
        sys_ = reward_system(s)
        assert (sys_.kind, sys_.name, sys_.shape) == (s.kind, s.target, shape_of_rm(s.target))


MISMATCH = r"'orm-xs' is an ORM, not a PRM: write orm:orm-xs, or name one of RACE's PRMs \(prm-xs, "


def test_an_rm_of_the_other_kind_is_refused_everywhere_with_what_to_write(tmp_path):
    """prm:orm-xs: the prebuild queued orm-xs, build on demand built nothing, planning costed
    a PRM with the ORM's one-logit head and the loader refused; now all refuse alike."""
    spec = parse_reward("prm:orm-xs")
    with pytest.raises(ValueError, match=MISMATCH):
        race_rms_of([spec])
    with pytest.raises(ValueError, match=MISMATCH):
        ensure_reward(spec, cache_dir=tmp_path)
    with pytest.raises(ValueError, match=MISMATCH):
        reward_system(spec)
    with pytest.raises(ValueError, match=MISMATCH):
        make_reward("prm:orm-xs", device="cpu", cache_dir=tmp_path)
    card = rm_card("prm", "orm-xs", cache_dir=tmp_path)
    assert card is not None and card["found"] is False and "write orm:orm-xs" in card["note"]
    with pytest.raises(ValueError, match=r"'prm-xs' is a PRM, not an ORM: write prm:prm-xs, .*orm-xs"):
        learned_target("orm", "prm-xs")
    assert not any(tmp_path.iterdir())  # nothing built


def test_a_local_directory_named_like_a_recipe_is_that_directory_everywhere(tmp_path, monkeypatch):
    """A directory ``prm-xs`` in the working directory: the loader loaded it while the RM
    card showed RACE's prm-xs; now every site takes the directory (a path wins)."""
    monkeypatch.chdir(tmp_path)
    mine = Path("prm-xs")
    mine.mkdir()
    (mine / "info.json").write_text(json.dumps(dict(name="my-own-prm", kind="prm", total_params=7,
                                                    eval=dict(step_auc=0.5))))
    cache = tmp_path / "cache"
    card = rm_card("prm", "prm-xs", cache_dir=cache)
    assert card is not None and (card["source"], card["name"], card["params"]) == ("path", "my-own-prm", 7)
    assert learned_target("prm", "prm-xs").source == "path"
    assert race_rms_of([parse_reward("prm:prm-xs")]) == []  # the prebuild builds no RACE prm-xs for it
    assert ensure_reward("prm:prm-xs", cache_dir=cache) is None
    with pytest.raises(FileNotFoundError, match="no config.json"):  # the loader reads the directory
        make_reward("prm:prm-xs", device="cpu", cache_dir=cache)
    assert not cache.exists()
