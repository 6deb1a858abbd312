"""The lean sampler: the functional decoder matches the HF forward token for token, and
both execute exactly the FLOPs ``generate_components(..., share_prompt=True)`` counts."""

from __future__ import annotations

import pytest
import torch

from race.accounting import LoRA, ModelShape, generate_components
from race.spec.run import LoraSettings

PROMPTS = ["Q:12+5-3\nA:", "Q:1+2\nA:", "Q:40-13+2-7\nA:"]


def _model(name: str, lora: bool):
    from race.models import build_tiny_model, wrap_lora

    m = build_tiny_model(name, seed=1)
    if lora:
        m = wrap_lora(m, LoraSettings(r=4, lora_alpha=8))
        g = torch.Generator().manual_seed(0)
        for n, p in m.named_parameters():
            if "lora_B" in n:  # PEFT starts B at 0; make the adapter matter
                p.data.normal_(0, 0.5, generator=g)
    return m


@pytest.mark.parametrize("name,lora", [("tiny-xs", False), ("tiny-xs", True), ("tiny-m", True)])
def test_fast_decoder_matches_hf_and_the_analytic_flops(name, lora, char_tokenizer):
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines.fast_decode import FastDecoder
    from race.engines.sampling import encode_prompts, sample

    m = _model(name, lora)
    assert FastDecoder.supports(m)
    ids, mask = encode_prompts(char_tokenizer, PROMPTS, "cpu")
    kw = dict(group=3, max_new_tokens=16, eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id)
    for greedy in (True, False):
        hf = sample(m, ids, mask, greedy=greedy, generator=torch.Generator().manual_seed(5), fast=False, **kw)
        fa = sample(m, ids, mask, greedy=greedy, generator=torch.Generator().manual_seed(5), fast=True, **kw)
        assert torch.equal(hf.completion_ids, fa.completion_ids)
        assert torch.equal(hf.completion_mask, fa.completion_mask)
    base = m.get_base_model() if lora else m
    shape = ModelShape.from_hf_config(base.config.to_dict())
    for fast in (True, False):
        with FlopCounterMode(display=False) as fc:
            ro = sample(m, ids, mask, greedy=True, fast=fast, **kw)
        analytic = generate_components(shape, [ro.prompt_len] * len(PROMPTS), [ro.completion_len] * (3 * len(PROMPTS)),
                                       lora=LoRA(4) if lora else None, share_prompt=True, conventions="torch")
        assert fc.get_total_flops() == sum(analytic.values())


def test_completion_mask_stops_after_eos(char_tokenizer):
    from race.engines.sampling import decode_completions, encode_prompts, sample

    m = _model("tiny-xs", False)
    ids, mask = encode_prompts(char_tokenizer, PROMPTS[:2], "cpu")
    ro = sample(m, ids, mask, group=4, max_new_tokens=40, eos_id=char_tokenizer.eos_token_id,
                pad_id=char_tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0))
    eos = char_tokenizer.eos_token_id
    for row, keep, trunc in zip(ro.completion_ids.tolist(), ro.completion_mask.tolist(), ro.truncated.tolist()):
        n = sum(keep)
        assert keep == [1] * n + [0] * (len(keep) - n)
        if trunc:
            assert eos not in row and n == len(row)
        else:
            assert row[n - 1] == eos and eos not in row[: n - 1]
    assert len(decode_completions(char_tokenizer, ro)) == 8


def test_per_row_greedy_mask_mixes_greedy_and_sampled_rows_in_one_loop(char_tokenizer):
    """Evaluation runs greedy and pass@k rows in one decode loop: greedy rows give what
    an all-greedy call gives, an all-True mask is plain greedy, a wrong shape is refused."""
    from race.engines.sampling import encode_prompts, sample

    m = _model("tiny-s", True)
    ids, mask = encode_prompts(char_tokenizer, PROMPTS, "cpu")
    kw = dict(group=1, max_new_tokens=12, eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id)
    greedy = sample(m, ids, mask, greedy=True, **kw)
    flags = torch.tensor([True, False, True])
    mixed = sample(m, ids, mask, greedy=flags, generator=torch.Generator().manual_seed(3), **kw)
    T = min(greedy.completion_len, mixed.completion_len)
    for row in (0, 2):
        n = int(greedy.lengths[row])
        assert torch.equal(mixed.completion_ids[row, :n], greedy.completion_ids[row, :n]) and n <= T
    sampled = [sample(m, ids, mask, greedy=flags, generator=torch.Generator().manual_seed(s), **kw) for s in range(4)]
    assert len({tuple(r.completion_ids[1].tolist()) for r in sampled}) > 1  # row 1 really samples
    all_true = sample(m, ids, mask, greedy=torch.ones(3, dtype=torch.bool), **kw)
    assert torch.equal(all_true.completion_ids, greedy.completion_ids)
    with pytest.raises(ValueError, match="one flag per row"):
        sample(m, ids, mask, greedy=torch.ones(2, dtype=torch.bool), **kw)
