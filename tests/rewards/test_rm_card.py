"""An RM's quality and cost as the report reads them (race.rewards.rm_card): from the
packaged info.json, from a (fast) build in the session cache, and the honest gaps."""

from __future__ import annotations

import json
import shutil

import pytest

from race.artefacts.cache import PACKAGED
from race.rewards import rm_recipes
from race.rewards.rm_card import POLICY_SAMPLES, PROGRAMMATIC, rm_card
from race.spec.reward import reward_columns


def card_of(spec: str) -> dict | None:
    """The card of a reward as the report asks for it: from the spec's typed columns."""
    cols = reward_columns(spec)
    return rm_card(cols["reward_system"], cols["reward_model"])


def test_the_packaged_strong_prm_reads_its_heldout_quality(monkeypatch):
    # the registered (not the session's fast) recipe, whose hash the package ships
    monkeypatch.setitem(rm_recipes.RM_RECIPES, "prm-m", rm_recipes.RMRecipe(
        "prm", "tiny-m", steps=100, warmup_steps=0, init="base", scoring="likelihood", **rm_recipes._POOL))
    name = f"prm-m-{rm_recipes.recipe_hash('prm-m')}"
    info = json.loads((PACKAGED / "rm" / name / "info.json").read_text())
    card = card_of("prm:prm-m:min+outcome")
    held = info["data"]["heldout"]
    assert card["found"] and card["source"] == "packaged" and card["name"] == "prm-m"
    assert card["quality_on"] == POLICY_SAMPLES
    assert (card["step_auc"], card["bad_step_recall"], card["outcome_auc"]) == (
        held["step_auc"], held["bad_step_recall"], held["outcome_auc"])
    assert card["step_auc"] >= 0.9 and card["bad_step_recall"] >= 0.8  # the bar, as packaged
    assert card["training_flops"] == info["train_flops"] + info["data"]["sampling_flops"]
    assert card["base_sft_flops"] == info["origin"]["base_sft_flops"] > card["training_flops"]


def test_a_build_in_the_cache_is_read_first(built_rms):
    info = built_rms["prm-xs"]
    card = card_of("prm:prm-xs:min+partial")
    assert card["found"] and card["source"] == "cache" and card["recipe_hash"] == info.recipe_hash
    assert card["quality_on"] == PROGRAMMATIC and card["threshold"] == 0.5
    assert card["step_auc"] == info.eval["step_auc"] and card["bad_step_recall"] == info.eval["bad_step_recall"]
    assert card["training_flops"] == card["train_flops"] == info.train_flops > 0 and card["sampling_flops"] == 0


def test_rules_have_no_card_and_missing_models_say_what_to_run(tmp_path, built_rms):
    assert card_of("rule:partial") is None and card_of("random") is None
    missing = card_of("prm:prm-l")
    assert not missing["found"] and "race rm build --names prm-l" in missing["note"]
    local = tmp_path / "my-prm"
    shutil.copytree(built_rms["prm-xs"].path, local)
    card = card_of(f"prm:{local}")
    assert card["found"] and card["source"] == "path" and card["train_flops"] == built_rms["prm-xs"].train_flops
    (local / "info.json").unlink()
    assert not card_of(f"prm:{local}")["found"]
