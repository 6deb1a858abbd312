"""RM training data (labels from the task's verifier), encoding, caching, training FLOPs
(race.builds.rm_data, race.builds.rm_training; here for the reward fixtures' fast recipes)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from race.accounting import train_flops
from race.builds import rm_data as D
from race.builds import rm_training as T
from race.models.family import tiny_config_kwargs
from race.rewards import rm_encoding as E
from race.rewards import rm_recipes as R
from race.tasks import make_problem, solution_text, verify

HIDDEN = tiny_config_kwargs("tiny-xs")["hidden_size"]


@pytest.fixture(scope="module")
def prob():
    return make_problem([23, 5, 7, 10], ["+", "-", "+"])  # 23+5=28;28-7=21;21+10=31;#31.


def test_labels_of_the_reference_and_of_each_corruption(prob):
    ref = solution_text(prob)
    assert ref == "23+5=28;28-7=21;21+10=31;#31."
    assert D.marker_labels(prob, ref) == [1, 1, 1, 1]
    # a slip at step 1, carried forward: step 1 wrong, later steps valid, answer wrong
    assert D.marker_labels(prob, "23+5=28;28-7=22;22+10=32;#32.") == [1, 0, 1, 0]
    # the slip ignored: step 2 does not chain from the written 22
    assert D.marker_labels(prob, "23+5=28;28-7=22;21+10=31;#31.") == [1, 0, 0, 1]
    assert D.marker_labels(prob, "23+5=28;28-7=21;21+10=31;#30.") == [1, 1, 1, 0]  # wrong final
    assert D.marker_labels(prob, "23+5=28;28-7=21;") == [1, 1]  # truncated: no final marker
    assert D.marker_labels(prob, "23+5=28;28-7=21;21+10=31;31+1=32;#32.") == [1, 1, 1, 0, 0]  # extra step
    assert D.marker_labels(prob, "x;.;") == [0, 0, 0]


def test_corruptions_are_wrong_and_labels_agree_with_verify(arith):
    rng = random.Random(0)
    flagged = {k: 0 for k in D.CORRUPTIONS}
    problems = arith.problems("train", 60, seed=1)
    for p in problems:
        for kind in D.CORRUPTIONS:
            c = D.corrupt(p, rng, kind)
            labels = D.marker_labels(p, c)
            v = verify(p, c)
            assert c != solution_text(p), (kind, c)
            if labels and c.endswith(".") and "#" in c:
                assert labels[-1] == int(v.correct)
            flagged[kind] += int(0 in labels or not labels or not c.endswith("."))
    # a corruption is visible in the labels (a 0) or as a missing final answer; the rare
    # exceptions are skip/extra steps that happen to leave every written step valid
    assert all(n >= 0.85 * len(problems) for n in flagged.values()), flagged


def test_encode_reads_markers_of_the_completion_only(char_tokenizer, prob):
    ref = solution_text(prob)
    b = E.encode(char_tokenizer, [prob.prompt, prob.prompt], [ref, ref[:9]], "prm", max_length=256)
    ids = b["input_ids"]
    assert ids.shape == (2, len(prob.prompt) + len(ref))
    assert b["counts"] == [4, 1]  # three ';' and the final '.'; the prompt's chars are not read
    chars = [char_tokenizer.convert_ids_to_tokens(int(ids[r, c])) for r, c in zip(b["rows"], b["cols"])]
    assert chars == [";", ";", ";", ".", ";"]
    assert int(b["attention_mask"][1].sum()) == len(prob.prompt) + 9  # left padding
    assert b["position_ids"][1, -1] == len(prob.prompt) + 8  # positions count real tokens only
    o = E.encode(char_tokenizer, [prob.prompt], [ref], "orm", max_length=256)
    assert o["counts"] == [1] and int(o["cols"][0]) == o["input_ids"].shape[1] - 1
    cut = E.encode(char_tokenizer, [prob.prompt], [ref * 50], "prm", max_length=64)
    assert cut["input_ids"].shape[1] == 64 and cut["counts"][0] <= E.MAX_MARKERS


def test_build_caches_reuses_and_rebuilds_on_recipe_change(built_rms, fast_recipes, monkeypatch, _race_cache):
    info = built_rms["prm-xs"]
    path = R.rm_dir("prm-xs")
    assert not info.reused and info.path == str(path) and path.parent == _race_cache / "rm"
    names = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "info.json", "race_rm.json", "tokenizer.json"} <= names
    assert not any(n.endswith(".bin") or ".tmp-" in n for n in names)
    saved = json.loads((path / "info.json").read_text())
    assert saved["train_flops"] == info.train_flops > 0 and saved["flops_conventions"] == "race"
    assert {"step_accuracy", "bad_step_recall", "outcome_accuracy"} <= set(saved["eval"])
    assert saved["shape"]["head"] == [[HIDDEN, 2]]

    monkeypatch.setattr(T, "train_rm", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    again = T.build_rm("prm-xs")
    assert again.reused and again.recipe_hash == info.recipe_hash
    other = dataclasses.replace(fast_recipes["prm-xs"], learning_rate=1e-3)
    assert R.recipe_hash("prm-xs", other) != info.recipe_hash
    assert R.rm_dir("prm-xs", recipe=other) != path


def test_training_flops_are_train_flops_of_each_padded_batch(char_tokenizer, fast_recipes):
    """Recompute what train_rm charges: per step, train_flops over the padded batch with
    the head at the scored positions (full fine-tuning)."""
    import torch

    r = dataclasses.replace(fast_recipes["prm-xs"], steps=2)
    model, origin = T.build_rm_model(r)
    assert origin == {"init": "scratch"}
    shape = T.rm_shape(model)
    assert shape.head == ((HIDDEN, 2),) and shape.num_params() == sum(p.numel() for p in model.parameters())
    expected = 0
    task = r.make_task()
    for step in range(r.steps):
        pairs = D.make_dataset(task, "train", r.batch_size, r.seed * 1_000_003 + step, r.correct_frac)
        b = E.encode(char_tokenizer, [p.prompt for p, _ in pairs], [c for _, c in pairs], "prm",
                     max_length=E.MAX_LENGTH)
        B, L = b["input_ids"].shape
        expected += train_flops(shape, [L] * B, logits=b["counts"])
    torch.manual_seed(0)
    stats = T.train_rm(model, char_tokenizer, r)
    assert stats["train_flops"] == expected


def test_recipe_validation():
    with pytest.raises(ValueError, match="kind"):
        R.RMRecipe("xrm", "tiny-xs")
    with pytest.raises(KeyError, match="tiny-xxl"):
        R.RMRecipe("prm", "tiny-xxl")
    with pytest.raises(ValueError, match="init"):
        R.RMRecipe("prm", "tiny-xs", init="imagenet")


def test_auc():
    assert T.auc([(0.9, 1), (0.8, 1), (0.1, 0)]) == 1.0
    assert T.auc([(0.1, 1), (0.9, 0)]) == 0.0
    assert T.auc([(0.5, 1), (0.5, 0)]) == 0.5 and T.auc([(0.3, 1)]) == 0.5


def test_init_from_the_warm_start_copies_its_backbone(fast_recipes, monkeypatch, tmp_path):
    import torch
    from safetensors.torch import load_file

    import race.models.base_recipes as ws

    monkeypatch.setattr(ws, "DEFAULT_RECIPE", ws.SFTRecipe(steps=2, batch_size=4, warmup_steps=1, n_eval_test=2,
                                                         n_eval_hard=2))
    r = dataclasses.replace(fast_recipes["prm-xs"], init="base")
    model, origin = T.build_rm_model(r, cache_dir=tmp_path)
    assert origin["init"] == "base" and origin["base_recipe_hash"] == ws.recipe_hash("tiny-xs")
    base = load_file(str(tmp_path / "base" / f"tiny-xs-{ws.recipe_hash('tiny-xs')}" / "model.safetensors"))
    assert torch.equal(model.model.layers[1].mlp.up_proj.weight, base["model.layers.1.mlp.up_proj.weight"])
    # the RM's cache key follows the warm start: a new warm-start recipe means a new RM
    h = R.recipe_hash("prm-xs", r)
    monkeypatch.setattr(ws, "DEFAULT_RECIPE", ws.SFTRecipe(steps=3, batch_size=4, warmup_steps=1))
    assert R.recipe_hash("prm-xs", r) != h


def test_shape_of_rm_matches_the_built_model(built_rms):
    import json
    from pathlib import Path

    for name, info in built_rms.items():
        shape = R.shape_of_rm(name)
        assert shape.to_dict() == {**info.shape, "name": name}
        assert shape.num_params() == info.total_params
        assert json.loads((Path(info.path) / "race_rm.json").read_text())["kind"] == info.kind


def test_policy_batches_mix_corruptions_and_pool_and_the_balanced_loss_weighs_labels_equally(arith):
    import torch
    import torch.nn.functional as F

    pool = [(p, solution_text(p)) for p in arith.problems("train", 5, seed=2)]
    r = R.RMRecipe("prm", "tiny-xs", batch_size=10, policies=("tiny-s",), n_train_problems=5, synthetic_frac=0.3,
                   balance=True)
    batch = T.batch_pairs(r, r.make_task(), pool, step=3)
    assert len(batch) == 10 and sum(pair in pool for pair in batch[3:]) == 7
    assert batch[:3] == D.make_dataset(r.make_task(), "train", 3, 3, r.correct_frac)
    assert T.batch_pairs(r, r.make_task(), pool, step=3) == batch  # deterministic
    legacy = R.RMRecipe("prm", "tiny-xs", batch_size=4)
    assert T.batch_pairs(legacy, legacy.make_task(), None, 0) == D.make_dataset(legacy.make_task(), "train", 4, 0, 0.4)
    logits = torch.tensor([[0.0, 2.0], [1.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    labels = torch.tensor([1, 0, 1, 1])  # 3 good, 1 bad: weights 4/6 and 4/2
    per = F.cross_entropy(logits, labels, reduction="none")
    want = (per * torch.tensor([2 / 3, 2.0, 2 / 3, 2 / 3])).mean()
    assert torch.allclose(T._loss(r, logits, labels), want)
    assert torch.allclose(T._loss(legacy, logits, labels), per.mean())
