"""Reward-phase keys: an outcome reward model (HF sequence classification) and a
generative judge, measured against ``reward_model_flops`` under conventions="torch"."""

from __future__ import annotations

import torch

from race.accounting import ModelShape, RewardSystem, grpo_step_flops, reward_model_flops
from race.measure import measure_generate, measure_reward_forward, qwen2_config

T = "torch"
BODY = ModelShape("rm", num_layers=2, hidden=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate=48, vocab=61)


def _orm():
    from transformers import Qwen2ForSequenceClassification

    cfg = qwen2_config(BODY, num_labels=1, pad_token_id=0, architectures=["Qwen2ForSequenceClassification"])
    torch.manual_seed(0)
    return Qwen2ForSequenceClassification(cfg).eval(), ModelShape.from_hf_config(cfg.to_dict(), name="orm")


def test_orm_forward_and_head(make_batch):
    model, shape = _orm()
    assert shape.head == ((32, 1),)
    ids, mask = make_batch(BODY.vocab)
    measured = measure_reward_forward(model, ids, mask)
    rm = RewardSystem("orm", shape)
    # HF's sequence-classification models run the score head at every position and pick the
    # last non-pad one afterwards: that is head_positions="all", not the "last" default.
    assert measured == reward_model_flops(rm, [13] * 3, head_positions="all", conventions=T)
    last = reward_model_flops(rm, [13] * 3, conventions=T)
    assert measured["reward/forward"] == last["reward/forward"]
    assert measured["reward/head"] == 13 * last["reward/head"]
    step = grpo_step_flops(BODY, [9] * 3, [4] * 3, num_generations=3, reward=rm, reward_seq_lens=[13] * 3,
                           reward_head_positions="all", conventions=T)
    assert {k: v for k, v in step.components.items() if k.startswith("reward/")} == measured


def test_judge_generate(make_model, make_batch):
    judge = make_model(BODY)
    ids, mask = make_batch(BODY.vocab, rows=2, width=10, pads=(3, 0))
    g = measure_generate(judge, ids, 4, mask, phase="reward")
    assert g.components == reward_model_flops(RewardSystem("judge", BODY), [10, 10], judge_completion_lens=[4, 4],
                                              conventions=T)
