"""The gang's learning passes: old-policy / reference log-probs and the update, batched.

Each member's pass is ``race.engines.builtin.micro_batch``'s (its kept rows in micro-batches of
its own ``per_device_train_batch_size``, each group's prompt once per micro-batch, padded
widths kept), and micro-batch ``j`` of every member runs in one gang pass
(``race.engines.gang.forward.shared_prompt_logits``). In the update, round ``j`` sums the
members' weighted micro-batch losses and runs one backward: members' adapters are
disjoint, so each member's gradient is the gradient of its own loss, accumulated over its
micro-batches in the same order as alone. A member whose loss is not finite is reported
(its loss stays out of the backward); the caller retires it as diverged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from race.engines.gang.forward import GangDecoder, SharedItem, shared_prompt_logits, token_logprobs
from race.engines.grpo_math import LossStats
from race.engines.builtin.micro_batch import Accumulator, loss_weight, micro_slices, rows, shared_inputs, span
from race.engines.sampling import Rollout


@dataclass
class PassJob:
    """One member's batch for a gang pass. ``member``: whose adapter runs (None: the base
    alone, the reference policy of a LoRA run); ``size``: its micro-batch rows."""

    member: int | None
    ro: Rollout
    size: int
    temperature: float

    def micro(self) -> list[slice]:
        """The micro-batch slices this job runs: all of its batch's."""
        return micro_slices(self.ro.prompt_ids.shape[0], self.size)


def _rounds(jobs: list[PassJob]) -> list[list[tuple[int, slice]]]:
    """Round j: (job index, its j-th micro-batch slice) for every job that has one."""
    slices = [j.micro() for j in jobs]
    return [[(i, s[r]) for i, s in enumerate(slices) if r < len(s)] for r in range(max(map(len, slices)))]


def _logprobs_round(gdec: GangDecoder, jobs: list[PassJob], rnd: list[tuple[int, slice]]) -> list[torch.Tensor]:
    items = []
    for i, sl in rnd:
        r = rows(jobs[i].ro, sl)
        pids, pmask, seg = shared_inputs(r, sl.start)
        items.append(SharedItem(jobs[i].member, pids, pmask, r.completion_ids, r.completion_mask, seg))
    logits = shared_prompt_logits(gdec, items)
    return [token_logprobs(lg, it.completion_ids, jobs[i].temperature) for lg, it, (i, _) in zip(logits, items, rnd)]


def gang_logprobs(models: list[Any], jobs: list[PassJob]) -> list[torch.Tensor]:
    """Each job's completion log-probs (B, T), as ``micro_batch.logprobs(share=True)``
    computes them alone (no gradient)."""
    if not jobs:
        return []
    parts: list[list[torch.Tensor]] = [[] for _ in jobs]
    with torch.no_grad():
        gdec = GangDecoder(models)
        for rnd in _rounds(jobs):
            for (i, _), lp in zip(rnd, _logprobs_round(gdec, jobs, rnd)):
                parts[i].append(lp)
    return [torch.cat(p, dim=0) for p in parts]


@dataclass
class UpdateJob(PassJob):
    """A member's update batch: advantages (B,), loss mask (B, T), old and reference
    log-probs (or None), its ``grpo_loss`` keyword arguments, and the micro-batches of the
    optimizer step (``micro_batch.optimizer_steps``; None: every micro-batch of the batch)."""

    adv: torch.Tensor = None  # type: ignore[assignment]
    mask: torch.Tensor = None  # type: ignore[assignment]
    old: torch.Tensor | None = None
    ref: torch.Tensor | None = None
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    slices: list[slice] | None = None

    def micro(self) -> list[slice]:
        return super().micro() if self.slices is None else self.slices


@dataclass
class UpdateResult:
    stats: LossStats | None  # the batch's loss statistics (None: diverged)
    error: str | None = None  # why it diverged


def gang_accumulate(models: list[Any], jobs: list[UpdateJob], loss_fn: Callable[..., Any],
                    step: int) -> list[UpdateResult]:
    """Backward of every job's loss over its micro-batches (``micro_batch.accumulate_gradients``
    per member over its ``slices``, round by round in one gang pass); gradients add up in each member's own
    ``.grad`` (the caller zeroes before, clips and steps each optimizer after)."""
    if not jobs:
        return []
    gdec = GangDecoder(models)
    accs = [Accumulator() for _ in jobs]
    last: list[LossStats | None] = [None] * len(jobs)
    bad: dict[int, str] = {}
    n_slices = [len(j.micro()) for j in jobs]
    within = [span(j.micro()) for j in jobs]
    for rnd in _rounds(jobs):
        rnd = [(i, sl) for i, sl in rnd if i not in bad]
        if not rnd:
            continue
        total = None
        for (i, sl), logp in zip(rnd, _logprobs_round(gdec, jobs, rnd)):
            j = jobs[i]
            loss, st = loss_fn(logp, j.old[sl] if j.old is not None else logp.detach(), j.adv[sl], j.mask[sl],
                               ref_logp=j.ref[sl] if j.ref is not None else None, **j.loss_kwargs)
            if not torch.isfinite(loss):
                bad[i] = f"non-finite loss ({float(loss.detach())}) at step {step}"
                continue
            w = loss_weight(j.loss_kwargs["loss_type"], j.mask, sl, within[i])
            term = loss * w if w != 1.0 else loss
            total = term if total is None else total + term
            accs[i].add(st, w, float(j.mask[sl].sum()))
            last[i] = st
        if total is not None:
            total.backward()
    out = []
    for i in range(len(jobs)):
        if i in bad:
            out.append(UpdateResult(None, bad[i]))
        else:
            st = last[i] if n_slices[i] == 1 else accs[i].stats()
            out.append(UpdateResult(st))
    return out


__all__ = ["PassJob", "UpdateJob", "UpdateResult", "gang_accumulate", "gang_logprobs"]
