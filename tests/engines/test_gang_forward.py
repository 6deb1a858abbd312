"""The gang's batched multi-LoRA passes: per member, its solo log-probs, gradients and
rollout; in FLOPs, the sum of the members' solo ledger charges (FlopCounterMode).

Tolerances: the gang runs each member's solo ops, except that the base matmul covers all
members' rows, so an output element's k-reduction may be blocked differently (float32,
k <= 4 x hidden): log-probs agree to 1e-5 absolute and gradients to 1e-4 of their norm,
the bounds the solo functional pass is held to against HF's forward (test_fast_forward)."""

from __future__ import annotations

import pytest
import torch
from shared_passes import shared_pass

from race.accounting import PolicyCost, LoRA, ModelShape, learning_components, prompt_groups
from race.spec.run import LoraSettings

PROMPTS = [["Q:12+5-3\nA:", "Q:1+2\nA:"], ["Q:40-13+2-7\nA:"], ["Q:3+3\nA:", "Q:9-1+4\nA:", "Q:7+7\nA:"]]
#: per member: (LoRA rank, targets, group size, micro-batch rows)
MEMBERS = [(4, "all-linear", 2, 100), (2, ["q_proj", "v_proj", "down_proj"], 3, 2), (4, "all-linear", 2, 4)]


def _members(name: str = "tiny-xs"):
    from race.models import build_tiny_model, wrap_lora

    out = []
    for i, (r, targets, _, _) in enumerate(MEMBERS):
        m = wrap_lora(build_tiny_model(name, seed=1, attn_implementation="eager"),
                      LoraSettings(r=r, lora_alpha=8, target_modules=targets))
        g = torch.Generator().manual_seed(10 + i)
        for n, p in m.named_parameters():
            if "lora_B" in n:  # a trained-looking adapter, different per member
                p.data.normal_(0, 0.5, generator=g)
        out.append(m)
    return out


def _rollouts(models, tok, greedy=False):
    from race.engines.sampling import encode_prompts, sample

    ros = []
    for i, (m, prompts, (_, _, G, _)) in enumerate(zip(models, PROMPTS, MEMBERS)):
        ids, mask = encode_prompts(tok, prompts, "cpu")
        ros.append(sample(m, ids, mask, group=G, max_new_tokens=9, eos_id=tok.eos_token_id,
                          pad_id=tok.pad_token_id, temperature=0.9, greedy=greedy,
                          generator=torch.Generator().manual_seed(i)))
    return ros


def _gang(models, ros, shared_rows=None):
    """The same passes for every member at once (one backward per micro-batch round);
    ``shared_rows``: the gang decoder's cap on the rows of one shared base matmul."""
    from race.engines.gang.forward import GangDecoder
    from race.engines.gang.passes import PassJob, _logprobs_round, _rounds, gang_logprobs

    jobs = [PassJob(i, ro, MEMBERS[i][3], 0.7) for i, ro in enumerate(ros)]
    for m in models:
        m.zero_grad(set_to_none=True)
    gdec = GangDecoder(models, shared_rows=shared_rows)
    for rnd in _rounds(jobs):
        lps = _logprobs_round(gdec, jobs, rnd)
        sum((lp * jobs[i].ro.completion_mask[sl]).sum() for (i, sl), lp in zip(rnd, lps)).backward()
    lps = gang_logprobs(models, jobs)
    return lps, [{n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None} for m in models]


@pytest.mark.parametrize("shared_rows", [None, 1, 30])
def test_gang_pass_gives_each_member_its_solo_logprobs_and_gradients(shared_rows, char_tokenizer):
    """Whether the base matmul covers every member's rows (no cap), each segment's alone
    (cap 1) or some segments together (cap 30 rows), each member gets its solo pass."""
    models = _members()
    ros = _rollouts(models, char_tokenizer)
    for m in models:
        m.train()
    solo = [shared_pass(m, ro, MEMBERS[i][3]) for i, (m, ro) in enumerate(zip(models, ros))]
    g_lps, g_grads = _gang(models, ros, shared_rows)
    for (lp, grads), glp, gg, ro in zip(solo, g_lps, g_grads, ros):
        keep = ro.completion_mask.bool()
        assert torch.allclose(glp[keep], lp[keep], atol=1e-5)
        assert grads.keys() == gg.keys() and len(grads) > 0
        for n, g in grads.items():
            assert float((gg[n] - g).norm()) <= 1e-4 * float(g.norm()) + 1e-7, n
    # the members' adapters differ, so their log-probs do: each row got its own member's delta
    assert not torch.allclose(g_lps[0][:2], g_lps[2][:2], atol=1e-3) or ros[0].prompt_ids.shape != ros[2].prompt_ids.shape


def test_segments_share_a_base_matmul_up_to_the_row_cap():
    """Consecutive segments whose inputs need a gradient alike share one base matmul while
    their rows add up to at most the cap; a segment above it runs alone; no cap: one
    group per gradient kind; the default caps on a CPU only; a cap below 1 is refused."""
    from race.engines.gang.forward import SHARED_ROWS, GangDecoder

    models = _members()[:2]
    xs = [torch.zeros(n, 4, requires_grad=g) for n, g in ((3, False), (4, False), (2, True), (2, False), (9, True),
                                                           (6, False))]
    assert GangDecoder(models, shared_rows=7)._groups(xs) == [[0, 1], [3], [5], [2], [4]]
    assert GangDecoder(models, shared_rows=None)._groups(xs) == [[0, 1, 3, 5], [2, 4]]
    assert GangDecoder(models, shared_rows=1)._groups(xs) == [[0], [1], [3], [5], [2], [4]]
    assert GangDecoder(models).shared_rows == SHARED_ROWS  # these models are on the CPU
    with pytest.raises(ValueError, match="shared_rows=0"):
        GangDecoder(models, shared_rows=0)


def test_reference_segment_runs_the_base_alone(char_tokenizer):
    from race.engines.gang.passes import PassJob, gang_logprobs
    from race.engines.builtin.micro_batch import logprobs
    from race.models import reference_policy

    models = _members()
    ros = _rollouts(models, char_tokenizer)
    got = gang_logprobs(models, [PassJob(None, ros[0], 3, 0.7), PassJob(1, ros[1], 2, 0.7)])
    with reference_policy(models[0]) as base:
        want = logprobs(base, ros[0], 3, 0.7, share=True)
    keep = ros[0].completion_mask.bool()
    assert torch.allclose(got[0][keep], want[keep], atol=1e-5)


def test_gang_pass_executes_the_sum_of_the_members_solo_charges(char_tokenizer):
    """FlopCounterMode over the gang's forward + backward equals the sum over members of
    the ledger's ``update`` charge for its rows alone (``learning_components`` with its
    prompt groups, rank and targets), and each member's solo pass executes its charge."""
    from torch.utils.flop_counter import FlopCounterMode

    models = _members("tiny-m")
    ros = _rollouts(models, char_tokenizer)
    for m in models:
        m.train()
    shape = ModelShape.from_hf_config(models[0].get_base_model().config.to_dict())
    charges = []
    for i, (ro, (r, targets, G, size)) in enumerate(zip(ros, MEMBERS)):
        lora = LoRA(r, tuple(LoraSettings(r=r, target_modules=targets).target_modules))
        B, P, T = ro.completion_ids.shape[0], ro.prompt_len, ro.completion_len
        learn = learning_components(shape, [P + T] * B, [T] * B, lora=lora, conventions="torch",
                                    prompt_groups=prompt_groups(B, G, size))
        charges.append(learn["update/forward"] + learn["update/backward"])
        with FlopCounterMode(display=False) as fc:
            shared_pass(models[i], ro, size)
        solo_no_grad = learning_components(shape, [P + T] * B, [T] * B, lora=lora, conventions="torch",
                                           prompt_groups=prompt_groups(B, G, size))["update/forward"]
        assert fc.get_total_flops() == charges[-1] + solo_no_grad  # its passes: with grad, then log-probs alone
    with FlopCounterMode(display=False) as fc:
        _gang(models, ros)
    fwd = [learning_components(shape, [ro.prompt_len + ro.completion_len] * ro.completion_ids.shape[0],
                               [ro.completion_len] * ro.completion_ids.shape[0],
                               lora=LoRA(r, tuple(LoraSettings(r=r, target_modules=t).target_modules)),
                               conventions="torch",
                               prompt_groups=prompt_groups(ro.completion_ids.shape[0], G, s))["update/forward"]
           for ro, (r, t, G, s) in zip(ros, MEMBERS)]
    assert fc.get_total_flops() == sum(charges) + sum(fwd)


def test_gang_of_one_rollout_is_the_unmerged_solo_rollout(char_tokenizer):
    """One member: the gang decode runs the solo functional decoder's ops on the same rows
    (live LoRA), so the tokens and the decoded counts are the same."""
    from race.engines.gang.sample import SampleJob, gang_sample
    from race.engines.sampling import encode_prompts, sample

    m = _members()[0]
    tok = char_tokenizer
    ids, mask = encode_prompts(tok, PROMPTS[2], "cpu")
    solo = sample(m, ids, mask, group=3, max_new_tokens=9, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                  temperature=0.9, generator=torch.Generator().manual_seed(4), merge_lora=False)
    (gang,) = gang_sample([m], [SampleJob(0, ids, mask, 3, 0.9, torch.Generator().manual_seed(4),
                                          tok.eos_token_id, tok.pad_token_id)], 9)
    assert torch.equal(gang.completion_ids, solo.completion_ids)
    assert torch.equal(gang.decoded, solo.decoded) and torch.equal(gang.completion_mask, solo.completion_mask)
    assert gang.merged  # charged as the solo rollout (which merges at these shapes) would be


@pytest.mark.parametrize("name", ["tiny-xs", "tiny-s"])
def test_gang_greedy_tokens_are_each_members_argmax(name, char_tokenizer):
    """Three members decode greedily in one loop; teacher-forcing each member's tokens
    through its solo forward, every token is the solo argmax, except where the solo's top
    two logits are within 1e-4 (float32 rounding of differently blocked matmuls can order
    them either way). The rollout executes the members' unmerged solo rollouts' FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines.gang.sample import SampleJob, executed_rollout_flops, gang_sample
    from race.engines.sampling import encode_prompts
    from race.engines.kernels import fast_forward

    models = _members(name)
    tok = char_tokenizer
    jobs = []
    for i, (prompts, (_, _, G, _)) in enumerate(zip(PROMPTS, MEMBERS)):
        ids, mask = encode_prompts(tok, prompts, "cpu")
        jobs.append(SampleJob(i, ids, mask, G, 1.0, None, tok.eos_token_id, tok.pad_token_id, greedy=True))
    with FlopCounterMode(display=False) as fc:
        ros = gang_sample(models, jobs, 9)
    shape = ModelShape.from_hf_config(models[0].get_base_model().config.to_dict())
    want = 0
    checked = 0
    for m, ro, (r, targets, _, _) in zip(models, ros, MEMBERS):
        lora = LoRA(r, tuple(LoraSettings(r=r, target_modules=targets).target_modules))
        want += sum(executed_rollout_flops(PolicyCost(shape, lora, "torch"), ro).values())
        ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
        mask = torch.cat([ro.prompt_mask, ro.completion_mask], 1)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        P, T = ro.prompt_len, ro.completion_len
        with torch.no_grad():
            logits = fast_forward.sequence_logits(m, ids, mask, pos, P - 1, T)
        top2 = logits.topk(2, dim=-1).values
        clear = (top2[..., 0] - top2[..., 1] > 1e-4) & ro.completion_mask.bool()
        assert torch.equal(logits.argmax(-1)[clear], ro.completion_ids[clear])
        checked += int(clear.sum())
    assert checked > 0.9 * sum(int(ro.completion_mask.sum()) for ro in ros)
    assert fc.get_total_flops() == want


def _solo_decoded(comp: torch.Tensor, eos: int, max_new: int) -> tuple[torch.Tensor, int]:
    """The solo decode loop's drop rule replayed on a member's tokens (B, T): (decoded per
    row, T its loop ran): rows leave once an eighth of the rows in the batch are done."""
    B = comp.shape[0]
    live = torch.ones(B, dtype=torch.bool)
    done = torch.zeros(B, dtype=torch.bool)
    decoded = torch.zeros(B, dtype=torch.long)
    for t in range(max_new):
        if t < comp.shape[1]:
            done |= comp[:, t] == eos
        n_live, n_done = int(live.sum()), int((live & done).sum())
        if n_done == n_live or t == max_new - 1:
            decoded[live] = t + 1
            return decoded, t + 1
        if n_done * 8 >= n_live:
            decoded[live & done] = t + 1
            live &= ~done
    raise AssertionError("unreachable")


@pytest.mark.parametrize("name,greedy", [("tiny-s", True), ("tiny-xs", False)])
def test_fast_gang_decode_gives_each_member_its_solo_rollout(name, greedy, char_tokenizer):
    """The batched merged decode (``gang.decode``): three members of different prompt widths,
    groups and adapters. Each member's rows follow its solo loop: its ``decoded`` counts
    and length are the solo drop rule's on its tokens; greedy tokens are the solo argmax
    (teacher-forced, top-2 gaps above 1e-4, as above); FlopCounterMode equals
    ``FastRollout.executed`` (merges, padded prompts and slots), and with the rows dropping
    out at different steps the gang executes less than without drops."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines.kernels import fast_forward
    from race.engines.gang.decode import fast_gang_sample
    from race.engines.gang.sample import SampleJob
    from race.engines.sampling import encode_prompts

    models = _members(name)
    tok = char_tokenizer
    jobs = []
    for i, (prompts, (_, _, G, _)) in enumerate(zip(PROMPTS, MEMBERS)):
        ids, mask = encode_prompts(tok, prompts, "cpu")
        jobs.append(SampleJob(i, ids, mask, G, 0.9, torch.Generator().manual_seed(5 + i), tok.eos_token_id,
                              tok.pad_token_id, greedy=greedy))
    with FlopCounterMode(display=False) as fc:
        fr = fast_gang_sample(models, jobs, 40)
    shape = ModelShape.from_hf_config(models[0].get_base_model().config.to_dict())
    loras = [LoRA(r, tuple(LoraSettings(r=r, target_modules=t).target_modules)) for r, t, _, _ in MEMBERS]
    assert fc.get_total_flops() == fr.executed(shape, loras, "torch")
    assert sum(fr.decoded) > 0
    ends = set()
    for m, ro, job in zip(models, fr.rollouts, jobs):
        want, T = _solo_decoded(ro.completion_ids, tok.eos_token_id, 40)
        assert torch.equal(ro.decoded, want) and ro.completion_len == T
        ends |= set(ro.decoded.tolist())
        assert ro.merged  # charged as its solo rollout, which merges at these shapes
        if greedy:
            ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
            mask = torch.cat([ro.prompt_mask, ro.completion_mask], 1)
            pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                logits = fast_forward.sequence_logits(m, ids, mask, pos, ro.prompt_len - 1, ro.completion_len)
            top2 = logits.topk(2, dim=-1).values
            clear = (top2[..., 0] - top2[..., 1] > 1e-4) & ro.completion_mask.bool()
            assert torch.equal(logits.argmax(-1)[clear], ro.completion_ids[clear])
            assert int(clear.sum()) > 0.9 * int(ro.completion_mask.sum())
    if not greedy:  # these sampled rows end at different steps: the drop paths ran
        assert len(ends) > 1  # and physical rows left early: less executed than at full length
        full = _full_length(fr)
        assert fr.executed(shape, loras, "torch") < full.executed(shape, loras, "torch")


def _full_length(fr):
    from dataclasses import replace

    return replace(fr, decoded=[max(fr.decoded)] * len(fr.decoded))


def test_members_share_one_base_in_memory_and_refuse_another():
    from race.engines.gang.forward import share_base

    models = _members()
    share_base(models)
    base = [{n.replace(".base_layer", ""): p for n, p in m.named_parameters() if not p.requires_grad} for m in models]
    assert all(base[i][k] is base[0][k] for i in (1, 2) for k in base[0])
    lora = [{n: p for n, p in m.named_parameters() if p.requires_grad} for m in models]
    assert all(p.data_ptr() != lora[0][n].data_ptr() for n, p in lora[2].items())  # adapters stay their own
    other = _members()[:1]
    with torch.no_grad():
        next(p for p in other[0].parameters() if not p.requires_grad).add_(1.0)
    with pytest.raises(ValueError, match="base weights"):
        share_base([models[0], other[0]])
