"""One gang step: the built-in engine's ``_train_step`` for every participating member,
with the rollout, the log-prob passes and the update batched across them.

The step stacks the members' policies and runs the numerical passes (decode, log-probs,
gradients) over all of them here; everything that is a member's own it asks the member
through its step stages (``race.engines.StepMember``), never through its state or books.
Per member, the stages and what they charge are the solo engine's, in its order
(``race.engines.builtin.BuiltinEngine._train_step``): rollout (its prompts, group,
temperature, generator seeded from (seed, step)) -> its reward -> advantages (zero-variance
groups dropped) -> the exact-cost budget check (a member that cannot take its step
records the rollout and reward as ``overrun`` and leaves) -> old/reference log-probs ->
``num_iterations`` passes of ``steps_per_generation / gradient_accumulation_steps`` clipped
optimizer steps each (its lr, loss, micro-batches; its gradients clipped and its optimizer
stepped alone) -> its ledger charged with the solo run's components (the
same methods, over its own rows), its metrics row.

Seconds: a batched stage's wall seconds are split among the members that ran in it in
proportion to the FLOPs it charges each (``members.split_seconds``); the reward is each
member's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from race.accounting import PHASES, SPLIT, counted
from race.engines.gang.members import split_seconds
from race.engines.gang.passes import PassJob, UpdateJob, gang_accumulate, gang_logprobs
from race.engines.gang.decode import FastRollout, fast_gang_sample
from race.engines.gang.sample import SampleJob, executed_rollout_flops, gang_sample
from race.engines.kernels.fast_decode import fold_keeps_update
from race.engines.builtin.micro_batch import Accumulator, span
from race.engines.builtin.step_parts import Scored, UpdatePlan
from race.engines.grpo_math import grpo_loss
from race.engines.sampling import Rollout
from race.models.timing import device_clock

if TYPE_CHECKING:
    from race.engines import StepMember


@dataclass
class Work:
    """A member's state through one gang step."""

    index: int  # the member's index in the gang (its adapter)
    member: StepMember  # its engine, driven through its step stages only
    problems: list[Any]
    ids: torch.Tensor
    mask: torch.Tensor
    ro: Rollout | None = None
    roll: dict[str, int] = field(default_factory=dict)
    executed: int = 0  # its share of the rollout FLOPs the gang executed (merged, padded; live LoRA: its own)
    rw: Any = None
    adv: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    batch: Rollout | None = None
    learn: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    upd: dict[str, float] = field(default_factory=dict)
    scored: Scored | None = None  # the member's scored rollout (StepMember.score)
    outcome: str = "ok"  # ok | overrun | diverged
    error: str | None = None


def gang_step(step: int, works: list[Work]) -> float:
    """Run step ``step`` for every member in ``works`` (module docstring); sets each
    ``outcome``. Returns the step's batched seconds (for the caller's wall split)."""
    models = [w.member.model for w in works]
    # 1. rollout, one batched decode (gang_rollout)
    jobs, args = [], [w.member.start_rollout(step) for w in works]
    for k, (w, a) in enumerate(zip(works, args)):
        jobs.append(SampleJob(k, w.ids, w.mask, a.group, a.temperature, a.generator, a.eos_id, a.pad_id))
    dev = works[0].member.device
    max_new = args[0].max_new_tokens  # one max_completion_length (members.SHARED)
    t0 = device_clock(dev)
    ros, fast = gang_rollout(models, jobs, max_new)
    t_roll = device_clock(dev) - t0
    for w, ro in zip(works, ros):
        w.ro = ro
        w.roll = w.member.rollout_charge(ro)
    costs = [w.member.policy_cost for w in works]
    if fast is not None:
        executed = fast.executed(costs[0].shape, [c.lora for c in costs], costs[0].conventions)
        shares = [int(e) for e in split_seconds(float(executed), [counted(w.roll) for w in works])]
        shares[-1] = executed - sum(shares[:-1])  # the shares add up to what executed
    else:  # each member's own rows, its solo rollout with live LoRA: what it is charged
        shares = [sum(executed_rollout_flops(c, ro).values()) for c, ro in zip(costs, ros)]
    for w, e in zip(works, shares):
        w.executed = e  # its share of what the gang's rollout executed (merged: split as the seconds are)
    for w, s in zip(works, split_seconds(t_roll, [counted(w.roll) for w in works])):
        w.seconds["rollout/decode"] = s
    # 2-3. each member's reward and advantages, then its exact-cost check
    for w in works:
        _score(step, w)
    learners = [w for w in works if w.outcome == "ok" and w.batch is not None]
    spent = _learn(step, learners)
    # 4. charge each member's ledger with what its solo step charges
    for w in works:
        if w.outcome == "ok":
            _charge(step, w)
    return t_roll + spent


def gang_rollout(models: list[Any], jobs: list[SampleJob], max_new_tokens: int
                 ) -> tuple[list[Rollout], FastRollout | None]:
    """Every job's rollout, in ``jobs`` order, and the merged decode that ran them (for what
    it executed), or None: the members' merged weights stacked in one decode
    (``gang.decode.fast_gang_sample``) where their base holds a folded adapter
    (``fast_decode.fold_keeps_update``: float32 or wider); on a bfloat16/float16 base, where
    a merge would round a small update away and the solo rollout runs the adapters live,
    ``gang.sample.gang_sample``: the members' live adapters over one shared base matmul,
    each member's rows executing its solo rollout's ops (and FLOPs)."""
    if all(fold_keeps_update(m) for m in models):  # one base: all members or none
        fast = fast_gang_sample(models, jobs, max_new_tokens)
        return fast.rollouts, fast
    return gang_sample(models, jobs, max_new_tokens), None


def _score(step: int, w: Work) -> None:
    """The member's reward, advantages, kept rows and exact-cost check, as its solo step."""
    assert w.ro is not None
    w.scored = sc = w.member.score(w.problems, w.ro, step)
    w.rw, w.adv, w.rows, w.batch, w.learn = sc.rw, sc.adv, sc.rows, sc.batch, sc.learn
    w.seconds[sc.reward_key] = sc.rw.seconds
    if not w.member.may_continue(step, w.roll, sc, w.seconds["rollout/decode"]):  # the bound was low: overrun
        w.outcome = "overrun"


def _learn(step: int, ws: list[Work]) -> float:
    """Old/reference log-probs and the updates of members ``ws``, batched; returns seconds."""
    if not ws:
        return 0.0
    models = [w.member.model for w in ws]
    idx = {id(w): k for k, w in enumerate(ws)}
    plans = {id(w): w.member.update_plan(w.batch) for w in ws}
    dev = ws[0].member.device
    secs: dict[str, float] = {}
    old: dict[int, torch.Tensor] = {}
    t0 = device_clock(dev)
    need = [w for w in ws if plans[id(w)].old]
    for w in need:
        w.member.model.eval()
    for w, lp in zip(need, gang_logprobs(models, [PassJob(idx[id(w)], w.batch, plans[id(w)].size,
                                                         plans[id(w)].temperature) for w in need])):
        old[id(w)] = lp
    secs["old_logprobs"] = device_clock(dev) - t0
    t0 = device_clock(dev)
    ref: dict[int, torch.Tensor] = {}
    need = [w for w in ws if plans[id(w)].ref]
    for w, lp in zip(need, gang_logprobs(models, [PassJob(None, w.batch, plans[id(w)].size,
                                                         plans[id(w)].temperature) for w in need])):
        ref[id(w)] = lp
    secs["reference"] = device_clock(dev) - t0
    t0 = device_clock(dev)
    for w in ws:
        w.upd["lr"] = w.member.start_update(step)  # (loss, clip_frac, kl go first once known: the solo row's order)
    ctx = _Update(models, idx, plans, old, ref, list(ws))
    for it in range(max(p.iterations for p in plans.values())):
        accs = {id(w): Accumulator() for w in ctx.live}
        for c in range(max(len(p.chunks) for p in plans.values())):
            cur = [w for w in ctx.live if it < plans[id(w)].iterations and c < len(plans[id(w)].chunks)]
            if cur:
                ctx.optimizer_step(step, cur, c, accs)
        for w in ctx.live:
            if it < plans[id(w)].iterations and len(plans[id(w)].chunks) > 1:
                ctx.stats[id(w)] = accs[id(w)].stats()
    stats = ctx.stats
    secs["update"] = device_clock(dev) - t0
    for w in ws:
        if w.outcome == "ok":
            st = stats[id(w)]
            w.upd = {"loss": st.loss, "clip_frac": st.clip_frac, "kl": st.kl, "lr": w.upd["lr"]}
    for phase in (p for p in PHASES if p in SPLIT["learning"]):  # old_logprobs, reference, update
        key = f"{phase}/forward"
        weights = [sum(v for k, v in w.learn.items() if k.startswith(phase + "/")) for w in ws]
        for w, s in zip(ws, split_seconds(secs[phase], weights)):
            w.seconds[key] = s
    return sum(secs.values())


@dataclass
class _Update:
    """The update stage of members batched together: their models, adapter indices,
    update plans (loss masks, optimizer steps' micro-batches: ``StepMember.update_plan``)
    and old/reference log-probs, by member; the members still live and their last loss
    statistics."""

    models: list[Any]
    idx: dict[int, int]
    plans: dict[int, UpdatePlan]
    old: dict[int, torch.Tensor]
    ref: dict[int, torch.Tensor]
    live: list[Work]
    stats: dict[int, Any] = field(default_factory=dict)

    def optimizer_step(self, step: int, cur: list[Work], c: int, accs: dict[int, Any]) -> None:
        """Optimizer step ``c`` of the current pass for members ``cur``, batched: their
        gradients over its micro-batches, each member's clipped and stepped by itself
        (``StepMember.optimizer_step``); a member whose loss is not finite leaves ``live``
        as diverged."""
        dev = cur[0].member.device
        for w in cur:
            w.member.zero_grad()
        jobs = []
        for w in cur:
            p = self.plans[id(w)]
            jobs.append(UpdateJob(self.idx[id(w)], w.batch, p.size, p.temperature, adv=w.adv[w.rows].to(dev),
                                  mask=p.mask, old=self.old.get(id(w)), ref=self.ref.get(id(w)),
                                  loss_kwargs=p.loss_kwargs, slices=p.chunks[c]))
        for w, res in zip(cur, gang_accumulate(self.models, jobs, grpo_loss, step)):
            if res.stats is None:
                w.outcome, w.error = "diverged", res.error
                self.live.remove(w)
                continue
            self.stats[id(w)] = res.stats
            p = self.plans[id(w)]
            rows = span(p.chunks[c])
            accs[id(w)].add(res.stats, 1.0 / len(p.chunks), float(p.mask[rows].sum()))
            w.member.optimizer_step()


def _charge(step: int, w: Work) -> None:
    """The solo engine's ledger charge and metrics row for member ``w`` (``StepMember.charge``)."""
    assert w.ro is not None and w.scored is not None
    if not w.member.charge(step, w.ro, w.roll, w.scored, w.upd, w.seconds.get("rollout/decode", 0.0), w.seconds,
                           named=True):
        w.outcome = "overrun"  # cannot happen after the exact check


__all__ = ["Work", "gang_rollout", "gang_step"]
