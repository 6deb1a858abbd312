"""The tiny Qwen2-architecture family that RACE builds and warm-starts itself.

Four sizes spanning 34x in non-embedding parameters (93k to 3.15M), all using the
character tokenizer (``vocab_size`` = :data:`race.models.tokenizer.VOCAB_SIZE`). Shapes
were chosen so that the ONE warm-start recipe (AdamW at lr 3e-3, fixed steps) ranks them
by size: no model has fewer than four layers (a 2-layer 0.1M model learned the
multi-step arithmetic task at about half the per-step rate of a 4-layer one of the same
size), and the largest grows in depth rather than width (a 4-layer, 256-wide 3M model
trained worse than the 0.85M one at lr 3e-3; the 8-layer, 192-wide one trains best). They are real
``transformers.Qwen2ForCausalLM`` models (RMSNorm, RoPE, SwiGLU MLP, q/k/v bias, no o
bias), so every code path that handles Qwen2.5 handles them, only smaller. Deliberate
variety for the accounting tests:

- grouped-query attention (``num_key_value_heads < num_attention_heads``) in
  ``tiny-xs``, ``tiny-s`` and ``tiny-l``; plain multi-head attention in ``tiny-m``;
- tied input/output embeddings in ``tiny-xs`` and ``tiny-s``; untied (a separate
  ``lm_head``) in ``tiny-m`` and ``tiny-l``.

"Non-embedding parameters" follows Kaplan et al.: everything except the token embedding
matrix and the output projection (``lm_head``), whether tied or not. The family's
parameter counts are in the table of :func:`family_table`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from race.accounting import ModelShape
from race.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

#: Maximum sequence length (prompt + completion) of the tiny models.
TINY_MAX_POSITIONS = 512

#: Config kwargs per size (fed to ``transformers.Qwen2Config``). Shared settings are in
#: :data:`_COMMON`. Non-embedding parameters are in the comments (see :func:`family_table`).
TINY_FAMILY: dict[str, dict[str, Any]] = {
    # 92,976 non-embedding; GQA 4q/2kv, head_dim 12, tied embeddings
    "tiny-xs": dict(hidden_size=48, intermediate_size=112, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    # 293,200; GQA 4q/2kv, head_dim 20, tied embeddings
    "tiny-s": dict(hidden_size=80, intermediate_size=224, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    # 854,656; multi-head 4q/4kv, head_dim 32, untied lm_head
    "tiny-m": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    # 3,151,552; eight layers, GQA 6q/2kv, head_dim 32, untied lm_head
    "tiny-l": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=8,
                   num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False),
}

_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB_SIZE,
    max_position_embeddings=TINY_MAX_POSITIONS,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    initializer_range=0.02,
    attention_dropout=0.0,
    use_sliding_window=False,
    pad_token_id=PAD_ID,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    use_cache=True,
)


def _check_name(name: str) -> None:
    if name not in TINY_FAMILY:
        raise KeyError(f"unknown tiny model {name!r}; the family is {sorted(TINY_FAMILY)}")


def is_tiny_name(name: str) -> bool:
    """True when ``name`` is a member of the tiny family (e.g. ``"tiny-s"``)."""
    return name in TINY_FAMILY


def tiny_config_kwargs(name: str) -> dict[str, Any]:
    """The full ``Qwen2Config`` kwargs for a size (family entry + shared settings)."""
    _check_name(name)
    kw = dict(_COMMON)
    kw.update(TINY_FAMILY[name])
    return kw


def tiny_config(name: str) -> Any:
    """A ``transformers.Qwen2Config`` for the named size."""
    from transformers import Qwen2Config

    return Qwen2Config(**tiny_config_kwargs(name))


def build_tiny_model(name: str, *, seed: int = 0, attn_implementation: str = "eager") -> Any:
    """A freshly initialised ``Qwen2ForCausalLM`` of the named size (fp32, CPU).

    Initialisation is deterministic under ``seed`` (the global torch RNG is seeded, then
    restored, so callers' random streams are not disturbed).
    """
    import torch
    from transformers import Qwen2ForCausalLM

    cfg = tiny_config(name)
    cfg._attn_implementation = attn_implementation
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    finally:
        torch.random.set_rng_state(state)
    return model.float().eval()


def _embedding_param_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    for mod in (model.get_input_embeddings(), model.get_output_embeddings()):
        if mod is not None:
            ids.update(id(p) for p in mod.parameters())
    return ids


def count_params(params: Iterable[Any]) -> int:
    """Numbers held by ``params`` (tensors): the sum of their ``numel()``, a tensor met twice
    (a tied weight) counted once. Every parameter count of a module is this sum over some of
    its ``parameters()``."""
    seen: set[int] = set()
    total = 0
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def non_embedding_params(model: Any) -> int:
    """Parameters other than the token embedding and the output projection (lm_head).

    Works for any HF causal LM (tied or untied; with or without a PEFT wrapper, in which
    case LoRA adapter weights are included since they sit inside the transformer blocks).
    """
    skip = _embedding_param_ids(model)
    return count_params(p for p in model.parameters() if id(p) not in skip)


def lm_head_params(model: Any) -> int:
    """Weights of the output projection (counted even when tied to the embedding, since
    its matmul executes at every position where logits are computed)."""
    head = model.get_output_embeddings()
    return 0 if head is None else count_params(head.parameters())


def tiny_shape(name: str) -> ModelShape:
    """``ModelShape`` of tiny-family size ``name`` from its config alone (no torch); its
    parameter counts are the accounting's (``ModelShape.non_embedding_params`` ...), the
    one formula for every model."""
    return ModelShape.from_hf_config(dict(tiny_config_kwargs(name), model_type="qwen2"), name=name)


def family_table() -> list[dict[str, Any]]:
    """One row per size: architecture values and non-embedding parameters."""
    rows = []
    for name in TINY_FAMILY:
        kw = tiny_config_kwargs(name)
        rows.append(dict(
            name=name, layers=kw["num_hidden_layers"], hidden=kw["hidden_size"],
            heads=kw["num_attention_heads"], kv_heads=kw["num_key_value_heads"],
            intermediate=kw["intermediate_size"], vocab=kw["vocab_size"],
            tied=kw["tie_word_embeddings"], non_embedding_params=tiny_shape(name).non_embedding_params(),
        ))
    return rows
