"""The gang's fast rollout: every member's merged weights in one batched matmul per
projection, every member's rows in one attention, one sampler call per step.

At pilot scale a decode step is a few hundred small ops, and their count, not their FLOPs,
sets the time. :func:`race.engines.gang.sample.gang_sample` shares the base matmul but runs
each member's adapters and attention apart (more ops than K solo rollouts, which merge
LoRA into their weights). This decoder runs the rollout the way the solo run does, merged,
but for all members at once:

- each member's adapters are folded into its own weights (``W + s B A``, as the solo
  rollout does when merging pays), stacked ``(K, in, out)``; every projection is one
  ``bmm`` over a member-major layout of ``K x S`` rows (``S`` slots per member: its rows,
  padded to the largest member's count with copies of its first row);
- every member's prompts are left-padded to the longest prompt width, so all rows share
  one KV cache layout and one attention per layer (``FastDecoder.run`` unchanged);
- one sampler call per step: each member's uniforms come from its own generator for all
  of its rows (what its solo loop draws), the temperatures are per row, and each row's
  token is ``sampling.draw``'s inverse-CDF pick from its own logits;
- finished rows leave the batch when an eighth of the rows in it are done (one gather
  of the cache), and a member with no row left leaves the stacked weights.

Each member's ``Rollout`` is what its solo rollout returns: its tokens (the same up to the
float rounding of a batched matmul), and ``decoded`` as the solo loop's drop rule gives it
(replayed per member, whatever the gang dropped), so the ledger charges its solo rollout.
What the gang executed (merges, padded prompts and slots) is :meth:`FastRollout.executed`.

Only for members whose base holds a folded delta (float32 or wider:
``fast_decode.fold_keeps_update``; ``FastDecoder.merge_lora`` refuses the others): on a
bfloat16/float16 base the merge would round a small update away, and the solo rollout
runs the adapters live; the gang then runs ``race.engines.gang.sample.gang_sample``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from race.engines.kernels.fast_decode import FastDecoder
from race.engines.gang.sample import SampleJob
from race.engines.sampling import Rollout, completion_mask, positions


class _Stacked:
    """One projection for K members: their merged weights as one ``(K, in, out)`` bmm
    (``fast_decode._Proj``'s interface: outputs per part, ``add`` fused)."""

    plain = False

    def __init__(self, projs: list[Any]) -> None:
        self.sizes = projs[0].sizes
        self.w = torch.stack([p.weight.t() for p in projs])  # (K, in, out)
        self.b = None if projs[0].bias is None else torch.stack([p.bias for p in projs])[:, None, :]

    def keep(self, members: torch.Tensor) -> None:
        self.w = self.w.index_select(0, members)
        self.b = None if self.b is None else self.b.index_select(0, members)

    def __call__(self, x: torch.Tensor, add: torch.Tensor | None = None) -> list[torch.Tensor]:
        K = self.w.shape[0]
        xb = x.view(K, -1, x.shape[-1])
        if self.b is not None:
            y = torch.baddbmm(self.b, xb, self.w)
            if add is not None:
                y = y + add.view(K, -1, y.shape[-1])
        elif add is not None:
            y = torch.baddbmm(add.view(K, -1, add.shape[-1]), xb, self.w)
        else:
            y = torch.bmm(xb, self.w)
        y = y.view(-1, y.shape[-1])
        return list(y.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [y]


@dataclass
class FastRollout:
    rollouts: list[Rollout]
    prefill_rows: int  # prompt rows prefilled (members x prompt slots)
    prompt_len: int  # the common padded prompt width
    decoded: list[int] = field(default_factory=list)  # per physical row: tokens it produced in the batch
    merged: list[bool] = field(default_factory=list)  # per member: its adapters were folded in

    def executed(self, shape: Any, loras: list[Any], conventions: Any) -> int:
        """FLOPs the gang's decode executed: the merges, the prefill of the padded prompt
        slots and every physical row's decode steps (no LoRA term: merged weights)."""
        from race.accounting.rollout import executed_gang_decode

        return executed_gang_decode(shape, self.prompt_len, self.prefill_rows, self.decoded, loras, conventions)


def _left_pad(ids: torch.Tensor, mask: torch.Tensor, width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = width - ids.shape[1]
    if not n:
        return ids, mask
    return (torch.cat([torch.full((ids.shape[0], n), pad_id, dtype=ids.dtype), ids], 1),
            torch.cat([torch.zeros(ids.shape[0], n, dtype=mask.dtype), mask], 1))


def fast_gang_sample(models: list[Any], jobs: list[SampleJob], max_new_tokens: int) -> FastRollout:
    """Every job's rollout (module docstring), in ``jobs`` order."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    if len({(j.eos_id, j.pad_id) for j in jobs}) != 1:
        raise ValueError("gang members must share the tokenizer's EOS and padding ids")
    with torch.inference_mode():
        return _sample(models, jobs, max_new_tokens)


def _sample(models: list[Any], jobs: list[SampleJob], max_new: int) -> FastRollout:
    eos, pad = jobs[0].eos_id, jobs[0].pad_id
    K = len(jobs)
    P = max(j.prompt_ids.shape[1] for j in jobs)
    n_p = [j.prompt_ids.shape[0] for j in jobs]
    dec, merged = _stacked_decoder(models, jobs, n_p, max_new)
    # prefill: S_p prompt slots per member (pads repeat its first prompt)
    Sp = max(n_p)
    ids, masks = [], []
    for j, n in zip(jobs, n_p):
        i, m = _left_pad(j.prompt_ids, j.prompt_mask, P, pad)
        sl = torch.cat([torch.arange(n), torch.zeros(Sp - n, dtype=torch.long)])
        ids.append(i[sl])
        masks.append(m[sl])
    logits = dec.prefill(torch.cat(ids), torch.cat(masks), P + max_new)
    solo = _SoloBooks.of(jobs, n_p, max_new, pad)
    batch = _Batch.of(dec, jobs, solo, Sp, P)
    logits = logits.index_select(0, batch.src)
    T = 0
    for t in range(max_new):
        T = t + 1
        nxt = batch.draw(logits, jobs, solo)
        real = batch.slot_row >= 0
        rows_c = batch.slot_row.clamp(min=0)
        nxt = torch.where(solo.done[rows_c] | ~real, torch.full_like(nxt, pad), nxt)
        solo.record(batch.slot_row[real], t, nxt[real], eos)
        if solo.replay(t, T):
            break
        nxt = batch.drop_finished(solo.done[rows_c] | ~real, real, nxt, T)
        batch.pos = batch.pos + 1
        logits = dec.decode(nxt, batch.pos)
    batch.phys += [T] * batch.slot_row.numel()
    return FastRollout(solo.rollouts(jobs, merged, eos), prefill_rows=K * Sp, prompt_len=P, decoded=batch.phys,
                       merged=merged)


_STACKED = ("qkv", "o", "gate_up", "down")  # the projections every member's merged weights stack


def _stacked_decoder(models: list[Any], jobs: list[SampleJob], n_p: list[int],
                     max_new: int) -> tuple[FastDecoder, list[bool]]:
    """(a decoder of the first member whose projections are every member's merged weights
    stacked (:class:`_Stacked`), per member: whether merging pays at full length)."""
    dec = FastDecoder(models[jobs[0].member])
    merged = []
    mdecs = []
    for j, n in zip(jobs, n_p):
        md = FastDecoder(models[j.member])
        merged.append(md.should_merge(n * j.prompt_ids.shape[1] + n * j.group * (max_new - 1)))
        md.merge_lora()  # refused on a base that cannot hold the fold (module docstring)
        mdecs.append(md)
    dec.layers = [{**L, **{key: _Stacked([m.layers[li][key] for m in mdecs]) for key in _STACKED}}
                  for li, L in enumerate(dec.layers)]
    return dec, merged


@dataclass
class _SoloBooks:
    """Per global row (member-major, each member's ``n_prompts x group`` rows): what each
    member's solo loop would have produced and decoded, replayed whatever the gang drops."""

    B: list[int]  # rows per member
    off: list[int]  # first global row per member
    max_new: int
    comp: torch.Tensor  # (rows, max_new) tokens, pad after EOS
    done: torch.Tensor  # per global row: produced EOS
    solo_live: torch.Tensor  # per global row: in its member's solo batch
    decoded: torch.Tensor  # per global row: tokens it produced in its member's solo batch
    member_of_row: torch.Tensor
    T_of: list[int]  # per member: its solo loop's T; 0 while it runs

    @classmethod
    def of(cls, jobs: list[SampleJob], n_p: list[int], max_new: int, pad: int) -> "_SoloBooks":
        B = [n * j.group for n, j in zip(n_p, jobs)]
        n_rows = sum(B)
        return cls(B, [sum(B[:k]) for k in range(len(jobs))], max_new,
                   torch.full((n_rows, max_new), pad, dtype=torch.long), torch.zeros(n_rows, dtype=torch.bool),
                   torch.ones(n_rows, dtype=torch.bool), torch.zeros(n_rows, dtype=torch.long),
                   torch.cat([torch.full((b,), k, dtype=torch.long) for k, b in enumerate(B)]), [0] * len(jobs))

    def mine(self, k: int) -> slice:
        return slice(self.off[k], self.off[k] + self.B[k])

    def record(self, rows: torch.Tensor, t: int, tokens: torch.Tensor, eos: int) -> None:
        self.comp[rows, t] = tokens
        self.done[rows] |= tokens == eos

    def replay(self, t: int, T: int) -> bool:
        """Each member's solo loop after step ``t``: its end, or its drop of finished rows
        (an eighth of its batch); whether every member's loop has ended."""
        n_batch = torch.bincount(self.member_of_row[self.solo_live], minlength=len(self.B)).tolist()
        n_done = torch.bincount(self.member_of_row[self.solo_live & self.done], minlength=len(self.B)).tolist()
        for k in range(len(self.B)):
            if self.T_of[k]:
                continue
            mine = self.mine(k)
            if n_done[k] == n_batch[k] or t == self.max_new - 1:
                self.T_of[k] = T
                self.decoded[mine][self.solo_live[mine]] = T
            elif n_done[k] * 8 >= n_batch[k]:
                leave = self.solo_live[mine] & self.done[mine]
                self.decoded[mine][leave] = T
                self.solo_live[mine] &= ~leave
        return all(self.T_of)

    def rollouts(self, jobs: list[SampleJob], merged: list[bool], eos: int) -> list[Rollout]:
        """Each member's ``Rollout``, as its solo rollout returns it."""
        outs = []
        for k, j in enumerate(jobs):
            mine = self.mine(k)
            c = self.comp[mine, :self.T_of[k]]
            cmask, truncated = completion_mask(c, eos)
            outs.append(Rollout(prompt_ids=j.prompt_ids.repeat_interleave(j.group, 0).clone(),
                                prompt_mask=j.prompt_mask.repeat_interleave(j.group, 0).clone(),
                                completion_ids=c.clone(), completion_mask=cmask, truncated=truncated,
                                n_prompts=j.prompt_ids.shape[0], group=j.group, merged=merged[k],
                                decoded=self.decoded[mine].clone()))
        return outs


@dataclass
class _Batch:
    """The gang's physical batch: ``S`` slots per member still in the stacked layout
    (``members``, in order); ``slot_row`` maps a slot to its global row (-1: a padding slot);
    per slot its temperature, greedy flag and position; ``phys``: the decoded tokens of the
    physical rows that left."""

    dec: FastDecoder
    src: torch.Tensor  # per slot: the prompt slot it continues (the first layout only)
    slot_row: torch.Tensor
    S: int
    members: list[int]
    temp: torch.Tensor
    greedy: torch.Tensor
    pos: torch.Tensor
    phys: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, dec: FastDecoder, jobs: list[SampleJob], solo: _SoloBooks, Sp: int, P: int) -> "_Batch":
        """The first layout: S slots per member (its rows, then copies of its first row);
        the decoder's cache is selected to it."""
        K, S = len(jobs), max(solo.B)
        src, slot_row = [], []
        for k, (j, b) in enumerate(zip(jobs, solo.B)):
            src += [k * Sp + r // j.group for r in range(b)] + [k * Sp] * (S - b)
            slot_row += [solo.off[k] + r for r in range(b)] + [-1] * (S - b)
        src_t, slot_row_t = torch.tensor(src), torch.tensor(slot_row)
        dec.select(src_t)
        row_mask = torch.cat([_left_pad(j.prompt_ids, j.prompt_mask, P, j.pad_id)[1].repeat_interleave(j.group, 0)
                              for j in jobs])
        return cls(dec, src_t, slot_row_t, S, list(range(K)),
                   torch.tensor([jobs[k].temperature for k in range(K) for _ in range(S)]),
                   torch.tensor([jobs[k].greedy for k in range(K) for _ in range(S)]),
                   positions(row_mask)[:, -1][slot_row_t.clamp(min=0)])

    def draw(self, logits: torch.Tensor, jobs: list[SampleJob], solo: _SoloBooks) -> torch.Tensor:
        """One sampler call: each member's uniforms from its own generator for all of its rows
        (what its solo loop draws, none once that loop ended), each row's inverse-CDF pick."""
        if bool(self.greedy.all()):
            return logits.argmax(-1)
        us = [torch.rand(b, 1, generator=j.generator) if not solo.T_of[k] and not j.greedy else torch.zeros(b, 1)
              for k, (j, b) in enumerate(zip(jobs, solo.B))]
        u = torch.cat(us)[self.slot_row.clamp(min=0)]
        probs = torch.softmax(logits.float() / self.temp[:, None], dim=-1)
        cdf = probs.cumsum(-1)
        nxt = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)
        if bool(self.greedy.any()):
            nxt = torch.where(self.greedy, logits.argmax(-1), nxt)
        return nxt

    def drop_finished(self, fin: torch.Tensor, real: torch.Tensor, nxt: torch.Tensor, T: int) -> torch.Tensor:
        """The gang's own drop: finished rows (and padding slots) leave once they are an
        eighth of the real rows (one gather of the cache; a member with no row left leaves
        the stacked weights). Returns ``nxt`` for the slots that stay."""
        if int((fin & real).sum()) * 8 < int(real.sum()):
            return nxt
        slot_member = torch.tensor(self.members).repeat_interleave(self.S)
        keep_rows = [self.slot_row[(slot_member == k) & ~fin] for k in self.members]
        S_new = max(int(x.numel()) for x in keep_rows)
        idx, rows_new, members_new = [], [], []
        for mi, (k, kr) in enumerate(zip(self.members, keep_rows)):
            if not kr.numel():
                continue
            where = ((slot_member == k) & ~fin).nonzero().squeeze(1)
            idx.append(torch.cat([where, where[:1].expand(S_new - where.numel())]))
            rows_new.append(torch.cat([kr, torch.full((S_new - kr.numel(),), -1, dtype=torch.long)]))
            members_new.append((mi, k))
        self.phys += [T] * (fin.numel() - len(members_new) * S_new)
        keep_idx = torch.cat(idx)
        self.dec.select(keep_idx)
        self.pos, self.temp, self.greedy = self.pos[keep_idx], self.temp[keep_idx], self.greedy[keep_idx]
        if len(members_new) < len(self.members):
            mi_t = torch.tensor([mi for mi, _ in members_new])
            for L in self.dec.layers:
                for key in _STACKED:
                    L[key].keep(mi_t)
        self.members = [k for _, k in members_new]
        self.slot_row, self.S = torch.cat(rows_new), S_new
        return nxt[keep_idx]


__all__ = ["FastRollout", "fast_gang_sample"]
