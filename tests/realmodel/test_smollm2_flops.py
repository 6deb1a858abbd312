"""Accounting on the real checkpoint: under ``conventions="torch"`` the analytic FLOPs equal
``FlopCounterMode``'s count (0 FLOPs apart) on SmolLM2-135M-Instruct as imported --
grouped-query attention (9 heads over 3 KV heads), tied embeddings, 30 layers -- for the
rollout (prefill and decode), a log-prob pass, the update with LoRA and with full
fine-tuning, each with and without gradient checkpointing, and a whole GRPO step.

Batches are small (2-4 sequences of 6-12 tokens: a few seconds each) and real: the chat
template's tokens of two questions, left-padded."""

from __future__ import annotations

import copy

import pytest
import torch

from race.accounting import LAYER_MATRICES, LoRA, ModelShape, forward_flops, generate_components, grpo_step_flops, \
    train_flops
from race.measure import measure_forward, measure_generate, measure_grpo_step, measure_train_step, relative_errors

T = "torch"
pytestmark = pytest.mark.realmodel


@pytest.fixture(scope="module")
def shape(smollm2_dir):
    return ModelShape.from_hf_config(smollm2_dir / "config.json", name="smollm2-135m")


@pytest.fixture(scope="module")
def batch(smollm2):
    """Two real prompts (the last 10 tokens of each, the shorter one left-padded by 2)."""
    _, tok = smollm2
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in ("What is 7 + 12?", "What is 30 - 4?")]
    rows = [tok(t, add_special_tokens=False)["input_ids"][-10:] for t in texts]
    rows[1] = rows[1][2:]
    width = 10
    ids = torch.full((2, width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def test_the_import_is_smollm2(shape, smollm2):
    """The shape the accounting reads is SmolLM2-135M's, and it has every parameter."""
    model, tok = smollm2
    assert (shape.num_layers, shape.hidden, shape.num_heads, shape.num_kv_heads, shape.head_dim,
            shape.intermediate, shape.vocab, shape.tie_embeddings) == (30, 576, 9, 3, 64, 1536, 49152, True)
    assert sum(p.numel() for p in model.parameters()) == shape.num_params() == 134_515_008
    assert tok.chat_template and "<|im_start|>" in tok.chat_template


def lora(model, rank, gc):
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(model)
    if gc:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    pm = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                         target_modules=list(LAYER_MATRICES)))
    pm.train()
    return pm


def test_rollout(shape, smollm2, batch):
    """Prefill (logits at the last prompt position) and KV-cache decode, through HF generate."""
    ids, mask = batch
    g = measure_generate(smollm2[0], ids, 4, mask)
    ana = generate_components(shape, [10, 10], [4, 4], conventions=T)
    assert g.components == {"rollout/prefill": ana["prefill"], "rollout/decode": ana["decode"]}


def test_logprob_pass(shape, smollm2, batch):
    """A log-prob pass keeping the logits of the last 5 positions (the completion's)."""
    ids, mask = batch
    assert measure_forward(smollm2[0], ids, mask, 5) == forward_flops(shape, [10, 10], logits=5, conventions=T)


@pytest.mark.parametrize("gc", [False, True], ids=["plain", "checkpointed"])
def test_update_lora(shape, smollm2, batch, gc):
    ids, mask = batch
    m = measure_train_step(lora(smollm2[0], 8, gc), ids, mask, logits_to_keep=5)
    kw = dict(lora=LoRA(8), logits=5, inputs_require_grad=gc, conventions=T)
    assert m.total == train_flops(shape, [10, 10], **kw)
    assert m.hardware_total == train_flops(shape, [10, 10], recompute=gc, **kw)
    assert (m.recompute > 0) == gc


@pytest.mark.slow
@pytest.mark.parametrize("gc", [False, True], ids=["plain", "checkpointed"])
def test_update_full_finetune(shape, smollm2, batch, gc):
    ids, mask = batch
    model = copy.deepcopy(smollm2[0])
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    m = measure_train_step(model, ids, mask, logits_to_keep=5)
    assert m.total == train_flops(shape, [10, 10], logits=5, conventions=T)
    assert m.hardware_total == train_flops(shape, [10, 10], logits=5, recompute=gc, recompute_early_stop=True,
                                           conventions=T)
    assert m.backward == 2 * m.forward


@pytest.mark.slow
def test_grpo_step(shape, smollm2, batch):
    """Every phase key of a GRPO step (rollout, old-policy and reference log-probs, update,
    recompute) against one measured, gradient-checkpointed LoRA step: 2 prompts x G=2, 3
    new tokens."""
    ids, mask = batch
    gc = True
    pm = lora(smollm2[0], 4, gc)
    meter = measure_grpo_step(pm, ids, mask, num_generations=2, max_new_tokens=3, beta=0.04, num_iterations=2,
                              train_logits="completion+1")
    ana = grpo_step_flops(shape, [10] * 4, [3] * 4, num_generations=2, lora=LoRA(4), beta=0.04, num_iterations=2,
                          train_logits="completion+1", recompute=gc, inputs_require_grad=gc, conventions=T)
    assert meter.components == ana.components, relative_errors(ana.components, meter.components)
    assert meter.hardware_total == ana.hardware_total
