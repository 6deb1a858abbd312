"""One gang step: the built-in engine's ``_train_step`` for every participating member,
with the rollout, the log-prob passes and the update batched across them.

Per member, the stages and what they charge are the solo engine's, in its order
(``race.engines.builtin.BuiltinEngine._train_step``): rollout (its prompts, group,
temperature, generator seeded from (seed, step)) -> its reward -> advantages (zero-variance
groups dropped) -> the exact-cost budget check (a member that cannot take its step
records the rollout and reward as ``overrun`` and leaves) -> old/reference log-probs ->
``num_iterations`` passes of ``steps_per_generation / gradient_accumulation_steps`` clipped
optimizer steps each (its lr, loss, micro-batches; its gradients clipped and its optimizer
stepped alone) -> its ledger charged with the solo run's components (the
same functions, over its own rows), its metrics row.

Seconds: a batched stage's wall seconds are split among the members that ran in it in
proportion to the FLOPs it charges each (``members.split_seconds``); the reward is each
member's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from race.accounting import PHASES, SPLIT, counted
from race.engines.gang.members import split_seconds
from race.engines.gang.passes import PassJob, UpdateJob, gang_accumulate, gang_logprobs
from race.engines.gang.decode import fast_gang_sample
from race.engines.gang.sample import SampleJob
from race.engines.builtin.micro_batch import Accumulator, optimizer_steps, span
from race.engines.builtin.step_parts import Scored, charge_step, fits_exactly, score_rollout
from race.engines.grpo_math import grpo_loss
from race.engines.sampling import Rollout, rollout_flops, sampling_generator
from race.models.timing import device_clock


@dataclass
class Work:
    """A member's state through one gang step."""

    index: int  # the member's index in the gang (its adapter)
    eng: Any  # its BuiltinEngine
    problems: list[Any]
    ids: torch.Tensor
    mask: torch.Tensor
    ro: Rollout | None = None
    roll: dict[str, int] = field(default_factory=dict)
    executed: int = 0  # its share of the rollout FLOPs the gang executed (merged, padded)
    rw: Any = None
    adv: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    batch: Rollout | None = None
    learn: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    upd: dict[str, float] = field(default_factory=dict)
    scored: Scored | None = None  # the member's scored rollout (step_parts.score_rollout)
    outcome: str = "ok"  # ok | overrun | diverged
    error: str | None = None


def gang_step(step: int, works: list[Work]) -> float:
    """Run step ``step`` for every member in ``works`` (module docstring); sets each
    ``outcome``. Returns the step's batched seconds (for the caller's wall split)."""
    models = [w.eng.state.model for w in works]
    # 1. rollout, one batched decode
    jobs = []
    for k, w in enumerate(works):
        cfg = w.eng.cfg
        gen = sampling_generator(cfg.seed, step)
        w.eng.state.model.eval()
        jobs.append(SampleJob(k, w.ids, w.mask, cfg.num_generations, cfg.temperature, gen,
                              w.eng.state.tok.eos_token_id, w.eng.state.tok.pad_token_id))
    t0 = device_clock(works[0].eng.state.device)
    fast = fast_gang_sample(models, jobs, works[0].eng.cfg.max_completion_length)
    t_roll = device_clock(works[0].eng.state.device) - t0
    for w, ro in zip(works, fast.rollouts):
        cfg, eng = w.eng.cfg, w.eng
        w.ro = ro
        w.roll = {f"rollout/{k}": v for k, v in rollout_flops(eng.state.step_plan.policy, ro).items()}
    executed = fast.executed(works[0].eng.state.shape, [w.eng.state.lora for w in works], works[0].eng.cfg.conventions)
    shares = [int(e) for e in split_seconds(float(executed), [counted(w.roll) for w in works])]
    shares[-1] = executed - sum(shares[:-1])  # the shares add up to what executed
    for w, e in zip(works, shares):
        w.executed = e  # its share of what the gang's rollout executed (split as the seconds are)
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


def _score(step: int, w: Work) -> None:
    """The member's reward, advantages, kept rows and exact-cost check, as its solo step
    (``race.engines.builtin.step_parts``)."""
    assert w.ro is not None
    w.scored = sc = score_rollout(w.eng, w.problems, w.ro)
    w.rw, w.adv, w.rows, w.batch, w.learn = sc.rw, sc.adv, sc.rows, sc.batch, sc.learn
    w.seconds[sc.reward_key] = sc.rw.seconds
    if not fits_exactly(w.eng, step, w.roll, sc, w.seconds["rollout/decode"]):  # the bound was low: overrun
        w.outcome = "overrun"


def _learn(step: int, ws: list[Work]) -> float:
    """Old/reference log-probs and the updates of members ``ws``, batched; returns seconds."""
    if not ws:
        return 0.0
    models = [w.eng.state.model for w in ws]
    idx = {id(w): k for k, w in enumerate(ws)}
    masks = {}
    for w in ws:
        m = w.batch.completion_mask.clone()
        if w.eng.cfg.mask_truncated_completions:
            m[w.batch.truncated] = 0
        masks[id(w)] = m
    dev = ws[0].eng.state.device
    secs: dict[str, float] = {}
    old: dict[int, torch.Tensor] = {}
    t0 = device_clock(dev)
    need = [w for w in ws if w.eng.cfg.needs_old_logprobs]
    for w in need:
        w.eng.state.model.eval()
    for w, lp in zip(need, gang_logprobs(models, [PassJob(idx[id(w)], w.batch, w.eng.cfg.micro_batch_size,
                                                         w.eng.cfg.temperature) for w in need])):
        old[id(w)] = lp
    secs["old_logprobs"] = device_clock(dev) - t0
    t0 = device_clock(dev)
    ref: dict[int, torch.Tensor] = {}
    need = [w for w in ws if w.eng.cfg.beta != 0]
    for w, lp in zip(need, gang_logprobs(models, [PassJob(None, w.batch, w.eng.cfg.micro_batch_size,
                                                         w.eng.cfg.temperature) for w in need])):
        ref[id(w)] = lp
    secs["reference"] = device_clock(dev) - t0
    t0 = device_clock(dev)
    for w in ws:
        lr = w.eng.lr(step)
        for g in w.eng.state.optimizer.param_groups:
            g["lr"] = lr
        w.upd["lr"] = lr  # (loss, clip_frac, kl go first once known: the solo row's order)
        w.eng.state.model.train()
    ctx = _Update(models, idx, masks, old, ref, {id(w): optimizer_steps(
        w.batch.prompt_ids.shape[0], w.eng.cfg.micro_batch_size, w.eng.cfg.accumulation_steps) for w in ws}, list(ws))
    for it in range(max(w.eng.cfg.num_iterations for w in ws)):
        accs = {id(w): Accumulator() for w in ctx.live}
        for c in range(max(len(ctx.chunks[id(w)]) for w in ws)):
            cur = [w for w in ctx.live if it < w.eng.cfg.num_iterations and c < len(ctx.chunks[id(w)])]
            if cur:
                ctx.optimizer_step(step, cur, c, accs)
        for w in ctx.live:
            if it < w.eng.cfg.num_iterations and len(ctx.chunks[id(w)]) > 1:
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
    """The update stage of members batched together: their models, adapter indices, loss
    masks, old/reference log-probs and optimizer steps (``micro_batch.optimizer_steps``),
    by member; the members still live and their last loss statistics."""

    models: list[Any]
    idx: dict[int, int]
    masks: dict[int, torch.Tensor]
    old: dict[int, torch.Tensor]
    ref: dict[int, torch.Tensor]
    chunks: dict[int, list[list[slice]]]
    live: list[Work]
    stats: dict[int, Any] = field(default_factory=dict)

    def optimizer_step(self, step: int, cur: list[Work], c: int, accs: dict[int, Any]) -> None:
        """Optimizer step ``c`` of the current pass for members ``cur``, batched: their
        gradients over its micro-batches, each clipped and stepped alone; a member whose
        loss is not finite leaves ``live`` as diverged."""
        dev = cur[0].eng.state.device
        for w in cur:
            w.eng.state.optimizer.zero_grad(set_to_none=True)
        jobs = []
        for w in cur:
            cfg = w.eng.cfg
            kw = dict(epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, loss_type=cfg.loss_type,
                      max_completion_length=cfg.max_completion_length, beta=cfg.beta,
                      sapo_temperatures=(cfg.sapo_temperature_pos, cfg.sapo_temperature_neg))
            jobs.append(UpdateJob(self.idx[id(w)], w.batch, cfg.micro_batch_size, cfg.temperature,
                                  adv=w.adv[w.rows].to(dev), mask=self.masks[id(w)], old=self.old.get(id(w)),
                                  ref=self.ref.get(id(w)), loss_kwargs=kw, slices=self.chunks[id(w)][c]))
        for w, res in zip(cur, gang_accumulate(self.models, jobs, grpo_loss, step)):
            if res.stats is None:
                w.outcome, w.error = "diverged", res.error
                self.live.remove(w)
                continue
            self.stats[id(w)] = res.stats
            rows = span(self.chunks[id(w)][c])
            accs[id(w)].add(res.stats, 1.0 / len(self.chunks[id(w)]), float(self.masks[id(w)][rows].sum()))
            torch.nn.utils.clip_grad_norm_([p for p in w.eng.state.model.parameters() if p.requires_grad],
                                           w.eng.cfg.max_grad_norm)
            w.eng.state.optimizer.step()


def _charge(step: int, w: Work) -> None:
    """The solo engine's ledger charge and metrics row for member ``w`` (``step_parts.charge_step``)."""
    assert w.ro is not None and w.scored is not None
    if not charge_step(w.eng, step, w.ro, w.roll, w.scored, w.upd, w.seconds.get("rollout/decode", 0.0),
                       w.seconds, progress_extra={"run": w.eng.cfg.name}):
        w.outcome = "overrun"  # cannot happen after the exact check


__all__ = ["Work", "gang_step"]
