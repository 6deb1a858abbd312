"""The log-prob passes (old-policy, reference, update) without the HF/PEFT module stack.

``sequence_logits`` runs one forward over whole left-padded sequences with the functional
decoder's weights (``race.engines.fast_decode``: live references to the model's
parameters, so gradients reach the LoRA matrices, or every weight in full fine-tuning)
and returns the logits at the positions asked for. It is HF's eager forward op for op in
FLOP terms, forward and backward:

- every projection is ``W x (+ b)``, and ``+ s B(A dropout(x))`` where an adapter is live
  (PEFT's order; dropout only in training mode); LoRA-free q/k/v and gate/up run as one
  matmul each over concatenated weights (the same FLOPs, forward and backward);
- attention is explicit ``q @ k^T`` and ``p @ v`` over the full square with a causal +
  padding bias (what the ``torch`` conventions count, and what HF's eager attention runs);
- the head runs only at the kept positions.

It is used by :func:`race.engines.grpo_math.completion_logprobs` when the model is
supported and not gradient-checkpointing (checkpointing lives in the HF modules: such a
model keeps the HF forward, and the recompute the ledger charges for it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def supports(model: Any) -> bool:
    """A Qwen2/Llama-style model the functional forward reproduces: no gradient
    checkpointing, no attention dropout."""
    from race.engines.fast_decode import FastDecoder

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return (FastDecoder.supports(model) and not _checkpointing(base)
            and not float(getattr(base.config, "attention_dropout", 0.0) or 0.0))


def _checkpointing(base: Any) -> bool:
    flag = getattr(type(base), "is_activation_checkpointing", None)  # transformers >= 5.2x
    if flag is not None:
        return bool(base.is_activation_checkpointing)
    return bool(getattr(base, "is_gradient_checkpointing", False))


def sequence_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                    first: int, count: int) -> torch.Tensor:
    """Logits (B, count, V) at positions ``first .. first + count - 1`` of ``ids`` (B, n)
    with attention ``mask`` (B, n) and position ids ``pos`` (B, n)."""
    from race.engines.fast_decode import FastDecoder

    dec = FastDecoder(model)
    n = ids.shape[1]
    dt = dec.embed.dtype
    dec._tables(int(pos.max()) + 1, ids.device, dt)
    allowed = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()[None] & mask.bool()[:, None, :]
    bias = torch.zeros(allowed.shape, dtype=dt, device=ids.device).masked_fill(~allowed, torch.finfo(dt).min)
    x = dec.run(ids, pos, bias[:, None], lambda li, k, v: (k.transpose(1, 2), v.transpose(1, 2)))
    x = dec._rms(x[:, first:first + count], dec.norm_w)
    return F.linear(x, dec.lm_head)
