"""Likelihood PRMs (race.rewards.rm_likelihood; fitted by race.builds.rm_calibration): the
step features against a direct computation, the calibration on a known answer, a reduced
recipe built end to end (policy samples, calibration FLOPs, held-out quality in
info.json) and the RM reward's charge for it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from race.accounting import forward_flops, reward_model_flops
from race.builds import rm_calibration as C
from race.builds import rm_training as T
from race.rewards import rm_likelihood as LK
from race.rewards import rm_recipes as R
from race.rewards.rm_encoding import MAX_LENGTH, encode
from race.tasks import make_problem, solution_text


@pytest.fixture(scope="module")
def prob():
    return make_problem([23, 5, 7], ["+", "-"])  # 23+5=28;28-7=21;#21.


def test_step_features_sum_and_min_the_step_tokens_log_probs(tiny_policy, char_tokenizer, prob):
    import torch

    lm, tok = tiny_policy
    comps = [solution_text(prob), "23+5=29;29-7=22;#22."]
    batch = encode(char_tokenizer, [prob.prompt] * 2, comps, "prm", max_length=MAX_LENGTH)
    ids = torch.tensor(LK.boundary_ids(char_tokenizer))
    with torch.no_grad():
        f = LK.step_features(lm, batch["input_ids"], batch["attention_mask"], batch["position_ids"], ids)
        logits = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"]).logits.double()
    lp = torch.log_softmax(logits, -1)
    for r, c in enumerate(comps):
        row = batch["input_ids"][r].tolist()
        start = len(row) - len(c)  # left padding: the completion is the row's tail
        seg_start = start
        for j in range(start, len(row)):
            if c[j - start] in ";.":
                toks = [float(lp[r, q - 1, row[q]]) for q in range(seg_start, j + 1)]
                assert math.isclose(float(f[r, j, 0]), sum(toks), rel_tol=1e-4, abs_tol=1e-4)
                assert math.isclose(float(f[r, j, 1]), min(toks), rel_tol=1e-4, abs_tol=1e-4)
                seg_start = j + 1


def test_calibration_separates_separable_features_and_maps_back_to_raw_units():
    import torch

    g = torch.Generator().manual_seed(0)
    good = torch.randn(200, 2, generator=g, dtype=torch.float64) * 0.5 + torch.tensor([-1.0, -0.5])
    bad = torch.randn(60, 2, generator=g, dtype=torch.float64) * 0.5 + torch.tensor([-8.0, -6.0])
    x = torch.cat([good, bad])
    y = torch.cat([torch.ones(200), torch.zeros(60)]).double()
    w, b = C.calibrate(x, y, 50)
    logit = x @ torch.tensor(w, dtype=torch.float64) + b
    assert bool((logit[:200].min() > logit[200:].max()))  # a perfect ranking, in raw feature units
    assert w[0] > 0 or w[1] > 0


def test_reduced_likelihood_recipe_builds_records_its_costs_and_loads(fast_recipes, _race_cache):
    from race.rewards.learned import load_race_rm

    r = fast_recipes["prm-s"]
    assert r.scoring == "likelihood" and r.policies == ("tiny-s",)
    info = T.build_rm("prm-s")
    path = Path(info.path)
    settings = json.loads((path / "race_rm.json").read_text())
    assert settings["scoring"] == "likelihood" and len(settings["calibration"]["weight"]) == LK.N_FEATURES
    assert info.data["pool_samples"] == r.n_train_problems and info.data["sampling_flops"] > 0
    held = info.data["heldout"]
    assert {"step_auc", "bad_step_recall", "threshold", "flops_per_token", "n_steps"} <= set(held)
    assert 0.0 <= held["step_auc"] <= 1.0 and held["n_samples"] == 6
    # the calibration FLOPs: a forward with logits everywhere over each padded batch of the pool
    pool, _ = T.training_pool(r)
    scorer = load_race_rm("prm-s", device="cpu")
    b = encode(scorer.tokenizer, [p.prompt for p, _ in pool], [c for _, c in pool], "prm", max_length=MAX_LENGTH)
    B, L = b["input_ids"].shape
    assert info.train_flops == forward_flops(scorer.shape, [L] * B, logits="all")
    assert R.shape_of_rm("prm-s").to_dict() == {**info.shape, "name": "prm-s"}
    assert info.total_params == scorer.shape.num_params()
    assert info.origin["base_sft_flops"] > 0 and info.cpu_seconds is not None


def test_the_rm_reward_charges_the_lm_head_at_every_position(fast_recipes, prob):
    from race.rewards.learned import build_learned
    from race.rewards.systems import resolve_reward

    reward = build_learned(resolve_reward("prm:prm-s:min+outcome"), device="cpu")
    comps = [solution_text(prob), "23+5=29;29-7=22;#22.", "23+5"]
    out = reward.score([prob] * 3, comps)
    L = len(prob.prompt) + max(len(c) for c in comps)
    assert out.tokens == 3 * L
    assert out.components == reward_model_flops(reward.system, [L] * 3, head_positions="all")
    assert sum(out.components.values()) > sum(reward_model_flops(reward.system, [L] * 3,
                                                                 head_positions=[4, 4, 0]).values())
    assert reward.step_bound(3, 20, 30) == sum(reward_model_flops(reward.system, [MAX_LENGTH] * 3,
                                                                  head_positions="all").values())


def test_likelihood_recipes_refuse_what_they_cannot_be():
    with pytest.raises(ValueError, match="likelihood"):
        R.RMRecipe("prm", "tiny-s", scoring="likelihood", init="scratch", policies=("tiny-s",), n_train_problems=4,
                   synthetic_frac=0.0)
    with pytest.raises(ValueError, match="scoring"):
        R.RMRecipe("prm", "tiny-s", scoring="vibes")
    with pytest.raises(ValueError, match="policies"):
        R.RMRecipe("prm", "tiny-s", synthetic_frac=0.5)


def test_prm_xs_keeps_its_packaged_hash_and_the_new_fields_change_it():
    xs = R.RMRecipe("prm", "tiny-xs", steps=400)  # the registered prm-xs recipe
    assert R.recipe_hash("prm-xs", xs) == "37f1db5ebdde"  # packaged before the policy fields existed
    assert R.recipe_hash("prm-xs", dataclasses.replace(xs, balance=True)) != "37f1db5ebdde"


def test_the_outcome_variant_reads_the_whole_completion_at_its_last_token(fast_recipes, prob):
    import torch

    from race.rewards.learned import build_learned, load_race_rm
    from race.rewards.systems import resolve_reward

    info = T.build_rm("orm-m")  # the fast recipe: calibrated on 8 tiny-s samples
    assert info.kind == "orm" and {"outcome_auc", "wrong_outcome_recall"} <= set(info.data["heldout"])
    scorer = load_race_rm("orm-m", device="cpu")
    ref = solution_text(prob)
    b = encode(scorer.tokenizer, [prob.prompt], [ref], "orm", max_length=MAX_LENGTH)
    ids = torch.tensor(LK.boundary_ids(scorer.tokenizer, "orm"))
    with torch.no_grad():
        f = scorer.model.base_model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                    position_ids=b["position_ids"]).last_hidden_state
        lm = scorer.model.base_model.lm
        lp = torch.log_softmax(lm(input_ids=b["input_ids"]).logits.double(), -1)
        g = LK.step_features(lm, b["input_ids"], b["attention_mask"], b["position_ids"], ids)
    row = b["input_ids"][0].tolist()
    toks = [float(lp[0, q - 1, row[q]]) for q in range(len(prob.prompt), len(row))]  # every completion token
    assert math.isclose(float(f[0, -1, 0]), sum(toks), rel_tol=1e-4, abs_tol=1e-4)
    assert math.isclose(float(g[0, -1, 1]), min(toks), rel_tol=1e-4, abs_tol=1e-4)
    reward = build_learned(resolve_reward("orm:orm-m:rm+outcome"), device="cpu")
    out = reward.score([prob], [ref])
    assert out.components == reward_model_flops(reward.system, [b["input_ids"].shape[1]], head_positions="all")
