"""Prefix-shared learning passes: each prompt once for its group (``shared_prompt_work``),
the segments micro-batches make of groups (``prompt_groups``), and the refusals."""

from __future__ import annotations

from fractions import Fraction

import pytest

from race.accounting import (
    AccountingError,
    LoRA,
    ModelShape,
    learning_components,
    prompt_groups,
    sequence_work,
    shared_prompt_work,
)
from race.accounting.terms import attention_pairs

SHAPE = ModelShape(name="t", hidden=64, intermediate=160, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, vocab=97)


def test_written_out_under_full_attention():
    # one prompt of 5 shared by completions of 3 and 4 tokens: 5 + 2 + 3 tokens run;
    # 5x5 prompt square, then 2x(2+5) and 3x(3+5) completion rectangles; head at the
    # prompt's last position and at each run completion token
    w = shared_prompt_work([5], [3, 4], [2], conventions="torch")
    assert (w.tokens, w.pairs, w.logit_positions) == (10, 25 + 14 + 24, 6)


def test_causal_pairs_are_the_unshared_ones_less_the_copies_and_last_tokens():
    P, T, G = 7, 5, 4
    shared = shared_prompt_work([P], [T] * G, [G], conventions="race")
    unshared = sequence_work([P + T] * G, [T] * G, "race")
    copies = (G - 1) * attention_pairs(P, 0, "causal")
    last = G * (P + T)  # the last token's query-key pairs (it attends to all P + T)
    assert shared.pairs == unshared.pairs - copies - last
    assert shared.tokens == unshared.tokens - (G - 1) * P - G
    assert shared.logit_positions == unshared.logit_positions - (G - 1)


def test_half_attention_keeps_fractions_and_all_logits_conventions_count_every_token():
    w = shared_prompt_work([3], [4, 2], [2], conventions="verl")  # half square, logits everywhere
    assert w.pairs == Fraction(9, 2) + (3 * 3 + Fraction(9, 2)) + (1 * 3 + Fraction(1, 2))
    assert w.logit_positions == w.tokens == 3 + 3 + 1


def test_one_token_completions_run_only_the_prompt():
    w = shared_prompt_work([6, 4], [1, 1, 1], [2, 1], conventions="torch")
    assert (w.tokens, w.pairs, w.logit_positions) == (10, 36 + 16, 2)


@pytest.mark.parametrize("n,group,micro,expected", [
    (16, 4, 16, [4, 4, 4, 4]),
    (16, 4, 6, [4, 2, 2, 4, 4]),  # micro-batches 0-5, 6-11, 12-15 cut groups 1 and 2
    (16, 8, 3, [3, 3, 2, 1, 3, 3, 1]),
    (8, 4, 100, [4, 4]),
])
def test_prompt_groups_follow_the_micro_batches(n, group, micro, expected):
    assert prompt_groups(n, group, micro) == expected
    assert sum(expected) == n


def test_learning_components_share_every_pass_and_cost_less():
    n, P, T, G = 8, 6, 9, 4
    kw = dict(lora=LoRA(8), num_iterations=2, beta=0.04, conventions="torch")
    plain = learning_components(SHAPE, [P + T] * n, [T] * n, **kw)
    shared = learning_components(SHAPE, [P + T] * n, [T] * n, prompt_groups=[G, G], **kw)
    assert plain.keys() == shared.keys() == {"old_logprobs/forward", "reference/forward", "update/forward",
                                             "update/backward"}
    assert all(0 < shared[k] < plain[k] for k in plain)
    # the same formulas over the shared work: a pass is its Work, whatever made it
    from race.accounting import backward_components, forward_components

    work = shared_prompt_work([P, P], [T] * n, [G, G], conventions="torch")
    assert shared["update/forward"] == 2 * sum(forward_components(SHAPE, work, lora=LoRA(8),
                                                                  conventions="torch").values())
    assert shared["update/backward"] == 2 * sum(backward_components(SHAPE, work, lora=LoRA(8),
                                                                    conventions="torch").values())


@pytest.mark.parametrize("call,match", [
    (lambda: shared_prompt_work([5, 5], [3, 3, 3], [2], conventions="torch"), "one per prompt"),
    (lambda: shared_prompt_work([5], [3, 3, 3], [2], conventions="torch"), "sum to 2 completions"),
    (lambda: learning_components(SHAPE, [9, 10], [4, 4], prompt_groups=[2]), "prompt lengths \\[5, 6\\]"),
    (lambda: learning_components(SHAPE, [9, 9], [4, 4], prompt_groups=[1]), "summing to 2"),
    (lambda: learning_components(SHAPE, [9, 9], [4, 4], prompt_groups=[2], train_logits="all"), "completion"),
    (lambda: learning_components(SHAPE, [9, 9], [4, 4], prompt_groups=[2], recompute=True), "no recompute"),
    (lambda: prompt_groups(8, 0, 4), "group=0"),
])
def test_bad_shared_passes_are_refused(call, match):
    with pytest.raises(AccountingError, match=match):
        call()
