"""Character tokenizer: round trip, left padding, vocab size == model vocab size."""

from __future__ import annotations

import pytest

from race.models.tokenizer import EOS_ID, PAD_ID, UNK_ID, VOCAB_SIZE, build_char_tokenizer, check_vocab_fits


@pytest.mark.parametrize("text", ["Q:23+5-7\nA:", "23+5=28;28-7=21;#21.", " spaces  and\nnewlines ", "*=:#QA"])
def test_round_trip_one_token_per_char(char_tokenizer, text):
    ids = char_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert char_tokenizer.decode(ids) == text
    assert UNK_ID not in ids


def test_vocab_equals_every_tiny_model_vocab(char_tokenizer):
    from race.models.family import TINY_FAMILY, tiny_config

    assert len(char_tokenizer) == VOCAB_SIZE == 100
    for name in TINY_FAMILY:
        assert tiny_config(name).vocab_size == len(char_tokenizer)
    # every id decodes to something non-empty (no silently dropped ids)
    for i in range(VOCAB_SIZE):
        assert char_tokenizer.convert_ids_to_tokens(i) is not None


def test_special_tokens_and_left_padding(char_tokenizer):
    tok = char_tokenizer
    assert (tok.pad_token_id, tok.eos_token_id) == (PAD_ID, EOS_ID)
    assert tok.padding_side == "left"
    enc = tok(["Q:1+2\nA:", "Q:10+20-3\nA:"], padding=True, add_special_tokens=False)
    short, long_ = enc["input_ids"]
    assert len(short) == len(long_)
    assert short[:4] == [PAD_ID] * 4 and enc["attention_mask"][0][:4] == [0] * 4
    assert tok.decode(short, skip_special_tokens=True) == "Q:1+2\nA:"
    assert tok.decode([*tok("7.")["input_ids"], EOS_ID], skip_special_tokens=True) == "7."


def test_unknown_characters_map_to_unk(char_tokenizer):
    ids = char_tokenizer("é€", add_special_tokens=False)["input_ids"]
    assert ids == [UNK_ID, UNK_ID]


def test_bos_option():
    tok = build_char_tokenizer(add_bos=True)
    ids = tok("1+1")["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 4


def test_save_and_reload(tmp_path, char_tokenizer):
    from transformers import AutoTokenizer

    char_tokenizer.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = "Q:49-0+3\nA:49-0=49;49+3=52;#52."
    assert tok(text)["input_ids"] == char_tokenizer(text)["input_ids"]
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.padding_side == "left" and len(tok) == VOCAB_SIZE


def test_check_vocab_fits(char_tokenizer):
    check_vocab_fits(char_tokenizer, VOCAB_SIZE)
    check_vocab_fits(char_tokenizer, VOCAB_SIZE + 28)  # padded embeddings are fine
    with pytest.raises(ValueError, match=r"tokenizer vocabulary \(100 tokens\) exceeds the model vocabulary \(64"):
        check_vocab_fits(char_tokenizer, 64)
