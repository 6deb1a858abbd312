"""`race flops` and `race plan`: per-phase FLOPs of a GRPO step and what a budget buys.

Library side of the commands (no Typer here): resolve shapes and reward systems from the
strings users type, and build the rows the CLI prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from race.accounting import (
    AccountingError,
    LoRA,
    ModelShape,
    PhaseFlops,
    RewardSystem,
    preset_names,
    split_shares,
    steps_in_budget,
    uniform_step_flops,
)
from race.accounting.shapes import preset_shape


def resolve_shape(spec: str) -> ModelShape:
    """A Qwen2.5 preset name, a tiny-family name, a config.json path or an HF model directory."""
    p = Path(spec)
    if p.exists():
        return ModelShape.from_hf_config(p)
    if spec.startswith("tiny-"):
        from race.models.family import TINY_FAMILY, tiny_config_kwargs  # torch-free

        if spec not in TINY_FAMILY:
            raise AccountingError(f"unknown tiny model {spec!r}; the family is {', '.join(TINY_FAMILY)}")
        return ModelShape.from_hf_config(dict(tiny_config_kwargs(spec), model_type="qwen2"), name=spec)
    try:
        return preset_shape(spec)
    except AccountingError:
        raise AccountingError(
            f"unknown model {spec!r}: use a preset ({', '.join(preset_names())}), a tiny-family name, "
            "a config.json path or a model directory"
        ) from None


def resolve_reward(spec: str) -> RewardSystem:
    """``rule``, ``random``, ``orm:MODEL``, ``prm:MODEL[:AGG]`` or ``judge:MODEL``."""
    kind, _, rest = spec.partition(":")
    if kind in ("rule", "random"):
        return RewardSystem(kind)  # type: ignore[arg-type]
    if kind not in ("orm", "prm", "judge") or not rest:
        raise AccountingError(f"--reward {spec!r}: use rule, random, orm:MODEL, prm:MODEL or judge:MODEL")
    model = rest.split(":", 1)[0] if kind == "prm" and not Path(rest).exists() else rest
    if kind in ("orm", "prm") and not Path(model).exists() and not model.startswith("qwen"):
        from race.rewards.training import RM_RECIPES, shape_of_rm  # RACE's own reward models (torch-free)

        if model in RM_RECIPES:
            return RewardSystem(kind, shape_of_rm(model), model)  # type: ignore[arg-type]
    shape = resolve_shape(model)
    if kind in ("orm", "prm") and shape.is_lm:
        # A reward model scores with a small head, not the vocabulary.
        from dataclasses import replace

        head = ((shape.hidden, 1),) if kind == "orm" else ((shape.hidden, 2),)
        shape = replace(shape, head=head, head_bias=False)
    return RewardSystem(kind, shape, model)  # type: ignore[arg-type]


@dataclass
class FlopsQuery:
    model: str
    lora_rank: int | None = None
    prompts: int = 16
    group: int = 8
    prompt_len: int = 64
    completion_len: int = 64
    iterations: int = 1
    beta: float = 0.0
    reward: str = "rule"
    reward_completion_len: int = 64
    conventions: str = "race"
    share_prompt: bool = False
    recompute: bool = False
    steps: int | None = None
    budget: float | None = None


def step_for(q: FlopsQuery) -> tuple[ModelShape, PhaseFlops]:
    shape = resolve_shape(q.model)
    lora = LoRA(q.lora_rank) if q.lora_rank else None
    reward = resolve_reward(q.reward)
    n = q.prompts * q.group
    kwargs: dict[str, Any] = {}
    if reward.kind == "judge":
        kwargs["judge_completion_lens"] = [q.reward_completion_len] * n
    if reward.kind == "prm":
        kwargs["reward_head_positions"] = "all"
    step = uniform_step_flops(shape, prompts=q.prompts, num_generations=q.group, prompt_len=q.prompt_len,
                              completion_len=q.completion_len, lora=lora, num_iterations=q.iterations,
                              beta=q.beta, reward=reward, share_prompt=q.share_prompt, recompute=q.recompute,
                              conventions=q.conventions, **kwargs)
    return shape, step


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
        "prompts": q.prompts, "num_generations": q.group, "prompt_len": q.prompt_len,
        "completion_len": q.completion_len, "num_iterations": q.iterations, "beta": q.beta, "reward": q.reward,
        "conventions": q.conventions, "conventions_text": resolve(q.conventions).describe(),
        "step": step.as_dict(), "step_components": dict(step.components), "shares": split_shares(step),
    }
    if steps is not None:
        out["steps"] = steps
        out["run"] = {k: v * steps for k, v in step.as_dict().items()}
        if q.budget is not None:
            out["budget"] = q.budget
    return out
