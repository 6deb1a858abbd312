"""GRPO's arithmetic: group-relative advantages, per-token log-probs, the clipped loss.

Departures from textbook GRPO are options, named as TRL (1.16) names them:
- ``scale_rewards``: ``"group"`` divides by the group's reward std, ``"batch"`` by the
  std over the whole batch (PPO Lite), ``"none"`` not at all (Dr. GRPO);
- ``loss_type``: ``grpo`` (mean over each sequence's tokens, then over sequences),
  ``bnpo``/``dapo`` (mean over all tokens of the batch), ``dr_grpo`` (sum over tokens
  divided by batch x max_completion_length), ``cispo`` (the clipped, detached ratio
  times the advantage times the log-prob, ratio capped at ``epsilon_high``; token mean
  as ``dapo``), ``sapo`` (a sigmoid gate instead of the clip, temperatures by the sign of
  the advantage; sequence mean as ``grpo``);
- ``epsilon_high`` (DAPO's clip-higher);
- the KL term (``beta > 0``) is the k3 estimator exp(ref - logp) - (ref - logp) - 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from race.engines.kernels import fast_forward


def group_advantages(rewards: torch.Tensor, group: int, *, scale: str | bool = "group",
                     eps: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """A_i = r_i - mean(group), divided by (std + eps) with the std of the group
    (``scale="group"``, or ``True``) or of the whole batch (``"batch"``); ``"none"`` (or
    ``False``) does not divide. Stds are unbiased, as TRL's.

    rewards: (B,) with B = n_prompts * group, rows grouped by prompt.
    Returns (advantages (B,), zero_variance (n_prompts,) bool)."""
    scale = {True: "group", False: "none"}.get(scale, scale) if isinstance(scale, bool) else scale
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards={scale!r}: use group, batch or none")
    r = rewards.view(-1, group)
    mean = r.mean(1, keepdim=True)
    adv = r - mean
    if scale == "group":
        std = r.std(1, keepdim=True, unbiased=True) if group > 1 else torch.zeros_like(mean)
        adv = adv / (std + eps)
    elif scale == "batch":
        std = rewards.std(unbiased=True) if rewards.numel() > 1 else torch.zeros(())
        adv = adv / (std + eps)
    zero_var = (r.max(1).values - r.min(1).values).abs() < 1e-12
    return adv.reshape(-1), zero_var


def completion_logprobs(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                        temperature: float = 1.0, *, fast: bool | None = None,
                        seg: torch.Tensor | None = None) -> torch.Tensor:
    """log p(completion token t | prefix) for every completion position: (B, T).

    One forward over prompt+completion; the head runs only at the T positions that
    predict completion tokens (P-1 .. P+T-2), which is what the ledger charges
    (``train_logits="completion"``). Logits are divided by the sampling temperature, as TRL does.
    ``fast``: run the functional forward (``race.engines.kernels.fast_forward``: the same FLOPs,
    forward and backward, without the HF/PEFT module overhead); default: whenever it
    supports the model (not for a gradient-checkpointing one).

    ``seg`` (B,): the prefix-shared pass (``fast_forward.shared_prompt_logits``, charged
    as ``learning_components(prompt_groups=...)``): ``prompt_ids``/``prompt_mask`` are
    then the S distinct prompts and completion row i continues prompt ``seg[i]``."""
    if seg is not None:
        if not fast_forward.supports(model):
            raise ValueError("the prefix-shared pass needs the functional forward, which does not support this "
                             "model (or it is gradient-checkpointing): pass seg=None")
        logits = fast_forward.shared_prompt_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, seg)
    else:
        P, T = prompt_ids.shape[1], completion_ids.shape[1]
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        mask = torch.cat([prompt_mask, completion_mask], dim=1)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        if fast is None:
            fast = fast_forward.supports(model)
        if fast:
            logits = fast_forward.sequence_logits(model, ids, mask, pos, P - 1, T)
        else:
            keep = torch.arange(P - 1, P + T - 1, device=ids.device)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep,
                           use_cache=False).logits  # (B, T, V)
    logits = logits.float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)


@dataclass
class LossStats:
    loss: float
    clip_frac: float
    kl: float
    ratio_mean: float


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *,
              epsilon: float, epsilon_high: float | None, loss_type: str, max_completion_length: int,
              beta: float = 0.0, ref_logp: torch.Tensor | None = None,
              sapo_temperatures: tuple[float, float] = (1.0, 1.05)) -> tuple[torch.Tensor, LossStats]:
    """Clipped surrogate (+ beta * KL) aggregated per ``loss_type`` (TRL 1.16's formulas).

    logp, old_logp, ref_logp, mask: (B, T); adv: (B,); ``sapo_temperatures``: (for
    advantage > 0, otherwise)."""
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    hi = epsilon_high if epsilon_high is not None else epsilon
    a = adv[:, None]
    if loss_type == "cispo":
        per_tok = -torch.clamp(ratio, max=hi).detach() * a * logp
    elif loss_type == "sapo":
        tau = torch.where(a > 0, torch.full_like(a, sapo_temperatures[0]), torch.full_like(a, sapo_temperatures[1]))
        per_tok = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * a
    else:
        clipped = torch.clamp(ratio, 1 - epsilon, 1 + hi)
        per_tok = -torch.min(ratio * a, clipped * a)
    kl_mean = 0.0
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta != 0 needs reference log-probs")
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        per_tok = per_tok + beta * kl
        kl_mean = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
    if loss_type in ("grpo", "sapo"):
        loss = ((per_tok * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    elif loss_type in ("bnpo", "dapo", "cispo"):
        loss = (per_tok * mask).sum() / mask.sum().clamp(min=1)
    elif loss_type == "dr_grpo":
        loss = (per_tok * mask).sum() / (logp.shape[0] * max_completion_length)
    else:
        raise ValueError(f"loss_type={loss_type!r}: use grpo, bnpo, dapo, dr_grpo, cispo or sapo")
    with torch.no_grad():
        if loss_type == "cispo":  # TRL's cispo_clip_ratio
            is_clipped = (ratio > hi) & (a > 0)
        elif loss_type == "sapo":  # a soft gate: nothing is clipped
            is_clipped = torch.zeros_like(ratio, dtype=torch.bool)
        else:
            is_clipped = ((ratio < 1 - epsilon) & (a < 0)) | ((ratio > 1 + hi) & (a > 0))
        denom = mask.sum().clamp(min=1)
        stats = LossStats(loss=float(loss), clip_frac=float((is_clipped.to(mask.dtype) * mask).sum() / denom),
                          kl=kl_mean, ratio_mean=float((ratio * mask).sum() / denom))
    return loss, stats


def lr_at(step: int, *, base_lr: float, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """Learning rate at 1-based ``step``: linear warmup, then constant / cosine / linear decay
    over ``total_steps`` (the steps the budget buys, known before training)."""
    import math

    if warmup_steps and step <= warmup_steps:
        return base_lr * step / warmup_steps
    if schedule == "constant":
        return base_lr
    span = max(1, total_steps - warmup_steps)
    frac = min(1.0, max(0.0, (step - warmup_steps) / span))
    if schedule == "cosine":
        return base_lr * 0.5 * (1 + math.cos(math.pi * frac))
    if schedule == "linear":
        return base_lr * (1 - frac)
    raise ValueError(f"lr_scheduler_type={schedule!r}: use constant, cosine or linear")
