"""Warm start (race.builds.warmstart; its recipe and directory: race.models.base_recipes):
cached by recipe hash, reused without retraining, rebuilt on change."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from race.builds.warmstart import build_base, evaluate_greedy, greedy_completions
from race.models.base_recipes import SFTRecipe, base_dir, recipe_hash
from race.tasks import ArithTask

TINY = SFTRecipe(steps=3, batch_size=4, warmup_steps=1, n_eval_test=4, n_eval_hard=2)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("ws-cache")
    return cache, build_base("tiny-xs", cache_dir=cache, recipe=TINY)


def test_build_writes_a_loadable_checkpoint(built):
    cache, info = built
    path = base_dir("tiny-xs", cache_dir=cache, recipe=TINY)
    assert not info.reused and info.path == str(path)
    assert path.parent == cache / "base" and path.name == f"tiny-xs-{recipe_hash('tiny-xs', TINY)}"
    names = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "info.json", "tokenizer.json"} <= names
    assert not any(n.endswith(".bin") or ".tmp-" in n for n in names)
    saved = json.loads((path / "info.json").read_text())
    assert saved["recipe_hash"] == info.recipe_hash and saved["steps"] == 3
    assert saved["non_embedding_params"] == 92_976 and saved["lm_head_params"] == 100 * 48
    # FLOPs: more than 6 x (non-embedding + lm_head) x padded tokens (attention scores on top)
    assert 6 * (92_976 + 4_800) * info.tokens_processed < info.sft_flops < 7 * (92_976 + 4_800) * info.tokens_processed
    assert info.tokens_processed >= info.real_tokens > info.loss_tokens > 0
    assert 0.0 <= info.test_accuracy <= 1.0 and math.isfinite(info.final_loss)

    from race.models.loading import load_policy

    model, tok = load_policy(path, device="cpu")
    assert model.config.vocab_size == len(tok) == 100


def test_second_call_reuses_without_training(built, monkeypatch):
    cache, info = built
    import race.builds.warmstart as ws

    def boom(*a, **k):
        raise AssertionError("retrained although the checkpoint was cached")

    monkeypatch.setattr(ws, "sft", boom)
    again = build_base("tiny-xs", cache_dir=cache, recipe=TINY)
    assert again.reused and again.recipe_hash == info.recipe_hash and again.seconds == info.seconds


def test_changed_recipe_builds_a_new_checkpoint(built):
    cache, info = built
    other = dataclasses.replace(TINY, learning_rate=1e-3)
    assert recipe_hash("tiny-xs", other) != info.recipe_hash
    assert recipe_hash("tiny-s", TINY) != info.recipe_hash  # the size's config is hashed too
    new = build_base("tiny-xs", cache_dir=cache, recipe=other)
    assert not new.reused and new.path != info.path
    forced = build_base("tiny-xs", cache_dir=cache, recipe=TINY, force=True)
    assert not forced.reused and forced.path == info.path


def test_training_is_deterministic_under_the_seed(built, tmp_path):
    from safetensors.torch import load_file

    cache, info = built
    calls = []
    twin = build_base("tiny-xs", cache_dir=tmp_path, recipe=TINY, progress=lambda s, n, loss: calls.append((s, n)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    a = load_file(f"{info.path}/model.safetensors")
    b = load_file(f"{twin.path}/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tiny_name_loads_from_cache_once_built(built, monkeypatch):
    from race.models.loading import load_policy

    cache, _ = built
    monkeypatch.setenv("RACE_NO_PACKAGED", "1")  # else the packaged warm start is installed
    with pytest.raises(FileNotFoundError, match="race base build"):
        load_policy("tiny-xs", cache_dir=cache)  # the DEFAULT recipe was never built here


def test_lr_schedule_warmup_then_cosine():
    r = SFTRecipe(steps=100, warmup_steps=10, learning_rate=1e-2, min_lr_ratio=0.1)
    assert r.lr_at(0) == pytest.approx(1e-3) and r.lr_at(9) == pytest.approx(1e-2)
    assert r.lr_at(10) == pytest.approx(1e-2)
    assert r.lr_at(55) == pytest.approx(1e-2 * (0.1 + 0.9 * 0.5))
    assert r.lr_at(100) == pytest.approx(1e-3)
    lrs = [r.lr_at(s) for s in range(10, 100)]
    assert all(x >= y for x, y in zip(lrs, lrs[1:]))
    with pytest.raises(ValueError, match="warmup_steps"):
        SFTRecipe(steps=5, warmup_steps=6)


def test_batched_greedy_equals_one_by_one(tiny_policy):
    model, tok = tiny_policy
    prompts = [p.prompt for p in ArithTask().problems("test", 5)]
    batched = greedy_completions(model, tok, prompts, max_new_tokens=12, batch_size=5)
    single = [greedy_completions(model, tok, [p], max_new_tokens=12, batch_size=1)[0] for p in prompts]
    assert batched == single


def test_evaluate_greedy_scores_with_the_verifier(tiny_policy, monkeypatch):
    import race.builds.warmstart as ws
    from race.tasks import solution_text

    model, tok = tiny_policy
    probs = ArithTask().problems("test", 4)
    oracle = [solution_text(p) for p in probs]
    monkeypatch.setattr(ws, "greedy_completions", lambda m, t, prompts, n, b: oracle[:2] + ["#-999.", "junk"])
    assert evaluate_greedy(model, tok, probs) == 0.5
    assert evaluate_greedy(model, tok, []) == 0.0


def test_sft_flops_equal_the_measured_count():
    """The warm start's FLOPs are what FlopCounterMode measures over the whole SFT run
    (torch conventions: square attention scores), step by step over padded batches."""
    from race.measure import count_flops
    from race.models.family import build_tiny_model
    from race.models.tokenizer import build_char_tokenizer
    from race.builds.warmstart import sft

    tok = build_char_tokenizer()
    model = build_tiny_model("tiny-xs", seed=0, attn_implementation="eager")
    stats = {}
    measured = count_flops(lambda: stats.update(sft(model, tok, TINY, conventions="torch")))
    assert stats["sft_flops"] == measured > 0
    race = sft(build_tiny_model("tiny-xs", seed=0, attn_implementation="eager"), tok, TINY)["sft_flops"]
    assert race < measured  # causal attention counts half the score matmuls


def test_a_packaged_artefact_with_the_same_recipe_hash_is_installed_not_built(built, tmp_path, monkeypatch):
    import shutil

    import race.artefacts.cache as bc
    import race.builds.warmstart as ws
    from race.models.base_recipes import cached_base

    cache, info = built
    src = base_dir("tiny-xs", cache_dir=cache, recipe=TINY)
    shipped = tmp_path / "package" / "base"
    shutil.copytree(src, shipped / src.name)
    monkeypatch.setattr(bc, "PACKAGED", tmp_path / "package")
    monkeypatch.setattr(ws, "sft", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    fresh = tmp_path / "fresh-cache"
    got = build_base("tiny-xs", cache_dir=fresh, recipe=TINY)
    path = base_dir("tiny-xs", cache_dir=fresh, recipe=TINY)
    assert got.reused and got.path == str(path) and path.parent == fresh / "base"
    assert (path / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert json.loads((path / "info.json").read_text())["path"] == str(path)
    assert cached_base("tiny-xs", cache_dir=fresh, recipe=TINY) is not None
    # another recipe hash is not served from the package; RACE_NO_PACKAGED turns it off
    other = dataclasses.replace(TINY, learning_rate=1e-3)
    assert not (base_dir("tiny-xs", cache_dir=fresh, recipe=other) / "model.safetensors").exists()
    monkeypatch.setenv("RACE_NO_PACKAGED", "1")
    assert not (base_dir("tiny-xs", cache_dir=tmp_path / "off", recipe=TINY) / "info.json").exists()


def test_equal_flops_recipe_trains_smaller_sizes_longer_for_the_same_sft_flops(tmp_path):
    recipe = dataclasses.replace(TINY, steps=4, equal_flops_to="tiny-s")
    assert recipe.steps_for("tiny-s") == 4 and recipe.steps_for("tiny-xs") > 8  # ~3x cheaper per step
    assert recipe_hash("tiny-xs", recipe) != recipe_hash("tiny-xs", TINY)
    xs = build_base("tiny-xs", cache_dir=tmp_path, recipe=recipe)
    s = build_base("tiny-s", cache_dir=tmp_path, recipe=recipe)
    assert (xs.steps, s.steps) == (recipe.steps_for("tiny-xs"), 4)
    assert xs.recipe["equal_flops_to"] == "tiny-s"  # the hashed recipe, as asked
    assert abs(xs.sft_flops / s.sft_flops - 1) < 0.25, (xs.sft_flops, s.sft_flops)
