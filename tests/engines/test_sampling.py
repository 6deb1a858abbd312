"""The lean sampler: the functional decoder matches the HF forward token for token, and
both execute exactly the FLOPs ``generate_components(..., share_prompt=True)`` counts."""

from __future__ import annotations

import pytest
import torch

from race.accounting import PolicyCost, LoRA, ModelShape, generate_components
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


@pytest.mark.parametrize("name,lora", [("tiny-xs", False), ("tiny-xs", True), ("tiny-m", True), ("tiny-l", True)])
def test_fast_decoder_matches_hf_and_the_analytic_flops(name, lora, char_tokenizer):
    """Token for token as the HF forward, LoRA live or merged; FLOPs as ``rollout_flops``
    charges them (a merged rollout: the base passes plus the merge matmuls)."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines.kernels.fast_decode import FastDecoder
    from race.accounting.lora import lora_merge_flops
    from race.engines.sampling import encode_prompts, rollout_flops, sample

    m = _model(name, lora)
    assert FastDecoder.supports(m)
    ids, mask = encode_prompts(char_tokenizer, PROMPTS, "cpu")
    kw = dict(group=3, max_new_tokens=16, eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id)
    for greedy in (True, False):
        hf = sample(m, ids, mask, greedy=greedy, generator=torch.Generator().manual_seed(5), fast=False, **kw)
        for merge in (False, True):
            fa = sample(m, ids, mask, greedy=greedy, generator=torch.Generator().manual_seed(5), fast=True,
                        merge_lora=merge, **kw)
            assert fa.merged == (merge and lora)
            assert torch.equal(hf.completion_ids, fa.completion_ids), (greedy, merge)
            assert torch.equal(hf.completion_mask, fa.completion_mask)
    base = m.get_base_model() if lora else m
    shape = ModelShape.from_hf_config(base.config.to_dict())
    adapter = LoRA(4) if lora else None
    for fast, merge in ((True, None), (True, False), (False, None)):
        with FlopCounterMode(display=False) as fc:
            ro = sample(m, ids, mask, greedy=True, fast=fast, merge_lora=merge, **kw)
        assert ro.merged == (fast and merge is None and lora)  # merging pays at this size: the default merges
        # the functional decoder drops finished rows: each row's decode forwards are its own
        decoded = ro.decoded.tolist() if fast else [ro.completion_len] * (3 * len(PROMPTS))
        assert (ro.decoded is None) == (not fast)
        plain = generate_components(shape, [ro.prompt_len] * len(PROMPTS), decoded,
                                    lora=None if ro.merged else adapter, share_prompt=True, conventions="torch")
        expected = sum(plain.values()) + (lora_merge_flops(shape, adapter) if ro.merged else 0)
        assert fc.get_total_flops() == expected == sum(rollout_flops(PolicyCost(shape, adapter, "torch"), ro).values())


def test_merged_rollout_leaves_the_model_alone_and_sees_adapter_updates(char_tokenizer):
    """Merging builds new weights: the model's parameters are unchanged, and a change to
    the adapter shows in the next rollout (merged weights are rebuilt per rollout)."""
    from race.engines.sampling import encode_prompts, sample

    m = _model("tiny-s", True)
    ids, mask = encode_prompts(char_tokenizer, PROMPTS, "cpu")
    kw = dict(group=2, max_new_tokens=10, eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id,
              greedy=True)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    a = sample(m, ids, mask, merge_lora=True, **kw)
    assert a.merged and all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.mul_(-3.0)
    b = sample(m, ids, mask, merge_lora=True, **kw)
    hf = sample(m, ids, mask, fast=False, **kw)
    assert torch.equal(b.completion_ids, hf.completion_ids) and not torch.equal(a.completion_ids, b.completion_ids)


def test_merge_only_when_it_costs_fewer_flops(char_tokenizer):
    """A one-prompt, two-token rollout of tiny-xs runs fewer positions (13) than merging
    costs in adapter-positions (sum in*out / sum (in+out) = 23040 / 816 > 28): no merge,
    and the charge is the LoRA convention's; a full rollout merges."""
    from race.engines.kernels.fast_decode import FastDecoder
    from race.engines.sampling import encode_prompts, sample

    m = _model("tiny-xs", True)
    dec = FastDecoder(m)
    assert not dec.merge_pays(28) and dec.merge_pays(29)
    ids, mask = encode_prompts(char_tokenizer, PROMPTS[1:2], "cpu")
    assert ids.shape[1] + 1 < 28
    kw = dict(eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id, greedy=True)
    assert not sample(m, ids, mask, group=1, max_new_tokens=2, **kw).merged
    assert sample(m, ids, mask, group=4, max_new_tokens=16, **kw).merged
    assert not sample(_model("tiny-xs", False), ids, mask, group=4, max_new_tokens=16, **kw).merged


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


def test_draw_follows_the_softmax_distribution_and_skips_zero_probability_tokens():
    """The inverse-CDF sampler: frequencies over 40,000 draws within 4 standard errors of
    softmax(logits / T) for every token, never a -inf token, deterministic under a seed."""
    from race.engines.sampling import draw

    logits = torch.tensor([[2.0, 0.0, -1.0, float("-inf"), 1.0]]).repeat(40_000, 1)
    probs = torch.softmax(logits[0] / 0.7, dim=-1)
    toks = draw(logits, 0.7, torch.Generator().manual_seed(0))
    freq = torch.bincount(toks, minlength=5).double() / len(toks)
    se = (probs.double() * (1 - probs.double()) / len(toks)).sqrt()
    assert freq[3] == 0
    assert bool(((freq - probs.double()).abs() <= 4 * se + 1e-12).all()), (freq, probs)
    again = draw(logits, 0.7, torch.Generator().manual_seed(0))
    assert torch.equal(toks, again)


@pytest.mark.parametrize("greedy", [True, False])
def test_finished_rows_leave_the_batch_tokens_unchanged_and_flops_as_charged(greedy, char_tokenizer):
    """Rows that produced EOS are dropped from the functional decoder's batch: the tokens
    are the HF loop's (which keeps every row), the measured FLOPs are ``rollout_flops``
    over each row's ``decoded`` tokens, and fewer than keeping every row to the end."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines.sampling import encode_prompts, rollout_flops, sample

    m = _model("tiny-s", True)
    ids, mask = encode_prompts(char_tokenizer, PROMPTS, "cpu")
    kw = dict(group=4, max_new_tokens=24, pad_id=char_tokenizer.pad_token_id, greedy=greedy)
    free = sample(m, ids, mask, eos_id=-1, generator=torch.Generator().manual_seed(3), **kw)
    eos = _ragged_eos(free.completion_ids)  # rows end at various steps, whatever the BLAS path's tokens
    hf = sample(m, ids, mask, eos_id=eos, generator=torch.Generator().manual_seed(3), fast=False, **kw)
    with FlopCounterMode(display=False) as fc:
        fa = sample(m, ids, mask, eos_id=eos, generator=torch.Generator().manual_seed(3), fast=True, **kw)
    assert torch.equal(fa.completion_ids, hf.completion_ids) and torch.equal(fa.completion_mask, hf.completion_mask)
    T = fa.completion_len
    assert fa.decoded is not None and int(fa.decoded.min()) < T == int(fa.decoded.max())  # some rows left early
    assert bool((fa.decoded >= fa.lengths).all())  # a row leaves only after its EOS
    shape = ModelShape.from_hf_config(m.get_base_model().config.to_dict())
    charged = sum(rollout_flops(PolicyCost(shape, LoRA(4), "torch"), fa).values())
    fa.decoded = None  # what keeping every row to the end would charge
    assert fc.get_total_flops() == charged < sum(rollout_flops(PolicyCost(shape, LoRA(4), "torch"), fa).values())


def _ragged_eos(completions: torch.Tensor) -> int:
    """A token to call EOS so that rows end at different steps: one that never comes first
    in a row and first appears at different positions across rows (or in some rows only).
    Chosen from the free-running tokens, so the test does not depend on which tokens one
    thread count's rounding happens to produce (picking the most common token did: with
    one thread it was every row's second token)."""
    rows = completions.tolist()
    first_col = {r[0] for r in rows}
    best, spread = None, -1
    for tok in sorted({t for r in rows for t in r[1:]} - first_col):
        firsts = {r.index(tok) if tok in r else len(r) for r in rows}
        if len(firsts) > spread:
            best, spread = tok, len(firsts)
    assert best is not None and spread > 1, "no token ends the rows at different steps"
    return best


def test_fast_decoder_on_a_bfloat16_base_with_float32_adapters_is_as_close_as_hf(char_tokenizer):
    """PEFT keeps LoRA weights in fp32 over a bf16 base. The decoder's next-token logits
    must be as close to the fp32 model's as HF's own bf16 forward is (within 2x its error:
    both round every layer's output to bf16, in different op orders). Live adapters only:
    a merge into the bf16 weights is refused (it would round a small update away;
    tests/engines/test_precision.py), where this test once checked it too."""
    from race.engines.kernels.fast_decode import FastDecoder
    from race.engines.sampling import encode_prompts

    ref = _model("tiny-m", True)  # fp32 base and adapters
    m = _model("tiny-m", True)
    m.load_state_dict(ref.state_dict())  # PEFT draws lora_A from the global RNG: the same adapters in both
    m.get_base_model().to(torch.bfloat16)
    for n, p in m.named_parameters():
        if "lora_" in n:
            assert p.dtype == torch.bfloat16
            p.data = p.data.float()  # what PEFT's autocast_adapter_dtype leaves
    ids, mask = encode_prompts(char_tokenizer, PROMPTS, "cpu")
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits[:, -1].float()
        hf = m(input_ids=ids, attention_mask=mask).logits[:, -1].float()
    dec = FastDecoder(m)
    got = dec.prefill(ids, mask, ids.shape[1] + 4).float()
    hf_err, err = (hf - want).abs().max().item(), (got - want).abs().max().item()
    assert 0 < hf_err < 0.1 * want.abs().max().item()  # bf16 rounding is visible, and small
    assert err <= 2 * hf_err, (err, hf_err)
