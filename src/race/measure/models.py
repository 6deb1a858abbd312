"""Random or shape-only HF Qwen2 models of a ``ModelShape``, for measuring.

On the meta device a model has shapes and no storage, so a real-width layer of any Qwen2.5
preset (1.9 GB in fp32 for 72B) costs no memory, and ``FlopCounterMode`` counts it all the
same: every formula reads shapes only.
"""

from __future__ import annotations

from typing import Any

import torch

from race.accounting import ModelShape


def qwen2_config(shape: ModelShape, *, num_layers: int | None = None, attn_implementation: str = "eager",
                 **overrides: Any) -> Any:
    """A ``transformers.Qwen2Config`` with ``shape``'s architecture (optionally another
    depth). Qwen2 has q/k/v biases and no o_proj/MLP biases; shapes that differ are refused."""
    from transformers import Qwen2Config

    if not shape.is_lm:
        raise ValueError(f"{shape.name} has a scoring head; build it with a sequence-classification config")
    if not shape.qkv_bias or shape.o_bias or shape.mlp_bias:
        raise ValueError(f"{shape.name}: Qwen2 has q/k/v biases only (qkv_bias={shape.qkv_bias}, "
                         f"o_bias={shape.o_bias}, mlp_bias={shape.mlp_bias})")
    kw: dict[str, Any] = dict(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=num_layers or shape.num_layers, num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads, head_dim=shape.head_dim, tie_word_embeddings=shape.tie_embeddings,
        use_sliding_window=False,
    )
    kw.update(overrides)
    cfg = Qwen2Config(**kw)
    cfg._attn_implementation = attn_implementation
    return cfg


def build_model(shape: ModelShape, *, num_layers: int | None = None, device: str | torch.device = "meta",
                attn_implementation: str = "eager", seed: int | None = 0, dtype: torch.dtype = torch.float32,
                **overrides: Any) -> Any:
    """A ``Qwen2ForCausalLM`` of ``shape`` with random weights (``device="cpu"``) or none
    (``device="meta"``, the default). ``seed`` fixes the random weights."""
    from transformers import Qwen2ForCausalLM

    cfg = qwen2_config(shape, num_layers=num_layers, attn_implementation=attn_implementation, **overrides)
    if seed is not None and torch.device(device).type != "meta":
        torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype)


__all__ = ["qwen2_config", "build_model"]
