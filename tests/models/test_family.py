"""The tiny family: sizes span >= 30x, variety (GQA, tied/untied), exact param counts."""

from __future__ import annotations

import pytest

from race.models.family import (
    TINY_FAMILY,
    build_tiny_model,
    family_table,
    lm_head_params,
    non_embedding_params,
    tiny_config,
    tiny_shape,
)


def test_family_spans_30x_and_smallest_is_about_100k():
    counts = {n: tiny_shape(n).non_embedding_params() for n in TINY_FAMILY}
    assert len(counts) >= 4
    assert max(counts.values()) / min(counts.values()) >= 30
    assert 50_000 <= min(counts.values()) <= 200_000
    assert list(counts.values()) == sorted(counts.values()), "family must be listed smallest first"


def test_family_has_gqa_and_both_embedding_styles():
    rows = family_table()
    assert any(r["kv_heads"] < r["heads"] for r in rows)
    assert {r["tied"] for r in rows} == {True, False}


@pytest.mark.parametrize("name", list(TINY_FAMILY))
def test_non_embedding_params_match_config_arithmetic(name):
    model = build_tiny_model(name)
    h, v = model.config.hidden_size, model.config.vocab_size
    total = sum(p.numel() for p in model.parameters())
    tied = model.config.tie_word_embeddings
    # the one parameter formula (race.accounting's ModelShape) counts the real tensors
    assert non_embedding_params(model) == tiny_shape(name).non_embedding_params()
    assert total == tiny_shape(name).num_params()
    assert non_embedding_params(model) == total - v * h * (1 if tied else 2)
    assert lm_head_params(model) == v * h
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    # Qwen2 layout: q/k/v carry a bias, o does not
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.k_proj.bias is not None and attn.v_proj.bias is not None
    assert attn.o_proj.bias is None


def test_build_is_deterministic_and_does_not_touch_global_rng():
    import torch

    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_model("tiny-xs", seed=7)
    assert torch.equal(torch.rand(1), expected_next)
    b = build_tiny_model("tiny-xs", seed=7)
    c = build_tiny_model("tiny-xs", seed=8)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)


def test_unknown_size_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown tiny model 'tiny-xxl'"):
        tiny_config("tiny-xxl")


def test_count_params_counts_each_tensor_once():
    import torch

    from race.models.family import build_tiny_model, count_params, lm_head_params, non_embedding_params

    w, b = torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5))
    assert count_params([w, b, w]) == 17 and count_params([]) == 0  # a tied weight met twice counts once
    model = build_tiny_model("tiny-xs", seed=0)
    total = count_params(model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert total == non_embedding_params(model) + emb + (0 if tied else lm_head_params(model))
