"""Exactness on the real architectures of the seven Qwen2.5 presets, without weights.

Models live on the meta device (shapes, no storage), where FlopCounterMode counts exactly
as on real tensors. Unmarked tests run every preset at 1 and 2 layers of real width and
prove the per-layer scaling both ways:

- analytic: f(L) == f(1) + (L - 1) * (f(2) - f(1)) for every pass;
- measured: m(2) - m(1) == the FLOPs FlopCounterMode attributes to layer 1 itself, and
  m(1) + (L - 1) * (m(2) - m(1)) == analytic f(L), the full-depth number.

The full-depth runs of every preset (80 layers for 72B) are marked slow; Qwen2.5-0.5B at
full depth runs unmarked."""

from __future__ import annotations

import pytest
import torch

from race.accounting import LAYER_MATRICES, LoRA, ModelShape, forward_flops, generate_flops, train_flops
from race.measure import Counter, build_model, measure_forward, measure_generate, measure_train_step

PRESETS = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b"]
B, S, KEEP, P, TNEW, RANK = 2, 24, 5, 12, 3, 16
T = "torch"


def _meta_ids(rows: int, width: int) -> torch.Tensor:
    return torch.zeros(rows, width, dtype=torch.long, device="meta")


def _analytic(shape: ModelShape, lora: bool = True) -> dict[str, int]:
    out = {
        "forward": forward_flops(shape, [S] * B, logits=KEEP, conventions=T),
        "train": train_flops(shape, [S] * B, logits=KEEP, conventions=T),
        "generate": generate_flops(shape, [P] * B, [TNEW] * B, conventions=T),
    }
    if lora:
        out["lora_train"] = train_flops(shape, [S] * B, lora=LoRA(RANK, LAYER_MATRICES), logits=KEEP, conventions=T)
    return out


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=RANK, lora_alpha=RANK, target_modules=list(LAYER_MATRICES)))


def _measure(shape: ModelShape, layers: int, lora: bool = True) -> tuple[dict[str, int], dict[str, int]]:
    """Measured counts of each pass, and the FLOPs attributed to the last layer's module."""
    model = build_model(shape, num_layers=layers, device="meta")
    ids = _meta_ids(B, S)
    out: dict[str, int] = {"forward": measure_forward(model, ids, logits_to_keep=KEEP)}
    layer_name = f"Qwen2ForCausalLM.model.layers.{layers - 1}"
    with Counter() as c:
        model(ids, logits_to_keep=KEEP).logits.float().logsumexp(-1).mean().backward()
    out["train"] = c.total
    per_layer = {"train": c.module_flops(layer_name)}
    out["generate"] = measure_generate(model, _meta_ids(B, P), TNEW, use_generate=False).total
    if lora:
        out["lora_train"] = measure_train_step(_lora(model), ids, logits_to_keep=KEEP).total
    return out, per_layer


@pytest.mark.parametrize("name", PRESETS)
def test_preset_architecture_and_layer_scaling(name):
    """LoRA is measured at real width for the smallest and largest presets (the tiny-model
    tests cover LoRA target sets and ranks; this keeps the unmarked set fast)."""
    shape = ModelShape.from_preset(name)
    lora = name in ("qwen2.5-0.5b", "qwen2.5-72b")
    L = shape.num_layers
    # The meta model is the preset's architecture: its config reads back as the preset.
    model = build_model(shape, num_layers=L, device="meta")
    assert ModelShape.from_hf_config(model.config.to_dict(), name=name) == shape
    assert sum(p.numel() for p in model.parameters()) == shape.num_params()
    del model

    a1, a2, aL = (_analytic(shape.with_layers(n), lora) for n in (1, 2, L))
    m1, _ = _measure(shape, 1, lora)
    m2, layer = _measure(shape, 2, lora)
    assert set(m1) == set(aL)
    for k in aL:
        # analytic == measured at 1 and 2 layers of real width
        assert m1[k] == a1[k], (name, k, 1)
        assert m2[k] == a2[k], (name, k, 2)
        # analytic scaling: L layers == 1 layer + (L - 1) further layers
        assert aL[k] == a1[k] + (L - 1) * (a2[k] - a1[k]), (name, k)
        # measured scaling reaches the analytic full-depth number
        assert m1[k] + (L - 1) * (m2[k] - m1[k]) == aL[k], (name, k)
    # measured: the second layer's own FLOPs are the 2-layer minus 1-layer difference
    assert m2["train"] - m1["train"] == layer["train"]


def test_qwen25_05b_full_depth():
    shape = ModelShape.from_preset("qwen2.5-0.5b")
    model = build_model(shape, device="meta")
    m = measure_train_step(model, _meta_ids(B, S), logits_to_keep=KEEP)
    assert m.forward == forward_flops(shape, [S] * B, logits=KEEP, conventions=T)
    assert m.total == train_flops(shape, [S] * B, logits=KEEP, conventions=T)


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_preset_full_depth(name):
    shape = ModelShape.from_preset(name)
    measured, _ = _measure(shape, shape.num_layers)
    assert measured == _analytic(shape)
