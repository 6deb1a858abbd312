"""The functional log-prob forward: HF's values and gradients, HF eager's FLOPs forward and
backward (= the ledger's ``torch`` count), LoRA dropout in training, and the HF fallback
for a gradient-checkpointing model."""

from __future__ import annotations

import pytest
import torch
from shared_passes import shared_pass

from race.accounting import LoRA, ModelShape, learning_components
from race.spec.run import LoraSettings

PROMPTS = ["Q:12+5-3\nA:", "Q:1+2\nA:", "Q:40-13+2-7\nA:"]


def _model(name: str, lora: bool, dropout: float = 0.0):
    from race.models import build_tiny_model, wrap_lora

    m = build_tiny_model(name, seed=1, attn_implementation="eager")
    if lora:
        torch.manual_seed(0)  # PEFT draws lora_A from the global RNG: the same adapter whichever tests ran before
        m = wrap_lora(m, LoraSettings(r=4, lora_alpha=8, lora_dropout=dropout))
        g = torch.Generator().manual_seed(0)
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.data.normal_(0, 0.5, generator=g)
    return m


def _batch(m, tok):
    from race.engines.sampling import encode_prompts, sample

    ids, mask = encode_prompts(tok, PROMPTS, "cpu")
    return sample(m, ids, mask, group=2, max_new_tokens=10, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                  generator=torch.Generator().manual_seed(1))


def _pass(m, ro, fast: bool):
    """Log-probs and the gradients of a masked sum of them (one update pass)."""
    from race.engines.grpo_math import completion_logprobs

    m.zero_grad(set_to_none=True)
    lp = completion_logprobs(m, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask, 0.7, fast=fast)
    (lp * ro.completion_mask).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name,lora", [("tiny-xs", True), ("tiny-xs", False), ("tiny-l", True)])
def test_functional_logprobs_and_gradients_match_hf(name, lora, char_tokenizer):
    from race.engines.kernels import fast_forward

    m = _model(name, lora)
    assert fast_forward.supports(m)
    ro = _batch(m, char_tokenizer)
    m.train()
    hf_lp, hf_g = _pass(m, ro, fast=False)
    fa_lp, fa_g = _pass(m, ro, fast=True)
    keep = ro.completion_mask.bool()
    assert torch.allclose(fa_lp[keep], hf_lp[keep], atol=1e-5)
    assert hf_g.keys() == fa_g.keys() and len(hf_g) > 0
    for n, g in hf_g.items():  # the padding token's embedding row gets no gradient in either
        assert float((fa_g[n] - g).norm()) <= 1e-4 * float(g.norm()) + 1e-7, n


@pytest.mark.parametrize("lora", [True, False])
def test_functional_pass_executes_hf_eager_flops_and_the_ledgers(lora, char_tokenizer):
    from torch.utils.flop_counter import FlopCounterMode

    m = _model("tiny-m", lora)
    ro = _batch(m, char_tokenizer)
    m.train()
    counts = {}
    for fast in (False, True):
        with FlopCounterMode(display=False) as fc:
            _pass(m, ro, fast)
        counts[fast] = fc.get_total_flops()
    base = m.get_base_model() if lora else m
    shape = ModelShape.from_hf_config(base.config.to_dict())
    B, P, T = ro.completion_ids.shape[0], ro.prompt_len, ro.completion_len
    learn = learning_components(shape, [P + T] * B, [T] * B, lora=LoRA(4) if lora else None, conventions="torch",
                                inputs_require_grad=False)
    assert counts[True] == counts[False] == learn["update/forward"] + learn["update/backward"]


def test_lora_dropout_applies_in_training_only(char_tokenizer):
    from race.engines.grpo_math import completion_logprobs

    m = _model("tiny-s", True, dropout=0.5)
    ro = _batch(m, char_tokenizer)
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    m.train()
    with torch.no_grad():
        a, b = (completion_logprobs(m, *args, fast=True) for _ in range(2))
    assert not torch.allclose(a, b)
    m.eval()
    with torch.no_grad():
        e_fast, e_hf = completion_logprobs(m, *args, fast=True), completion_logprobs(m, *args, fast=False)
    assert torch.allclose(e_fast, e_hf, atol=1e-5)


def test_gradient_checkpointing_model_keeps_the_hf_forward(char_tokenizer):
    from race.engines.kernels import fast_forward

    m = _model("tiny-xs", True)
    base = m.get_base_model()
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.2x
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert not fast_forward.supports(m)
    from race.engines.grpo_math import completion_logprobs

    ro = _batch(_model("tiny-xs", True), char_tokenizer)
    with pytest.raises(ValueError, match="pass seg=None"):  # no prefix-shared pass on the HF forward
        completion_logprobs(m, ro.prompt_ids[::2], ro.prompt_mask[::2], ro.completion_ids, ro.completion_mask,
                            seg=torch.arange(ro.completion_ids.shape[0]) // 2)
    plain = _model("tiny-xs", False)
    plain.config.attention_dropout = 0.1
    assert not fast_forward.supports(plain)


def _eos_batch(m, tok, group: int):
    from race.engines.sampling import encode_prompts, sample

    ids, mask = encode_prompts(tok, PROMPTS, "cpu")  # prompts of different lengths: left padding
    ro = sample(m, ids, mask, group=group, max_new_tokens=10, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                generator=torch.Generator().manual_seed(1))
    ro.completion_mask[1, 4:] = 0  # completions that ended early: padding after EOS, never a key
    ro.completion_mask[group + 2, 1:] = 0
    return ro


@pytest.mark.parametrize("name,lora,size", [("tiny-xs", True, 100), ("tiny-l", True, 3), ("tiny-m", False, 5)])
def test_prefix_shared_passes_give_the_unshared_logprobs_and_gradients(name, lora, size, char_tokenizer):
    """Each prompt run once for its group (and once per micro-batch where one splits a
    group) gives HF's log-probs and gradients."""
    m = _model(name, lora)
    ro = _eos_batch(m, char_tokenizer, group=4)
    m.train()
    hf_lp, hf_g = _pass(m, ro, fast=False)
    sh_lp, sh_g = shared_pass(m, ro, size)
    keep = ro.completion_mask.bool()
    assert torch.allclose(sh_lp[keep], hf_lp[keep], atol=1e-5)
    assert hf_g.keys() == sh_g.keys() and len(hf_g) > 0
    for n, g in hf_g.items():
        assert float((sh_g[n] - g).norm()) <= 1e-4 * float(g.norm()) + 1e-7, n


@pytest.mark.parametrize("lora,size", [(True, 12), (True, 5), (False, 3)])
def test_prefix_shared_passes_execute_what_the_ledger_charges(lora, size, char_tokenizer):
    """FlopCounterMode over the shared forward + backward equals ``learning_components``
    with ``prompt_groups`` (micro-batches of ``size`` rows, groups of 4), and is below
    the unshared pass."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.accounting import prompt_groups

    m = _model("tiny-m", lora)
    ro = _eos_batch(m, char_tokenizer, group=4)
    m.train()
    with FlopCounterMode(display=False) as fc:
        from race.engines.builtin.micro_batch import micro_slices, rows, _logprobs_of

        for sl in micro_slices(ro.prompt_ids.shape[0], size):
            r = rows(ro, sl)
            (_logprobs_of(m, r, 1.0, True, sl.start) * r.completion_mask).sum().backward()
    base = m.get_base_model() if lora else m
    shape = ModelShape.from_hf_config(base.config.to_dict())
    B, P, T = ro.completion_ids.shape[0], ro.prompt_len, ro.completion_len
    kw = dict(lora=LoRA(4) if lora else None, conventions="torch")
    groups = prompt_groups(B, 4, size)
    shared = learning_components(shape, [P + T] * B, [T] * B, prompt_groups=groups, **kw)
    plain = learning_components(shape, [P + T] * B, [T] * B, **kw)
    assert fc.get_total_flops() == shared["update/forward"] + shared["update/backward"]
    assert shared["update/forward"] < plain["update/forward"]


def test_a_shared_pass_refuses_rows_whose_group_has_other_prompts(char_tokenizer):
    from race.engines.builtin.micro_batch import logprobs

    m = _model("tiny-xs", True)
    ro = _eos_batch(m, char_tokenizer, group=2)
    ro.group = 3  # the rows are in groups of 2: groups of 3 mix prompts
    with pytest.raises(ValueError, match="different prompts"):
        logprobs(m, ro, 100, 1.0, share=True)
