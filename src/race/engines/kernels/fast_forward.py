"""The log-prob passes (old-policy, reference, update) without the HF/PEFT module stack.

``sequence_logits`` runs one forward over whole left-padded sequences with the functional
decoder's weights (``race.engines.kernels.fast_decode``: live references to the model's
parameters, so gradients reach the LoRA matrices, or every weight in full fine-tuning)
and returns the logits at the positions asked for. It is HF's eager forward op for op in
FLOP terms, forward and backward:

- every projection is ``W x (+ b)``, and ``+ s B(A dropout(x))`` where an adapter is live
  (PEFT's order; dropout only in training mode); LoRA-free q/k/v and gate/up run as one
  matmul each over concatenated weights (the same FLOPs, forward and backward);
- attention is explicit ``q @ k^T`` and ``p @ v`` over the full square with a causal +
  padding bias (what the ``torch`` conventions count, and what HF's eager attention runs);
- the head runs only at the kept positions.

``shared_prompt_logits`` is the prefix-shared variant the built-in engine runs: each
prompt once for the completions sharing it (a GRPO group), then the completions over
that prompt's keys and values (``race.accounting.shared_prompt_work`` counts it). The G
copies of a prompt in the unshared pass compute identical hidden states, so the logits
are the same up to float rounding, and so are the gradients (autograd sums the G
completions' gradients into the one prompt pass, as the unshared pass sums its G copies).

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
    from race.engines.kernels.fast_decode import FastDecoder

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
    from race.engines.kernels.fast_decode import FastDecoder

    dec = FastDecoder(model)
    n = ids.shape[1]
    dt = dec.embed.dtype
    dec.rope_tables(int(pos.max()) + 1, ids.device, dt)
    bias = padding_bias(torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()[None] & mask.bool()[:, None, :],
                         dt)
    x = dec.run(ids, pos, bias[:, None], lambda li, k, v: (k.transpose(1, 2), v.transpose(1, 2)))
    x = dec.rms_norm(x[:, first:first + count], dec.norm_w)
    return F.linear(x, dec.lm_head)


def padding_bias(allowed: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """0 where a query may attend a key, the dtype's minimum elsewhere (finite: a query
    with no allowed key gets a uniform, finite softmax, as in HF's masks)."""
    return torch.zeros(allowed.shape, dtype=dt, device=allowed.device).masked_fill(~allowed, torch.finfo(dt).min)


def shared_prompt_logits(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                         seg: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) predicting completion tokens 1..T, each prompt run once.

    ``prompt_ids``/``prompt_mask`` (S, P): S distinct left-padded prompts;
    ``completion_ids``/``completion_mask`` (B, T); ``seg`` (B,): the prompt row of each
    completion. Positions and masks are those of the unshared pass over
    ``cat(prompt, completion)``: prompt padding is never attended, completion padding
    (after EOS) is masked as a key. The last completion token predicts nothing and is not
    run; row i's first logits are its prompt's last-position logits."""
    from race.engines.kernels.fast_decode import FastDecoder

    dec = FastDecoder(model)
    P = prompt_ids.shape[1]
    B, T = completion_ids.shape
    dt, dev = dec.embed.dtype, prompt_ids.device
    p_pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    n_real = prompt_mask.long().sum(-1)[seg]  # (B,)
    c_ids, c_mask = completion_ids[:, :T - 1], completion_mask[:, :T - 1]
    c_pos = (n_real[:, None] + c_mask.long().cumsum(-1) - 1).clamp(min=0)
    dec.rope_tables(max(int(p_pos.max()), int(c_pos.max()) if T > 1 else 0) + 1, dev, dt)
    causal_p = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
    p_bias = padding_bias(causal_p[None] & prompt_mask.bool()[:, None, :], dt)
    cache: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep(li: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kv = (k.transpose(1, 2), v.transpose(1, 2))
        cache.append(kv)
        return kv

    x_p = dec.run(prompt_ids, p_pos, p_bias[:, None], keep)
    first = F.linear(dec.rms_norm(x_p[:, -1], dec.norm_w), dec.lm_head)[seg][:, None]  # (B, 1, V)
    if T == 1:
        return first
    n = T - 1
    allowed = torch.cat([prompt_mask.bool()[seg][:, None, :].expand(B, n, P),
                         torch.ones(n, n, dtype=torch.bool, device=dev).tril()[None] & c_mask.bool()[:, None, :]],
                        dim=2)
    c_bias = padding_bias(allowed, dt)

    def attend(li: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kp, vp = cache[li]
        return torch.cat([kp[seg], k.transpose(1, 2)], dim=2), torch.cat([vp[seg], v.transpose(1, 2)], dim=2)

    x_c = dec.run(c_ids, c_pos, c_bias[:, None], attend)
    rest = F.linear(dec.rms_norm(x_c, dec.norm_w), dec.lm_head)  # (B, T-1, V)
    return torch.cat([first, rest], dim=1)
