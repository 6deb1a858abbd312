"""FLOP estimates before anything runs: one GRPO step of a ``race flops`` query or of a
run spec, from ``race.accounting`` with shapes from ``race.models.refs`` and reward
systems from ``race.rewards.systems`` (all torch-free)."""

from __future__ import annotations

from typing import Any

from race.accounting import RULE, AccountingError, LoRA, ModelShape, PhaseFlops, RewardSystem, StepPlan, split_shares, \
    steps_in_budget, update_share
from race.models.refs import resolve_shape
from race.rewards.systems import reward_system
from race.spec.flops import FlopsQuery
from race.spec.run import RunConfig


def step_for(q: FlopsQuery) -> tuple[ModelShape, PhaseFlops]:
    """The model's shape and one step's per-phase FLOPs for query ``q``."""
    shape = resolve_shape(q.model)
    lora = LoRA(q.lora_rank) if q.lora_rank else None
    reward = reward_system(q.reward)
    n = q.prompts * q.group
    kwargs: dict[str, Any] = {}
    if reward.row.head == "decode":  # a generative judge writes its verdict
        kwargs["judge_completion_lens"] = [q.reward_completion_len] * n
    elif reward.row.planned_head:  # the kind's head rule at its bound (a PRM's markers: every position)
        kwargs["reward_head_positions"] = reward.row.planned_head
    plan = StepPlan(shape, q.group, lora=lora, num_iterations=q.iterations, beta=q.beta, reward=reward,
                    share_prompt=q.share_prompt, recompute=q.recompute, conventions=q.conventions,
                    update_generations=q.update_generations)
    return shape, plan.uniform(q.prompts, q.prompt_len, q.completion_len, **kwargs)


def flops_report(q: FlopsQuery) -> dict[str, Any]:
    """Per-phase FLOPs of one step and of the whole run (``steps`` or ``budget``)."""
    from race.accounting.conventions import resolve

    shape, step = step_for(q)
    if q.steps is not None and q.budget is not None:
        raise AccountingError("give --steps or --budget, not both")
    steps = q.steps
    if q.budget is not None:
        steps = steps_in_budget(q.budget, step.total)
    if steps is not None and steps < 1:
        raise AccountingError(f"--steps {steps}: must be >= 1")
    out: dict[str, Any] = {
        "model": shape.name, "params": shape.num_params(), "lora_rank": q.lora_rank,
        "prompts": q.prompts, "num_generations": q.group, "num_update_generations": q.update_generations or q.group,
        "prompt_len": q.prompt_len,
        "completion_len": q.completion_len, "num_iterations": q.iterations, "beta": q.beta, "reward": str(q.reward),
        "conventions": q.conventions, "conventions_text": resolve(q.conventions).describe(),
        "step": step.as_dict(), "step_components": dict(step.components), "shares": split_shares(step),
        **update_share(step),
    }
    if steps is not None:
        out["steps"] = steps
        out["run"] = {k: v * steps for k, v in step.as_dict().items()}
        if q.budget is not None:
            out["budget"] = q.budget
    return out


def run_lora(cfg: RunConfig) -> LoRA | None:
    """The accounting ``LoRA`` of a run's ``cfg.lora`` (its rank and target modules); None:
    full fine-tuning. The engines' policy and the dry run both take it from here."""
    return LoRA(cfg.lora.r, tuple(cfg.lora.target_modules)) if cfg.lora is not None else None


def run_step_plan(cfg: RunConfig, shape: ModelShape, *, engine: str | None = None, reward: RewardSystem = RULE,
                  share_learning: bool | None = None, recompute_early_stop: bool = True) -> StepPlan:
    """The :class:`StepPlan` of run ``cfg`` on a policy of ``shape``: the one constructor the
    built-in engine (its ledger and budget bound) and the dry run (:func:`run_step_flops`)
    use. From the config: group, the rollouts per prompt the update trains on
    (``num_update_generations``), LoRA (:func:`run_lora`), iterations, optimizer steps per
    generation (``steps_per_generation / gradient_accumulation_steps``), beta, old log-probs,
    gradient checkpointing (recompute, and the embedding output requiring grad, so a LoRA
    backward runs layer 0's q/k/v input gradients), conventions; the built-in engine
    (``engine``, default ``cfg.engine``) prefills each prompt once for its group
    (``share_prompt``), TRL does not.

    Two facts only a loaded model tells, which the dry run predicts: ``share_learning``,
    whether the learning passes share each prompt across its group, per micro-batch (the
    engine: ``fast_forward.supports(model)``; predicted: the built-in engine without
    gradient checkpointing, which is what it gives the Qwen2/Llama-style models), and
    ``recompute_early_stop`` (the engine: what ``enable_checkpointing`` reports; predicted:
    torch's default, on). ``reward``: the engine charges its reward model apart and leaves
    the rule default; the dry run passes ``reward_system(cfg.reward)`` for :meth:`StepPlan.step`."""
    builtin = (engine or cfg.engine) == "builtin"
    if share_learning is None:
        share_learning = builtin and not cfg.gradient_checkpointing
    return StepPlan(shape, cfg.num_generations, lora=run_lora(cfg), num_iterations=cfg.num_iterations, beta=cfg.beta,
                    optimizer_steps=cfg.optimizer_steps_per_generation, needs_old_logprobs=cfg.needs_old_logprobs,
                    update_generations=cfg.num_update_generations,
                    recompute=cfg.gradient_checkpointing,
                    recompute_early_stop=recompute_early_stop, inputs_require_grad=cfg.gradient_checkpointing,
                    share_prompt=builtin, micro_batch=cfg.micro_batch_size if share_learning else None,
                    reward=reward, conventions=cfg.conventions)


def run_step_flops(cfg: RunConfig, shape: ModelShape | None = None) -> PhaseFlops:
    """One step of run ``cfg`` at its upper bound (:func:`run_step_plan`): every sequence at
    ``max_prompt_length + max_completion_length``, a judge writing ``max_completion_length``
    tokens per verdict; the learning passes over ``num_update_generations`` sequences per
    prompt where it is set. The built-in engine shares each prompt across its group in the
    rollout and, without gradient checkpointing, in the learning passes too (for the
    Qwen2/Llama-style models its functional forward runs; another architecture runs
    unshared and costs more). ``shape``: the policy's, when the caller resolved it (default
    :func:`race.models.refs.resolve_shape` of ``cfg.model``)."""
    reward = reward_system(cfg.reward)
    judge = reward.row.head == "decode"
    n = cfg.prompts_per_step * cfg.num_generations
    plan = run_step_plan(cfg, shape or resolve_shape(cfg.model), reward=reward)
    return plan.step([cfg.max_prompt_length] * n, [cfg.max_completion_length] * n,
                     judge_completion_lens=[cfg.max_completion_length] * n if judge else None)


__all__ = ["flops_report", "run_lora", "run_step_flops", "run_step_plan", "step_for"]
