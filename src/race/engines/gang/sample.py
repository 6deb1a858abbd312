"""The gang's rollout: every member's prefill and KV-cache decode in one batched loop.

Each member's rollout follows ``race.engines.sampling._sample`` (the functional decoder
path) step for step on its own rows: its own prompts, group size, temperature and
generator (uniforms for every one of its rows each step, in the batch or not), its own
finished-row drops (once an eighth of its rows still decoding produced EOS) and its own
end (all its rows done, or ``max_new_tokens``). Only the forwards are shared: every step
one gang pass (``race.engines.gang.forward``) runs the next token of every member still
decoding, the base weights once over all their rows, each member's LoRA delta on its
own rows (never merged: the merged weights of two members are different matrices).

The returned ``Rollout`` of a member carries ``merged`` as its solo rollout would have
set it (``FastDecoder.should_merge`` at the member's shapes): the ledger charges each
member its solo rollout (``sampling.rollout_flops``), while :func:`executed_rollout_flops`
gives what the gang executed for it (live LoRA at every position, no merge).

The gang engine runs this loop when its members' base cannot hold a folded adapter (a
bfloat16/float16 base: ``fast_decode.fold_keeps_update``), where the solo rollout runs the
adapters live too, so charged and executed are the same; otherwise it runs the merged,
stacked decode of ``race.engines.gang.decode``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from race.engines.gang.forward import GangDecoder, Segment
from race.engines.sampling import Rollout, positions, draw


@dataclass
class SampleJob:
    """One member's rollout request (``sampling.sample``'s arguments)."""

    member: int
    prompt_ids: torch.Tensor  # (n_prompts, P) left-padded
    prompt_mask: torch.Tensor
    group: int
    temperature: float
    generator: torch.Generator | None
    eos_id: int
    pad_id: int
    greedy: bool = False


class _Member:
    """One member's decode state: its KV cache and ``_sample``'s loop variables."""

    def __init__(self, job: SampleJob, gdec: GangDecoder, max_new: int) -> None:
        self.job, self.max_new = job, max_new
        n, P = job.prompt_ids.shape
        b = gdec.base
        dev, dt = job.prompt_ids.device, b.embed.dtype
        self.B = n * job.group
        self.mask = job.prompt_mask.repeat_interleave(job.group, dim=0)
        self.pos = positions(self.mask)[:, -1]
        mdec = gdec.decs[job.member]
        self.merged = mdec.should_merge(n * P + self.B * (max_new - 1))
        shape = (n, b.kv_heads, P + max_new, b.head_dim)
        self.k = [torch.zeros(shape, device=dev, dtype=dt) for _ in b.layers]
        self.v = [torch.zeros(shape, device=dev, dtype=dt) for _ in b.layers]
        neg = torch.finfo(dt).min
        self.bias = torch.full((n, P + max_new), neg, dtype=dt, device=dev)
        self.bias[:, :P].masked_fill_(job.prompt_mask.bool(), 0.0)
        self.length = 0
        self.comp = torch.full((self.B, max_new), job.pad_id, dtype=torch.long, device=dev)
        self.live: torch.Tensor | None = None
        self.decoded = torch.zeros(self.B, dtype=torch.long, device=dev)
        self.done = torch.zeros(self.B, dtype=torch.bool, device=dev)
        self.T, self.t, self.finished = 0, 0, False
        self.nxt: torch.Tensor | None = None

    def segment(self, ids: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor) -> Segment:
        start, end = self.length, self.length + ids.shape[1]

        def cached(li: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.k[li][:, :, start:end] = k.transpose(1, 2)
            self.v[li][:, :, start:end] = v.transpose(1, 2)
            return self.k[li][:, :, :end], self.v[li][:, :, :end]

        self.length = end
        return Segment(ids, pos, bias, cached, self.job.member)

    def prefill(self) -> Segment:
        ids, mask = self.job.prompt_ids, self.job.prompt_mask
        P = ids.shape[1]
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
        allowed = causal[None, None] & mask.bool()[:, None, None, :]
        bias = torch.zeros(allowed.shape, dtype=self.bias.dtype, device=ids.device).masked_fill(
            ~allowed, torch.finfo(self.bias.dtype).min)
        return self.segment(ids, positions(mask), bias)

    def expand(self) -> None:
        g = self.job.group
        if g > 1:
            self.k = [c.repeat_interleave(g, dim=0) for c in self.k]
            self.v = [c.repeat_interleave(g, dim=0) for c in self.v]
            self.bias = self.bias.repeat_interleave(g, dim=0)

    def choose(self, logits: torch.Tensor) -> None:
        """One iteration of ``_sample``'s loop on ``logits`` (rows in the batch, V): draw,
        record, maybe drop finished rows; sets ``finished`` or the next token to run."""
        job, t = self.job, self.t
        if job.greedy:
            nxt = logits.argmax(-1)
        else:
            u = torch.rand(self.B, 1, generator=job.generator, device=logits.device)
            nxt = draw(logits, job.temperature, u=u if self.live is None else u[self.live])
        nxt = torch.where(self.done, torch.full_like(nxt, job.pad_id), nxt)
        self.comp[slice(None) if self.live is None else self.live, t] = nxt
        self.T = t + 1
        self.done = self.done | (nxt == job.eos_id)
        n_done = int(self.done.sum())
        if n_done == self.done.shape[0] or t == self.max_new - 1:
            self.finished = True
            return
        if n_done * 8 >= self.done.shape[0]:
            rows = torch.arange(self.B, device=nxt.device) if self.live is None else self.live
            self.decoded[rows[self.done]] = self.T
            keep = (~self.done).nonzero().squeeze(1)
            self.live, nxt, self.pos, self.done = rows[keep], nxt[keep], self.pos[keep], self.done[keep]
            self.k = [c.index_select(0, keep) for c in self.k]
            self.v = [c.index_select(0, keep) for c in self.v]
            self.bias = self.bias.index_select(0, keep)
        self.pos = self.pos + 1
        self.nxt = nxt
        self.t = t + 1

    def decode_segment(self) -> Segment:
        assert self.nxt is not None
        self.bias[:, self.length] = 0.0
        return self.segment(self.nxt[:, None], self.pos[:, None], self.bias[:, None, None, :self.length + 1])

    def rollout(self) -> Rollout:
        job = self.job
        self.decoded[slice(None) if self.live is None else self.live] = self.T
        comp = self.comp[:, :self.T]
        is_eos = comp == job.eos_id
        has_eos = is_eos.any(1)
        first_eos = torch.where(has_eos, is_eos.float().argmax(1),
                                torch.full_like(has_eos, comp.shape[1], dtype=torch.long))
        cmask = (torch.arange(comp.shape[1], device=comp.device)[None, :] <= first_eos[:, None]).long()
        return Rollout(prompt_ids=job.prompt_ids.repeat_interleave(job.group, dim=0).clone(),
                       prompt_mask=self.mask.clone(), completion_ids=comp.clone(), completion_mask=cmask,
                       truncated=~has_eos, n_prompts=job.prompt_ids.shape[0], group=job.group,
                       merged=self.merged, decoded=self.decoded.clone())


def gang_sample(models: list[Any], jobs: list[SampleJob], max_new_tokens: int) -> list[Rollout]:
    """Every job's rollout (module docstring), in ``jobs`` order; ``models``: the gang's
    policies (a job's ``member`` indexes them)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    with torch.inference_mode():
        gdec = GangDecoder(models)
        P = max(j.prompt_ids.shape[1] for j in jobs)
        gdec.base.rope_tables(P + max_new_tokens, jobs[0].prompt_ids.device, gdec.base.embed.dtype)
        ms = [_Member(j, gdec, max_new_tokens) for j in jobs]
        xs = gdec.run([m.prefill() for m in ms])
        for m, x in zip(ms, xs):
            m.expand()
            logits = gdec.head(x[:, -1])
            m.choose(logits.repeat_interleave(m.job.group, dim=0) if m.job.group > 1 else logits)
        while True:
            live = [m for m in ms if not m.finished]
            if not live:
                break
            xs = gdec.run([m.decode_segment() for m in live])
            for m, x in zip(live, xs):
                m.choose(gdec.head(x[:, -1]))
        return [m.rollout() for m in ms]


def executed_rollout_flops(policy: Any, ro: Rollout) -> dict[str, int]:
    """What the gang's rollout executed for one member (``policy``: its
    :class:`race.accounting.PolicyCost`): the solo count with live LoRA at every position (the gang never merges), whatever ``ro.merged`` says."""
    from race.engines.sampling import rollout_flops

    unmerged = Rollout(ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask, ro.truncated,
                       ro.n_prompts, ro.group, merged=False, decoded=ro.decoded)
    return rollout_flops(policy, unmerged)


__all__ = ["SampleJob", "executed_rollout_flops", "gang_sample"]
