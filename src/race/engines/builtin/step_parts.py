"""The parts of one GRPO step that the built-in engine and the gang runner share: scoring a
rollout (rewards, group advantages, the rows kept and their learning FLOPs), the exact-cost
check before the update, and the ledger charge with the step's metrics row. The solo loop
(``BuiltinEngine._train_step``) and the gang (``race.engines.gang.step``) differ in how they
run the rollout and the update (alone or batched over members); what a step charges and
logs is decided here once, so a member's ledger and metrics equal its solo run's.

Each function takes the member's engine and reads its public parts only (``cfg``,
``state``, ``books``, ``progress``, ``select_rows``, ``learning_flops``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from race.engines.grpo_math import group_advantages
from race.engines.sampling import Rollout, decode_completions, step_charge

#: The learning passes' seconds keys, in the order a step's ledger records them.
LEARNING_SECONDS = ("old_logprobs/forward", "reference/forward", "update/forward")


@dataclass
class Scored:
    """A rollout scored: the reward result, its rewards and group advantages, which groups
    carry signal, the rows kept for learning, that batch and its learning FLOPs."""

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


def score_rollout(eng: Any, problems: list[Any], ro: Rollout) -> Scored:
    """Score ``ro`` (each problem repeated ``G`` times), its group advantages; with
    ``drop_zero_variance_groups`` only the groups whose rewards differ are kept; the kept
    rows' batch and its learning FLOPs (none when no row is kept)."""
    cfg, st = eng.cfg, eng.state
    G = cfg.num_generations
    texts = decode_completions(st.tok, ro)
    rw = st.reward.score([p for p in problems for _ in range(G)], texts)
    rewards = torch.tensor(rw.rewards, dtype=torch.float32)
    adv, zero_var = group_advantages(rewards, G, scale=cfg.scale_rewards)
    keep = (~zero_var) if cfg.drop_zero_variance_groups else torch.ones_like(zero_var)
    rows = keep.repeat_interleave(G).nonzero().squeeze(1)
    n_kept = int(rows.numel())
    batch = eng.select_rows(ro, rows) if n_kept else None
    learn = eng.learning_flops(batch.prompt_ids.shape[1], batch.completion_ids.shape[1], n_kept) if batch is not None else {}
    return Scored(rw, rewards, adv, zero_var, rows, batch, learn)


def fits_exactly(eng: Any, step: int, roll: dict[str, int], sc: Scored, t_roll: float) -> bool:
    """The guard's exact check before the update (``may_continue``): False when the step's
    exact cost does not fit (what ran is then recorded as overrun and nothing is charged)."""
    ran = {**roll, **(sc.rw.components or {})}
    return eng.books.guard.may_continue(step, ran, sc.learn,
                                        seconds={"rollout/decode": t_roll, sc.reward_key: sc.rw.seconds})


def charge_step(eng: Any, step: int, ro: Rollout, roll: dict[str, int], sc: Scored, upd: dict[str, float],
                t_roll: float, learning_seconds: dict[str, float], progress_extra: dict[str, Any] | None = None) -> bool:
    """Charge the step to the ledger (what executed: :func:`race.engines.sampling.step_charge`)
    and append its metrics row; False when the charge overran (cannot happen after
    :func:`fits_exactly`). ``upd``: the update's statistics (keys ``seconds_*`` are left out
    of the row); ``learning_seconds``: seconds per :data:`LEARNING_SECONDS` key."""
    cfg, books, rw = eng.cfg, eng.books, sc.rw
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
           **{k: v for k, v in upd.items() if not k.startswith("seconds_")}, **rw.extra}
    books.metrics.append([row])
    if eng.progress:
        eng.progress({"step": step, "flops": books.ledger.total, "budget": cfg.budget_flops, **(progress_extra or {}),
                      **row})
    return True


__all__ = ["LEARNING_SECONDS", "Scored", "charge_step", "fits_exactly", "score_rollout"]
