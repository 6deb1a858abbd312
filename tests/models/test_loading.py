"""load_policy: one code path for tiny names, local directories and hub names."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch

from race.models.loading import cache_dir, load_policy, resolve_device, resolve_dtype, save_policy


def test_local_directory_round_trip_through_safetensors(tiny_model_dir, tiny_policy, tmp_path):
    model, tok = tiny_policy
    files = {p.name for p in tiny_model_dir.iterdir()}
    assert "model.safetensors" in files and "config.json" in files
    assert not any(f.endswith(".bin") for f in files)
    assert model.config._attn_implementation == "eager"
    assert next(model.parameters()).dtype == torch.float32 and not model.training

    out = save_policy(model, tok, tmp_path / "copy")
    again, tok2 = load_policy(out, device="cpu")
    ids = tok(["Q:1+2\nA:1+2=3;#3."], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert tok2.padding_side == "left" and len(tok2) == len(tok)


def test_loaded_tokenizer_is_the_char_tokenizer(tiny_policy, char_tokenizer):
    # regression: AutoTokenizer on a directory with a Qwen2 config.json picks Qwen2Tokenizer,
    # whose byte-level pre-tokenizer silently drops newlines, spaces and unknown characters
    _, tok = tiny_policy
    for text in ["Q:17-17+12+3\nA:", "a b\n\nc", "23+5=28;#28."]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == char_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.padding_side == "left" and len(tok) == len(char_tokenizer)


def test_sdpa_matches_eager(tiny_model_dir, tiny_policy):
    eager, tok = tiny_policy
    sdpa, _ = load_policy(tiny_model_dir, device="cpu", attn_implementation="sdpa")
    ids = tok(["Q:12+30-4\nA:"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(eager(ids).logits, sdpa(ids).logits, atol=1e-5, rtol=1e-4)


def test_tiny_name_without_warm_start_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv("RACE_NO_PACKAGED", "1")  # else the packaged warm start is installed
    with pytest.raises(FileNotFoundError, match="race base build --sizes tiny-s"):
        load_policy("tiny-s", cache_dir=tmp_path)


def test_directory_without_safetensors_is_refused(tiny_model_dir, tmp_path):
    d = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, d)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"not really")
    with pytest.raises(FileNotFoundError, match="no model.safetensors.*safe_serialization=True"):
        load_policy(d)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_policy(tmp_path)


def test_tokenizer_larger_than_model_vocab_is_refused(tmp_path, char_tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    char_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"\(100 tokens\) exceeds the model vocabulary \(64"):
        load_policy(tmp_path)


def test_hub_name_offline_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="not a tiny family name.*local directory"):
        load_policy("race-tests/definitely-not-cached-model")


def test_device_and_dtype_resolution(monkeypatch, tmp_path):
    dev = resolve_device("auto")
    assert dev.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="dtype='int8' not understood"):
        resolve_dtype("int8", "cpu")
    with pytest.raises(ValueError, match="attn_implementation='flash'"):
        load_policy("tiny-xs", attn_implementation="flash")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    monkeypatch.setenv("RACE_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    assert cache_dir("/x/y").as_posix() == "/x/y"
    monkeypatch.delenv("RACE_CACHE")
    assert cache_dir().parts[-2:] == (".cache", "race")


def test_loaded_model_is_independent_copy(tiny_policy):
    model, _ = tiny_policy
    clone = copy.deepcopy(model)
    assert clone is not model
