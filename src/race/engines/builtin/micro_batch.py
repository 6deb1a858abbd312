"""The built-in engine's learning passes in micro-batches, and gradient checkpointing.

Micro-batches have TRL's meaning: one generation of ``prompts_per_step x num_generations``
sequences; the old-policy and reference log-prob passes and the update run over
``per_device_train_batch_size`` sequences at a time (the step's kept rows, in order), the
update's gradients accumulate over ``gradient_accumulation_steps`` micro-batches, then one
clip and one optimizer step (:func:`optimizer_steps`). With TRL's default
``steps_per_generation = gradient_accumulation_steps`` the generation is one optimizer step
per iteration; with ``steps_per_generation = k x gradient_accumulation_steps`` it is k
optimizer steps per iteration, each over the next ``gradient_accumulation_steps``
micro-batches (fewer when zero-variance groups were dropped). The micro-batches are the
same either way, so the passes and their FLOPs are too.

The micro-batches keep the batch's padded widths (prompt and completion columns), so the
passes execute exactly the FLOPs of the one-batch step: the ledger is the same, only fewer
sequences are in memory at once. Each micro-batch's loss is weighted so that the
accumulated gradient equals the one-batch gradient of the optimizer step's rows for every
``loss_type`` (``race.engines.grpo_math.grpo_loss``):

- ``grpo``/``sapo`` (mean over sequences of per-sequence token means) and ``dr_grpo``
  (token sum over ``sequences x max_completion_length``): the micro-batch's share of the
  sequences, ``n_micro / n``;
- ``dapo``/``bnpo``/``cispo`` (token sum over the batch's tokens): the micro-batch's share
  of the completion tokens, ``max(1, tokens_micro) / max(1, tokens)`` (the whole batch's
  token count normalises every micro-batch, as TRL's ``dapo`` does with
  ``num_items_in_batch``; TRL's ``bnpo`` normalises per micro-batch instead, so under
  micro-batching RACE's ``bnpo`` is its ``dapo``). With several optimizer steps per
  generation ``n`` and ``tokens`` are the optimizer step's own (TRL divides the generation
  batch's token count by ``steps_per_generation / gradient_accumulation_steps``: the same
  on average, not step by step).

With LoRA dropout > 0 the dropout masks are drawn per micro-batch, so micro-batched and
one-batch updates agree only in distribution; at ``lora_dropout: 0`` they agree to float
rounding.

Gradient checkpointing (``gradient_checkpointing: true``) checkpoints every decoder layer
with torch's non-reentrant checkpoint (``use_reentrant: False``) and makes the embedding
output require grad, as transformers and TRL do; in the update's backward each layer's
forward runs again (torch's early stop skips its last matmul). The ledger records that as
``recompute/forward`` (hardware FLOPs, never charged to the budget), and the update's
backward then includes layer 0's q/k/v input gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from race.engines.common import DivergedError
from race.engines.grpo_math import LossStats, completion_logprobs
from race.engines.sampling import Rollout

#: Loss types normalised by the batch's completion tokens (the others by its sequences).
TOKEN_NORMALISED = ("dapo", "bnpo", "cispo")


def micro_slices(n: int, size: int) -> list[slice]:
    """Consecutive row slices of at most ``size`` rows covering ``n`` rows."""
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def optimizer_steps(n: int, size: int, accumulation: int) -> list[list[slice]]:
    """The micro-batch slices of ``n`` rows (:func:`micro_slices`), ``accumulation`` of them
    per optimizer step, in order: one list per optimizer step."""
    if accumulation < 1:
        raise ValueError(f"gradient_accumulation_steps must be >= 1, got {accumulation}")
    sl = micro_slices(n, size)
    return [sl[i:i + accumulation] for i in range(0, len(sl), accumulation)]


def rows(ro: Rollout, sl: slice) -> Rollout:
    """Rows ``sl`` of a rollout, padded widths kept (what the ledger charged)."""
    n = len(range(*sl.indices(ro.prompt_ids.shape[0])))
    return Rollout(prompt_ids=ro.prompt_ids[sl], prompt_mask=ro.prompt_mask[sl], completion_ids=ro.completion_ids[sl],
                   completion_mask=ro.completion_mask[sl], truncated=ro.truncated[sl],
                   n_prompts=max(1, n // ro.group), group=ro.group)


def shared_inputs(r: Rollout, first_row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(distinct prompt ids, their masks, each row's prompt index) of micro-batch ``r``,
    whose first row is row ``first_row`` of a batch in whole groups of ``r.group``."""
    n = r.prompt_ids.shape[0]
    gid = (torch.arange(first_row, first_row + n) // r.group).to(r.prompt_ids.device)
    seg = gid - gid[0]
    firsts = torch.ones(n, dtype=torch.bool, device=gid.device)
    firsts[1:] = gid[1:] != gid[:-1]
    pids, pmask = r.prompt_ids[firsts], r.prompt_mask[firsts]
    if not (torch.equal(pids[seg], r.prompt_ids) and torch.equal(pmask[seg], r.prompt_mask)):
        raise ValueError(f"rows of one group (group size {r.group}) have different prompts: the prefix-shared pass "
                         "needs each group's rows consecutive")
    return pids, pmask, seg


def _logprobs_of(model: Any, r: Rollout, temperature: float, share: bool, first_row: int) -> torch.Tensor:
    if not share:
        return completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                   temperature)
    pids, pmask, seg = shared_inputs(r, first_row)
    return completion_logprobs(model, pids, pmask, r.completion_ids, r.completion_mask, temperature, seg=seg)


def logprobs(model: Any, ro: Rollout, size: int, temperature: float, *, share: bool = False) -> torch.Tensor:
    """Completion log-probs (B, T) computed ``size`` rows at a time; ``share``: each
    group's prompt once per micro-batch (``race.accounting.prompt_groups``)."""
    parts = []
    for sl in micro_slices(ro.prompt_ids.shape[0], size):
        parts.append(_logprobs_of(model, rows(ro, sl), temperature, share, sl.start))
    return torch.cat(parts, dim=0)


def loss_weight(loss_type: str, mask: torch.Tensor, sl: slice, within: slice = slice(None)) -> float:
    """Weight of micro-batch ``sl``'s loss so that the weighted sum equals the one-batch
    loss of rows ``within`` (the optimizer step's; default all: module docstring).
    ``mask``: the whole batch's (B, T) loss mask."""
    if loss_type in TOKEN_NORMALISED:
        return float(mask[sl].sum().clamp(min=1)) / float(mask[within].sum().clamp(min=1))
    return mask[sl].shape[0] / mask[within].shape[0]


def span(slices: list[slice]) -> slice:
    """The rows consecutive micro-batch ``slices`` cover together."""
    return slice(slices[0].start, slices[-1].stop)


@dataclass
class Accumulator:
    loss: float = 0.0
    clip: float = 0.0
    kl: float = 0.0
    ratio: float = 0.0
    tokens: float = 0.0

    def add(self, st: LossStats, w: float, tokens: float) -> None:
        self.loss += w * st.loss  # the weighted losses add up to the one-batch loss
        self.clip += st.clip_frac * tokens  # token means, weighted by the micro-batch's tokens
        self.kl += st.kl * tokens
        self.ratio += st.ratio_mean * tokens
        self.tokens += tokens

    def stats(self) -> LossStats:
        t = self.tokens or 1.0
        return LossStats(loss=self.loss, clip_frac=self.clip / t, kl=self.kl / t, ratio_mean=self.ratio / t)


def accumulate_gradients(model: Any, ro: Rollout, adv: torch.Tensor, mask: torch.Tensor, old: torch.Tensor | None,
                         ref: torch.Tensor | None, *, size: int, temperature: float, loss_fn: Callable[..., Any],
                         loss_kwargs: dict[str, Any], step: int, share: bool = False,
                         slices: list[slice] | None = None) -> LossStats:
    """Backward of one optimizer step's loss over micro-batches of ``size`` rows (gradients
    add up in ``.grad``; the caller zeroes them before and steps the optimizer after):
    ``slices``, consecutive micro-batches of :func:`optimizer_steps` (default: every
    micro-batch of the batch). Returns their rows' loss statistics; ``DivergedError`` on a
    non-finite loss. ``share``: the prefix-shared forward (``race.accounting.prompt_groups``)."""
    acc = Accumulator()
    loss_type = loss_kwargs["loss_type"]
    slices = micro_slices(ro.prompt_ids.shape[0], size) if slices is None else slices
    within = span(slices)
    st = None
    for sl in slices:
        logp = _logprobs_of(model, rows(ro, sl), temperature, share, sl.start)
        loss, st = loss_fn(logp, old[sl] if old is not None else logp.detach(), adv[sl], mask[sl],
                           ref_logp=ref[sl] if ref is not None else None, **loss_kwargs)
        if not torch.isfinite(loss):
            raise DivergedError(f"non-finite loss ({float(loss.detach())}) at step {step}")
        w = loss_weight(loss_type, mask, sl, within)
        (loss * w if w != 1.0 else loss).backward()
        acc.add(st, w, float(mask[sl].sum()))
    return st if len(slices) == 1 and st is not None else acc.stats()


def enable_checkpointing(model: Any) -> bool:
    """Checkpoint every decoder layer of ``model`` (non-reentrant) and make the embedding
    output require grad; returns whether torch's early stop is on (the recompute then
    skips each layer's last matmul: ``race.accounting.recompute_flops(early_stop=...)``)."""
    import torch.utils.checkpoint as cp

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kw = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:  # pragma: no cover - older transformers
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    base.enable_input_require_grads()  # transformers does it for input_ids models; say so for any
    return getattr(cp, "_checkpoint_early_stop", None) is not False


__all__ = ["TOKEN_NORMALISED", "accumulate_gradients", "enable_checkpointing", "logprobs", "loss_weight",
           "micro_slices", "optimizer_steps", "rows", "span"]
