"""``race flops --model org/name`` reads the model's config.json from the local Hugging
Face hub cache (no network), and says so when it is not there."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from race.accounting import AccountingError
from race.cli.app import app
from race.models.refs import cached_hub_config, looks_like_hub_name, looks_like_path, resolve_shape

CONFIG = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
          "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
          "tie_word_embeddings": True}
REPO = "Qwen/Qwen2.5-0.5B-Instruct"


def _fake_cache(root, rev="abc123", with_ref=True):
    snap = root / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(CONFIG))
    if with_ref:
        (root / "models--Qwen--Qwen2.5-0.5B-Instruct" / "refs").mkdir()
        (root / "models--Qwen--Qwen2.5-0.5B-Instruct" / "refs" / "main").write_text(rev)
    return snap / "config.json"


@pytest.mark.parametrize("var, sub", [("HF_HUB_CACHE", ""), ("HF_HOME", "hub")])
def test_a_hub_name_resolves_from_the_local_cache(tmp_path, monkeypatch, var, sub):
    for v in ("HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(v, raising=False)
    cache = tmp_path / sub if sub else tmp_path
    cfg = _fake_cache(cache)
    monkeypatch.setenv(var, str(tmp_path))
    assert cached_hub_config(REPO) == cfg
    shape = resolve_shape(REPO)
    assert shape.name == REPO and shape.num_layers == 24 and shape.hidden == 896
    # the same shape as the preset it mirrors: the cache really was read
    assert shape.num_params() == resolve_shape("qwen2.5-0.5b").num_params()


def test_a_snapshot_without_refs_main_is_still_found(tmp_path, monkeypatch):
    cfg = _fake_cache(tmp_path, with_ref=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert cached_hub_config(REPO) == cfg


def test_a_hub_name_not_in_the_cache_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(AccountingError, match="not in the local Hugging Face cache"):
        resolve_shape(REPO)


def test_race_flops_takes_a_cached_hub_name(tmp_path):
    _fake_cache(tmp_path)
    runner = CliRunner(env={"HF_HUB_CACHE": str(tmp_path), "COLUMNS": "200"})
    res = runner.invoke(app, ["flops", "--model", REPO, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["model"] == REPO


def test_race_flops_names_the_missing_cache_entry_in_one_line(tmp_path):
    runner = CliRunner(env={"HF_HUB_CACHE": str(tmp_path / "empty"), "COLUMNS": "200"})
    res = runner.invoke(app, ["flops", "--model", REPO])
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert len(out.splitlines()) == 1 and "Traceback" not in out
    assert REPO in out and "not in the local Hugging Face cache" in out and "no network" in out


@pytest.mark.parametrize("ref, is_path", [("Qwen/Qwen2.5-0.5B", False), ("tiny-s", False), ("qwen2.5-7b", False),
                                          ("prm-xs", False), ("./x", True), ("../x", True), ("/abs", True),
                                          ("~/x", True), ("x.json", True)])
def test_one_rule_says_what_is_a_path(ref, is_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing named like a hub id lies here
    assert looks_like_path(ref) is is_path
    assert looks_like_hub_name(ref) is (ref == "Qwen/Qwen2.5-0.5B")


def test_an_existing_directory_is_a_path_even_without_markers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen" / "Qwen2.5-0.5B").mkdir(parents=True)
    assert looks_like_path("Qwen/Qwen2.5-0.5B") and not looks_like_hub_name("Qwen/Qwen2.5-0.5B")


def test_a_hub_name_reward_model_is_not_loaded_as_a_path(tmp_path, monkeypatch):
    """``prm:Qwen/...`` is a reward-model name, not a directory: the builder says the name is
    unknown (it used to try to load ``Qwen/...`` as a local directory); the policy loader
    tries the hub cache; a ``./`` path is loaded as a path and refused as missing."""
    from race.models.loading import resolve_source
    from race.rewards.learned import build_learned
    from race.rewards.systems import resolve_reward

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown reward model 'Qwen/Qwen2.5-0.5B'"):
        build_learned(resolve_reward("prm:Qwen/Qwen2.5-0.5B"), device="cpu")
    assert resolve_source("Qwen/Qwen2.5-0.5B") == ("Qwen/Qwen2.5-0.5B", {"local_files_only": True})
    with pytest.raises(FileNotFoundError, match="cannot load policy from './x'"):
        resolve_source("./x")
    with pytest.raises(FileNotFoundError, match="cannot load policy from 'x.json'"):
        resolve_source("x.json")
