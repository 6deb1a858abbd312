"""Character-level tokenizer for the tiny model family.

One token per character over a fixed alphabet (printable ASCII plus newline), wrapped in
``transformers.PreTrainedTokenizerFast`` so that engines, TRL and ``save_pretrained`` treat
it like any Hugging Face tokenizer.

Why these choices:

- A ``tokenizers`` WordLevel model with a ``Split`` pre-tokenizer on the empty regex turns
  every character into its own word, and ``decoders.Fuse()`` joins them back without
  spaces, so ``decode(encode(s)) == s`` for any string over the alphabet.
- The vocabulary is fixed and small (:data:`VOCAB_SIZE` = 100), and the tiny models use
  exactly that vocabulary size: a tokenizer id the model cannot produce or a model id the
  tokenizer cannot decode would be silently dropped by ``decode``.
- Padding is on the LEFT, so batched generation appends new tokens right after each
  prompt's last real token.
- Characters outside the alphabet map to ``<unk>`` rather than raising, so hostile or
  foreign text never crashes the pipeline.
"""

from __future__ import annotations

from typing import Any

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)

#: Every character the tokenizer knows: newline and printable ASCII (space .. tilde).
#: This covers the arithmetic task (digits, ``+ - * = ; . : #``, ``Q``, ``A``), plain
#: English prompts for judges, and leaves no gaps in the id space.
ALPHABET: tuple[str, ...] = ("\n",) + tuple(chr(c) for c in range(32, 127))

#: Tokenizer vocabulary size == ``vocab_size`` of every tiny model.
VOCAB_SIZE: int = len(SPECIAL_TOKENS) + len(ALPHABET)

PAD_ID, EOS_ID, BOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))


def char_vocab() -> dict[str, int]:
    """Token -> id: the special tokens first (ids 0..3), then :data:`ALPHABET` in order."""
    tokens = list(SPECIAL_TOKENS) + list(ALPHABET)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):  # pragma: no cover - guards edits to ALPHABET
        raise AssertionError("duplicate token in the character alphabet")
    return vocab


def build_char_tokenizer(*, add_bos: bool = False, model_max_length: int = 512) -> Any:
    """Build the character-level ``PreTrainedTokenizerFast``.

    Args:
        add_bos: prepend ``<bos>`` to every encoded sequence (off by default: the tiny
            models are trained without it, and a BOS changes every sequence length).
        model_max_length: recorded on the tokenizer (the tiny models support 512
            positions); longer inputs are not truncated unless the caller asks.

    Returns a tokenizer with ``padding_side="left"``, pad/eos/bos/unk set, and
    ``len(tokenizer) == VOCAB_SIZE``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(""), behavior="isolated")
    core.decoder = decoders.Fuse()
    if add_bos:
        core.post_processor = processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
            special_tokens=[(BOS_TOKEN, BOS_ID)],
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        truncation_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    if len(tok) != VOCAB_SIZE:  # pragma: no cover - would mean transformers added tokens
        raise AssertionError(f"char tokenizer has {len(tok)} tokens, expected {VOCAB_SIZE}")
    return tok


def tokenizer_vocab_size(tokenizer: Any) -> int:
    """Number of distinct ids a tokenizer can emit (base vocabulary plus added tokens)."""
    return len(tokenizer)


def check_vocab_fits(tokenizer: Any, model_vocab_size: int, *, where: str = "") -> None:
    """Refuse a tokenizer that can produce ids the model has no embedding for.

    A tokenizer SMALLER than the model is allowed (Qwen2.5 pads its embedding matrix past
    the tokenizer), a larger one would index out of range at the first unusual token.
    """
    n_tok = tokenizer_vocab_size(tokenizer)
    if n_tok > model_vocab_size:
        at = f" ({where})" if where else ""
        raise ValueError(
            f"tokenizer vocabulary ({n_tok} tokens) exceeds the model vocabulary "
            f"({model_vocab_size} embeddings){at}: use the tokenizer saved with this model, "
            "or resize the model's embeddings before loading"
        )
