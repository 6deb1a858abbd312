"""One run's stages of a GRPO step, as methods the built-in engine has (:class:`StepStages`):
what the solo loop (``BuiltinEngine._train_step``) and a batched step over several runs
(the gang's, ``race.engines.gang.step``) share. They differ in how they run the numerical
passes (the rollout's decode, the log-prob passes, the gradients: alone or batched over
members); everything that is one run's own (its sampling arguments, its reward and
advantages, the exact-cost check, what its learning passes run, its optimizer step, its
ledger charge and metrics row) is decided here once, so a member's ledger and metrics
equal its solo run's. :class:`StepStages` is what ``race.engines.StepMember`` declares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from race.engines.builtin import micro_batch
from race.engines.grpo_math import group_advantages, lr_at
from race.engines.selection import update_rows
from race.engines.sampling import (
    Rollout,
    SampleArgs,
    decode_completions,
    rollout_flops,
    sampling_generator,
    step_charge,
)

if TYPE_CHECKING:
    from race.accounting import PolicyCost
    from race.engines.builtin.state import BuiltinState, RunBooks
    from race.engines.common import Progress
    from race.spec.run import RunConfig

#: The learning passes' seconds keys, in the order a step's ledger records them.
LEARNING_SECONDS = ("old_logprobs/forward", "reference/forward", "update/forward")


@dataclass
class Scored:
    """A rollout scored: the reward result, its rewards (every rollout's) and advantages
    (one per rollout: the update's rows carry theirs, relative to the rollouts of their
    prompt the update trains on; the others 0), which prompts' update groups carry signal,
    the rows kept for learning, that batch and its learning FLOPs."""

    rw: Any
    rewards: torch.Tensor
    adv: torch.Tensor
    zero_var: torch.Tensor
    rows: torch.Tensor
    batch: Rollout | None
    learn: dict[str, int]

    @property
    def reward_key(self) -> str:
        """The ledger key the reward's seconds go to (its first component, else ``reward/score``)."""
        return next(iter(self.rw.components), "reward/score")


@dataclass(frozen=True)
class UpdatePlan:
    """What one run's learning passes run over its kept batch, from its config: the loss
    mask (completion tokens; truncated completions masked out with
    ``mask_truncated_completions``), the micro-batch size and temperature of every pass,
    whether the old-policy (``needs_old_logprobs``) and reference (``beta != 0``) passes
    run, the update's passes (``num_iterations``), each pass's optimizer steps as lists of
    micro-batch slices (``micro_batch.optimizer_steps``) and ``grpo_loss``'s keywords."""

    mask: torch.Tensor
    size: int
    temperature: float
    old: bool
    ref: bool
    iterations: int
    chunks: list[list[slice]]
    loss_kwargs: dict[str, Any]


class StepStages:
    """One run's step stages (module docstring), on the engine that holds the run's config,
    state and books; each reads its own run only."""

    cfg: RunConfig
    state: BuiltinState
    books: RunBooks
    progress: Progress | None

    # -- rollout ------------------------------------------------------------------------
    def start_rollout(self, step: int) -> SampleArgs:
        """The policy in sampling (eval) mode; step ``step``'s sampling arguments (its
        generator seeded from (seed, step): ``sampling_generator``)."""
        cfg, st = self.cfg, self.state
        gen = sampling_generator(cfg.seed, step)
        st.model.eval()
        return SampleArgs(group=cfg.num_generations, max_new_tokens=cfg.max_completion_length,
                          eos_id=st.tok.eos_token_id, pad_id=st.tok.pad_token_id, temperature=cfg.temperature,
                          generator=gen)

    def rollout_charge(self, ro: Rollout) -> dict[str, int]:
        """What the run's ledger charges for rollout ``ro`` (``rollout/<component>`` keys)."""
        return {f"rollout/{k}": v for k, v in rollout_flops(self.state.step_plan.policy, ro).items()}

    @property
    def policy_cost(self) -> PolicyCost:
        """The policy as the FLOP rules see it (shape, adapter, conventions)."""
        return self.state.step_plan.policy

    @property
    def device(self) -> Any:
        """Where the policy lives (the device clock of the step's stages)."""
        return self.state.device

    # -- reward and the exact check -------------------------------------------------------
    def score(self, problems: list[Any], ro: Rollout, step: int) -> Scored:
        """Score ``ro`` (each problem repeated ``G = num_generations`` times); choose the
        ``m = num_update_generations`` rollouts of each prompt the update trains on
        (``update_selection``, from every rollout's reward: ``race.engines.selection``; all G
        when unset) and compute their group advantages among themselves; with
        ``drop_zero_variance_groups`` only the prompts whose chosen rewards differ are kept;
        the kept rows' batch and its learning FLOPs (none when no row is kept)."""
        cfg, st = self.cfg, self.state
        G, m = cfg.num_generations, cfg.update_generations
        texts = decode_completions(st.tok, ro)
        rw = st.reward.score([p for p in problems for _ in range(G)], texts)
        rewards = torch.tensor(rw.rewards, dtype=torch.float32)
        chosen = update_rows(rewards, G, m, cfg.update_selection, cfg.seed, step)
        sub_adv, zero_var = group_advantages(rewards[chosen], m, scale=cfg.scale_rewards)
        adv = torch.zeros_like(rewards).index_copy_(0, chosen, sub_adv)
        keep = (~zero_var) if cfg.drop_zero_variance_groups else torch.ones_like(zero_var)
        rows = chosen[keep.repeat_interleave(m)]
        n_kept = int(rows.numel())
        batch = select_rows(ro, rows, m) if n_kept else None
        learn = self.learning_flops(batch.prompt_ids.shape[1], batch.completion_ids.shape[1], n_kept) \
            if batch is not None else {}
        return Scored(rw, rewards, adv, zero_var, rows, batch, learn)

    def learning_flops(self, prompt_len: int, completion_len: int, n: int) -> dict[str, int]:
        """The learning passes over ``n`` rows (whole groups) padded to ``prompt_len`` +
        ``completion_len``, prompts shared per group and micro-batch where the engine does."""
        return self.state.step_plan.learning([prompt_len + completion_len] * n, [completion_len] * n)

    def may_continue(self, step: int, roll: dict[str, int], sc: Scored, t_roll: float) -> bool:
        """The guard's exact check before the update (``may_continue``): False when the step's
        exact cost does not fit (what ran is then recorded as overrun and nothing is charged)."""
        ran = {**roll, **(sc.rw.components or {})}
        return self.books.guard.may_continue(step, ran, sc.learn,
                                             seconds={"rollout/decode": t_roll, sc.reward_key: sc.rw.seconds})

    # -- learning -------------------------------------------------------------------------
    def update_plan(self, batch: Rollout) -> UpdatePlan:
        """What the learning passes run over ``batch`` (:class:`UpdatePlan`)."""
        cfg = self.cfg
        mask = batch.completion_mask.clone()
        if cfg.mask_truncated_completions:
            mask[batch.truncated] = 0
        kw = dict(epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, loss_type=cfg.loss_type,
                  max_completion_length=cfg.max_completion_length, beta=cfg.beta,
                  sapo_temperatures=(cfg.sapo_temperature_pos, cfg.sapo_temperature_neg))
        chunks = micro_batch.optimizer_steps(batch.prompt_ids.shape[0], cfg.micro_batch_size, cfg.accumulation_steps)
        return UpdatePlan(mask, cfg.micro_batch_size, cfg.temperature, cfg.needs_old_logprobs, cfg.beta != 0,
                          cfg.num_iterations, chunks, kw)

    def start_update(self, step: int) -> float:
        """The optimizer's lr set to step ``step``'s (the run's schedule), the policy in
        training mode; returns the lr."""
        lr = self.lr(step)
        for g in self.state.optimizer.param_groups:
            g["lr"] = lr
        self.state.model.train()
        return lr

    def lr(self, step: int) -> float:
        """Step ``step``'s learning rate on the run's schedule (its length: the books')."""
        cfg = self.cfg
        return lr_at(step, base_lr=cfg.learning_rate, schedule=cfg.lr_scheduler_type, warmup_steps=cfg.warmup_steps,
                     total_steps=self.books.total_steps)

    def zero_grad(self) -> None:
        """The policy's gradients cleared, before an optimizer step's micro-batches."""
        self.state.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self) -> None:
        """After an optimizer step's gradients: clip them at ``max_grad_norm``, step."""
        st = self.state
        torch.nn.utils.clip_grad_norm_([p for p in st.model.parameters() if p.requires_grad], self.cfg.max_grad_norm)
        st.optimizer.step()

    # -- the ledger ---------------------------------------------------------------------------
    def charge(self, step: int, ro: Rollout, roll: dict[str, int], sc: Scored, upd: dict[str, float], t_roll: float,
               learning_seconds: dict[str, float], named: bool = False) -> bool:
        """Charge the step to the ledger (what executed: :func:`race.engines.sampling.step_charge`)
        and append its metrics row; False when the charge overran (cannot happen after
        :meth:`may_continue`). ``upd``: the update's statistics (keys ``seconds_*`` are left
        out of the row); ``learning_seconds``: seconds per :data:`LEARNING_SECONDS` key; ``named``: the
        progress event carries the run's name (several runs report through one callback)."""
        cfg, books, rw = self.cfg, self.books, sc.rw
        seconds = {"rollout/prefill": 0.0, "rollout/decode": t_roll, sc.reward_key: rw.seconds,
                   **{k: learning_seconds.get(k, 0.0) for k in LEARNING_SECONDS}}
        comps, tokens = step_charge(roll, rw, sc.learn, ro, cfg.num_generations)
        if books.guard.charge(step, comps, tokens=tokens, seconds=seconds):
            return False
        rewards = sc.rewards
        row = {"kind": "train", "step": step, "flops": books.ledger.total, "reward_mean": float(rewards.mean()),
               "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
               "verified_mean": sum(rw.verified) / max(1, len(rw.verified)),
               "zero_var_frac": float(sc.zero_var.float().mean()), "trunc_rate": float(ro.truncated.float().mean()),
               "completion_len": float(ro.lengths.float().mean()), "kept_sequences": int(sc.rows.numel()),
               **self.selection_metrics(sc), **{k: v for k, v in upd.items() if not k.startswith("seconds_")},
               **rw.extra}
        books.metrics.append([row])
        if self.progress:
            self.progress({"step": step, "flops": books.ledger.total, "budget": cfg.budget_flops,
                           **({"run": cfg.name} if named else {}), **row})
        return True

    def selection_metrics(self, sc: Scored) -> dict[str, float]:
        """With ``num_update_generations`` below ``num_generations``: the mean and std of the
        rewards the update trained on (``reward_mean``/``reward_std`` are every rollout's);
        otherwise nothing (the metrics rows of runs without the setting are unchanged)."""
        if self.cfg.update_generations == self.cfg.num_generations:
            return {}
        r = sc.rewards[sc.rows]
        return {"update_reward_mean": float(r.mean()) if len(r) else 0.0,
                "update_reward_std": float(r.std()) if len(r) > 1 else 0.0}


def select_rows(ro: Rollout, rows: torch.Tensor, group: int | None = None) -> Rollout:
    """Keep ``rows`` of ``ro`` (whole groups of ``group`` rows per prompt, default
    ``ro.group``) and trim padding columns no kept row uses (what the update runs on)."""
    pm, cm = ro.prompt_mask[rows], ro.completion_mask[rows]
    first = int(pm.any(0).long().argmax())
    T = int(cm.sum(1).max())
    return Rollout(prompt_ids=ro.prompt_ids[rows][:, first:], prompt_mask=pm[:, first:],
                   completion_ids=ro.completion_ids[rows][:, :T], completion_mask=cm[:, :T],
                   truncated=ro.truncated[rows], n_prompts=len(rows) // (group or ro.group), group=group or ro.group)


__all__ = ["LEARNING_SECONDS", "Scored", "StepStages", "UpdatePlan", "select_rows"]
