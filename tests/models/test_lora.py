"""wrap_lora uses real PEFT; the reference policy is the base with the adapter off."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from race.spec.run import LoraSettings
from race.models.lora import reference_policy, trainable_params, wrap_lora


@pytest.fixture()
def wrapped(tiny_policy):
    model, tok = tiny_policy
    base = copy.deepcopy(model)
    peft_model = wrap_lora(copy.deepcopy(model), LoraSettings(r=4, lora_alpha=8))
    ids = tok(["Q:3+4-1\nA:3+4=7;"], return_tensors="pt")["input_ids"]
    return base, peft_model, ids


def test_wrap_is_peft_and_only_adapter_trains(wrapped):
    from peft import PeftModel

    base, model, _ = wrapped
    assert isinstance(model, PeftModel)
    assert model.peft_config["default"].r == 4
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    # 7 targets per layer, r * (in + out) each (tiny-xs: hidden 48, kv 2 x 12, MLP 112)
    cfg = base.config
    h, inter = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_layer = sum(4 * (i + o) for i, o in [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)])
    assert trainable_params(model) == cfg.num_hidden_layers * per_layer


def test_reference_policy_gives_base_outputs(wrapped):
    base, model, ids = wrapped
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)  # move the adapter away from its zero init
        base_logits = base(ids).logits
        moved = model(ids).logits
    assert not torch.allclose(moved, base_logits, atol=1e-4)
    with reference_policy(model) as ref:
        torch.testing.assert_close(ref(ids).logits, base_logits)
        assert not torch.is_grad_enabled()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, moved)  # adapter back on


def test_rank_larger_than_matrix_is_refused(tiny_policy):
    model, _ = tiny_policy
    # tiny-xs: k_proj/v_proj map 48 -> 24 (GQA), q_proj/o_proj 48 -> 48
    with pytest.raises(ValueError, match=r"r=40 exceeds min\(in, out\) of 8 .*k_proj \(48 -> 24\).*set lora.r <= 24"):
        wrap_lora(copy.deepcopy(model), LoraSettings(r=40, target_modules=["q_proj", "k_proj", "v_proj"]))
    with pytest.raises(ValueError, match=r"set lora.r <= 48"):
        wrap_lora(copy.deepcopy(model), LoraSettings(r=49, target_modules=["q_proj", "o_proj"]))
    wrap_lora(copy.deepcopy(model), LoraSettings(r=40, target_modules=["q_proj", "o_proj"]))  # 48x48: fine


def test_target_that_matches_nothing_is_refused(tiny_policy):
    model, _ = tiny_policy
    settings = SimpleNamespace(r=2, lora_alpha=2.0, lora_dropout=0.0, target_modules=["q_proj", "c_attn"])
    with pytest.raises(ValueError, match=r"\['c_attn'\] match no linear layer"):
        wrap_lora(copy.deepcopy(model), settings)


def test_reference_policy_refuses_full_finetuning(tiny_policy):
    with pytest.raises(TypeError, match="frozen copy"):
        with reference_policy(tiny_policy[0]):
            pass
