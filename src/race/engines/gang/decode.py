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
from race.engines.sampling import Rollout, positions


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
    B = [n * j.group for n, j in zip(n_p, jobs)]
    off = [sum(B[:k]) for k in range(K)]
    dec = FastDecoder(models[jobs[0].member])
    merged = []
    mdecs = []
    for j, n in zip(jobs, n_p):
        md = FastDecoder(models[j.member])
        merged.append(md.should_merge(n * j.prompt_ids.shape[1] + n * j.group * (max_new - 1)))
        md.merge_lora()  # refused on a base that cannot hold the fold (module docstring)
        mdecs.append(md)
    dec.layers = [{**L, **{key: _Stacked([m.layers[li][key] for m in mdecs]) for key in ("qkv", "o", "gate_up", "down")}}
                  for li, L in enumerate(dec.layers)]
    # prefill: S_p prompt slots per member (pads repeat its first prompt)
    Sp = max(n_p)
    ids, masks = [], []
    for j, n in zip(jobs, n_p):
        i, m = _left_pad(j.prompt_ids, j.prompt_mask, P, pad)
        sl = torch.cat([torch.arange(n), torch.zeros(Sp - n, dtype=torch.long)])
        ids.append(i[sl])
        masks.append(m[sl])
    logits = dec.prefill(torch.cat(ids), torch.cat(masks), P + max_new)
    # rows: S slots per member; slot_row: global row (member-major), -1 for padding slots
    S = max(B)
    src, slot_row = [], []
    for k, (j, b) in enumerate(zip(jobs, B)):
        src += [k * Sp + r // j.group for r in range(b)] + [k * Sp] * (S - b)
        slot_row += [off[k] + r for r in range(b)] + [-1] * (S - b)
    src_t = torch.tensor(src)
    dec.select(src_t)
    logits = logits.index_select(0, src_t)
    slot_row_t = torch.tensor(slot_row)
    n_rows = sum(B)
    member_of_row = torch.cat([torch.full((b,), k, dtype=torch.long) for k, b in enumerate(B)])
    row_mask = torch.cat([_left_pad(j.prompt_ids, j.prompt_mask, P, pad)[1].repeat_interleave(j.group, 0)
                          for j in jobs])
    pos = positions(row_mask)[:, -1][slot_row_t.clamp(min=0)]
    temp = torch.tensor([jobs[k].temperature for k in range(K) for _ in range(S)])
    greedy = torch.tensor([jobs[k].greedy for k in range(K) for _ in range(S)])
    comp = torch.full((n_rows, max_new), pad, dtype=torch.long)
    done = torch.zeros(n_rows, dtype=torch.bool)  # per global row: produced EOS
    solo_live = torch.ones(n_rows, dtype=torch.bool)  # per global row: in its member's solo batch
    decoded = torch.zeros(n_rows, dtype=torch.long)
    T_of = [0] * K  # per member: its solo loop's T; 0 while it runs
    live_members = list(range(K))  # members in the stacked layout, in order
    phys: list[int] = []  # decoded tokens of physical rows that left
    T = 0
    for t in range(max_new):
        T = t + 1
        rows_c = slot_row_t.clamp(min=0)
        if bool(greedy.all()):
            nxt = logits.argmax(-1)
        else:
            us = [torch.rand(b, 1, generator=j.generator) if not T_of[k] and not j.greedy else torch.zeros(b, 1)
                  for k, (j, b) in enumerate(zip(jobs, B))]
            u = torch.cat(us)[rows_c]
            probs = torch.softmax(logits.float() / temp[:, None], dim=-1)
            cdf = probs.cumsum(-1)
            nxt = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)
            if bool(greedy.any()):
                nxt = torch.where(greedy, logits.argmax(-1), nxt)
        real = slot_row_t >= 0
        nxt = torch.where(done[rows_c] | ~real, torch.full_like(nxt, pad), nxt)
        r = slot_row_t[real]
        comp[r, t] = nxt[real]
        done[r] |= nxt[real] == eos
        # each member's solo loop: its end, or its drop of finished rows (replayed)
        n_batch = torch.bincount(member_of_row[solo_live], minlength=K).tolist()
        n_done = torch.bincount(member_of_row[solo_live & done], minlength=K).tolist()
        for k in range(K):
            if T_of[k]:
                continue
            mine = slice(off[k], off[k] + B[k])
            if n_done[k] == n_batch[k] or t == max_new - 1:
                T_of[k] = T
                decoded[mine][solo_live[mine]] = T
            elif n_done[k] * 8 >= n_batch[k]:
                leave = solo_live[mine] & done[mine]
                decoded[mine][leave] = T
                solo_live[mine] &= ~leave
        if all(T_of):
            break
        # the gang's own drop: finished rows (and padding slots) leave once they are an eighth
        fin = done[rows_c] | ~real
        if int((fin & real).sum()) * 8 >= int(real.sum()):
            slot_member = torch.tensor(live_members).repeat_interleave(S)
            keep_rows = [slot_row_t[(slot_member == k) & ~fin] for k in live_members]
            counts = [int(x.numel()) for x in keep_rows]
            S_new = max(counts)
            idx, rows_new, members_new = [], [], []
            for mi, (k, kr) in enumerate(zip(live_members, keep_rows)):
                if not kr.numel():
                    continue
                slots = (slot_member == k) & ~fin
                where = slots.nonzero().squeeze(1)
                idx.append(torch.cat([where, where[:1].expand(S_new - where.numel())]))
                rows_new.append(torch.cat([kr, torch.full((S_new - kr.numel(),), -1, dtype=torch.long)]))
                members_new.append((mi, k))
            phys += [T] * (fin.numel() - len(members_new) * S_new)
            keep_idx = torch.cat(idx)
            dec.select(keep_idx)
            nxt, pos = nxt[keep_idx], pos[keep_idx]
            temp, greedy = temp[keep_idx], greedy[keep_idx]
            if len(members_new) < len(live_members):
                mi_t = torch.tensor([mi for mi, _ in members_new])
                for L in dec.layers:
                    for key in ("qkv", "o", "gate_up", "down"):
                        L[key].keep(mi_t)
            live_members = [k for _, k in members_new]
            slot_row_t, S = torch.cat(rows_new), S_new
        pos = pos + 1
        logits = dec.decode(nxt, pos)
    phys += [T] * slot_row_t.numel()
    outs = []
    for k, j in enumerate(jobs):
        mine = slice(off[k], off[k] + B[k])
        c = comp[mine, :T_of[k]]
        is_eos = c == eos
        has_eos = is_eos.any(1)
        first = torch.where(has_eos, is_eos.float().argmax(1), torch.full_like(has_eos, c.shape[1], dtype=torch.long))
        cmask = (torch.arange(c.shape[1])[None, :] <= first[:, None]).long()
        outs.append(Rollout(prompt_ids=j.prompt_ids.repeat_interleave(j.group, 0).clone(),
                            prompt_mask=j.prompt_mask.repeat_interleave(j.group, 0).clone(), completion_ids=c.clone(),
                            completion_mask=cmask, truncated=~has_eos, n_prompts=n_p[k], group=j.group,
                            merged=merged[k], decoded=decoded[mine].clone()))
    return FastRollout(outs, prefill_rows=K * Sp, prompt_len=P, decoded=phys, merged=merged)


__all__ = ["FastRollout", "fast_gang_sample"]
