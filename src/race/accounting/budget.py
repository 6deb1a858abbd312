"""Budget arithmetic: which allocations fit a budget, and how a step's FLOPs split.

The steps a budget buys are ``race.accounting.guard``'s (:func:`steps_in_budget`, re-exported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .conventions import resolve
from .grpo import SPLIT, PhaseFlops, RewardSystem, RULE
from .guard import StepPlan, steps_bought, steps_in_budget
from .lora import LoRA
from .shapes import ModelShape


def split_shares(phases: PhaseFlops) -> dict[str, float]:
    """Shares of a step's model FLOPs: search (rollout), learning (update + log-prob passes),
    feedback (reward)."""
    tot = phases.total or 1
    return {axis: sum(getattr(phases, p) for p in ps) / tot for axis, ps in SPLIT.items()}


def update_share(phases: PhaseFlops) -> dict[str, float]:
    """The update share of a step's model FLOPs (docs/update-share.md): ``p = learning /
    (search + learning + feedback)`` and ``p_policy = learning / (search + learning)`` (the
    reward model's share left out); 0 where nothing is counted."""
    s = {axis: sum(getattr(phases, p) for p in ps) for axis, ps in SPLIT.items()}
    total, policy = sum(s.values()), s["search"] + s["learning"]
    return {"p": s["learning"] / total if total else 0.0, "p_policy": s["learning"] / policy if policy else 0.0}


@dataclass(frozen=True)
class Allocation:
    """One way to spend a budget, with the step it buys."""

    model: str
    params: int
    num_generations: int
    reward: str
    step: PhaseFlops
    steps: int
    prompts: int = 0  # prompts per step (0: not recorded)
    num_iterations: int = 1  # passes over each generation batch
    steps_per_generation: int = 1  # optimizer steps per pass (TRL's steps_per_generation at one micro-batch each)
    num_update_generations: int | None = None  # rollouts per prompt the update trains on (None: all)

    @property
    def sequences(self) -> int:
        """Sequences (completions) per step: prompts x group size."""
        return self.prompts * self.num_generations

    @property
    def total(self) -> int:
        return self.step.total * self.steps

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps the budget buys: generation steps x iterations x steps per generation."""
        return self.steps * self.num_iterations * self.steps_per_generation

    def row(self) -> dict[str, object]:
        s = split_shares(self.step)
        return {"model": self.model, "params": self.params, "num_generations": self.num_generations,
                "reward": self.reward, "prompts": self.prompts, "sequences": self.sequences,
                "num_iterations": self.num_iterations, "steps_per_generation": self.steps_per_generation,
                "num_update_generations": self.num_update_generations or self.num_generations,
                "step_flops": self.step.total, "steps": self.steps, "optimizer_steps": self.optimizer_steps,
                "total_flops": self.total, "search": s["search"], "learning": s["learning"],
                "feedback": s["feedback"], **update_share(self.step)}


def allocations(budget: float, plans: Sequence[StepPlan], *, prompts_per_step: int, prompt_len: int,
                completion_len: int, group_tokens_fixed: bool = True,
                unaffordable: list[Allocation] | None = None) -> list[Allocation]:
    """Every allocation of ``plans`` (each a model x group size x reward with its settings:
    iterations, optimizer steps per generation and the rollouts the update trains on move
    the learning share at equal FLOPs)
    that affords at least one step at ``prompt_len`` + ``completion_len`` tokens, sorted by
    steps bought (most first; ties by parameters, then in the order given). With
    ``group_tokens_fixed`` the number of sequences per step is held at
    ``prompts_per_step * max(G)`` so that a larger group means fewer prompts (search vs
    learning at a fixed rollout count: the step's FLOPs, and so the steps bought, barely
    change with G); otherwise prompts stay fixed and a larger group costs more per step.
    Allocations that cannot afford one step are left out; pass a list as ``unaffordable``
    to receive them (with ``steps=0``)."""
    out: list[Allocation] = []
    gmax = max((p.num_generations for p in plans), default=1)
    for plan in plans:
        g, shape = plan.num_generations, plan.shape
        prompts = max(1, prompts_per_step * gmax // g) if group_tokens_fixed else prompts_per_step
        step = plan.uniform(prompts, prompt_len, completion_len)
        alloc = Allocation(shape.name, shape.num_params(), g, plan.reward.label(), step,
                           steps_bought(budget, step.total), prompts, plan.num_iterations, plan.optimizer_steps,
                           plan.update_generations)
        if alloc.steps < 1:  # not even one step
            if unaffordable is not None:
                unaffordable.append(alloc)
            continue
        out.append(alloc)
    out.sort(key=lambda a: (-a.steps, a.params))
    return out


def plan_allocations(budget: float, models: Sequence[ModelShape], groups: Sequence[int],
                     rewards: Sequence[RewardSystem] = (RULE,), *, prompts_per_step: int, prompt_len: int,
                     completion_len: int, group_tokens_fixed: bool = True, lora: LoRA | None = None,
                     num_iterations: int = 1, beta: float = 0.0, conventions=None,
                     unaffordable: list[Allocation] | None = None) -> list[Allocation]:
    """:func:`allocations` of every model x group size x reward with the settings as keywords
    (the exported form): builds the :class:`StepPlan` of each and calls it."""
    conv = resolve(conventions)
    plans = [StepPlan(shape, g, lora=lora, num_iterations=num_iterations, beta=beta, reward=rw, conventions=conv)
             for shape in models for g in groups for rw in rewards]
    return allocations(budget, plans, prompts_per_step=prompts_per_step, prompt_len=prompt_len,
                       completion_len=completion_len, group_tokens_fixed=group_tokens_fixed,
                       unaffordable=unaffordable)


__all__ = ["Allocation", "allocations", "plan_allocations", "split_shares", "steps_in_budget", "update_share"]
