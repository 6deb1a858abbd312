"""The feedback section on the synthetic study with two packaged likelihood PRMs: their
qualities from the packaged info.json, and the RM-training line counting the policy-sample
pool the two share once."""

from __future__ import annotations

import json

import report_synth
from report_synth import N_BOOT, N_BOOT_FIT

from race.artefacts.cache import PACKAGED
from race.rewards import rm_recipes
from race.rewards.rm_recipes import recipe_hash


def _info(name):
    return json.loads((PACKAGED / "rm" / f"{name}-{recipe_hash(name)}" / "info.json").read_text())


def test_two_prms_sharing_one_sample_pool_count_it_once(tmp_path, monkeypatch):
    from race.report import build_report

    for name, backbone in (("prm-s", "tiny-s"), ("prm-m", "tiny-m")):  # the registered recipes, whose hashes ship
        # (tests/rewards swaps in fast recipes for its session; a report test run after it must not see them)
        monkeypatch.setitem(rm_recipes.RM_RECIPES, name, rm_recipes.RMRecipe(
            "prm", backbone, steps=100, warmup_steps=0, init="base", scoring="likelihood", **rm_recipes._POOL))

    tables = report_synth.full_study()
    runs = tables["runs"]
    runs.loc[(runs["reward"] == "prm:prm-s") & (runs["seed"] == 1), "reward"] = "prm:prm-m"  # a second PRM arm
    paths = build_report(tables, tmp_path, n_boot=N_BOOT, n_boot_fit=N_BOOT_FIT)
    data = json.loads(paths.json.read_text())["sections"]["feedback"]["data"]
    m, s = _info("prm-m"), _info("prm-s")
    assert m["data"]["pool_digest"] == s["data"]["pool_digest"]  # the same 1,500 policy samples
    # prm-m (first by name) carries the pool's sampling FLOPs, prm-s its calibration only
    want = {"prm-m": m["train_flops"] + m["data"]["sampling_flops"], "prm-s": s["train_flops"]}
    assert data["rm_training_flops"] == want
    card = json.loads((tmp_path / "report_card.json").read_text())
    assert card["rm_training_flops"] == want and card["rm_training_total"] == sum(want.values())
    rows = {r["reward_model"]: r for r in data["allocations"] if r["reward_model"] != "-"}
    assert rows["prm-m"]["step_auc"] == f"{m['data']['heldout']['step_auc']:.3f}"
    assert rows["prm-s"]["bad_step_recall"] == f"{s['data']['heldout']['bad_step_recall']:.3f}"
    assert {r["quality_on"] for r in rows.values()} == {"policy samples"}
    # the two PRM arms differ only in their reward: the stronger (higher step AUC) against the weaker, per budget
    comps = [(c["budget"], c["kind"], c["a"], c["b"]) for c in data["comparisons"]]
    assert comps == [(b, "stronger RM", "prm:prm-m", "prm:prm-s") for b in (1e14, 1e15, 1e16)]
