"""The ``race flops`` query: one GRPO step (and optionally a whole run) to account,
validated like a run file. Settings come from ``race flops -c FILE`` and the command's
flags; a file may use the run file's TRL names (``num_generations``,
``max_prompt_length``, ``max_completion_length``, ``num_iterations``, ``budget_flops``,
``prompts_per_step``, ``lora.r``) or the command's own, and a whole run file is a query
too (its step as that run would take it: the built-in engine shares each prompt's prefill
across its group, ``gradient_checkpointing`` is recompute)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

from race.accounting.errors import did_you_mean
from race.spec.errors import SETTING_ALIASES, ConfigError, format_errors
from race.spec.reward import parse_reward
from race.spec.run import BudgetField, RewardField, RunConfig, run_config_from_dict

#: Longest sequence accounted (Qwen2.5's longest context, 128k tokens).
MAX_TOKENS = 131_072


def _alias(*names: str) -> Any:
    return AliasChoices(*names)


class FlopsQuery(BaseModel):
    """Per-phase FLOPs of one step (``race.estimate.flops_report``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: str = Field(..., min_length=1, description="preset, tiny-family name, config.json or model directory")
    lora_rank: int | None = Field(None, ge=1, validation_alias=_alias("lora_rank", "r"),
                                  description="LoRA rank (omit for full fine-tuning)")
    prompts: int = Field(16, ge=1, validation_alias=_alias("prompts", "prompts_per_step"))
    group: int = Field(8, ge=2, validation_alias=_alias("group", "num_generations"),
                       description="group size G (GRPO needs >= 2): rollouts per prompt")
    update_generations: int | None = Field(
        None, ge=2, validation_alias=_alias("update_generations", "num_update_generations"),
        description="rollouts per prompt the update trains on (PODS's m <= G; omit for all G)")
    prompt_len: int = Field(64, ge=1, le=MAX_TOKENS, validation_alias=_alias("prompt_len", "max_prompt_length"))
    completion_len: int = Field(64, ge=1, le=MAX_TOKENS,
                                validation_alias=_alias("completion_len", "max_completion_length"))
    iterations: int = Field(1, ge=1, validation_alias=_alias("iterations", "num_iterations"))
    beta: float = Field(0.0, ge=0, allow_inf_nan=False)
    reward: RewardField = Field(default_factory=lambda: parse_reward("rule"))
    reward_completion_len: int = Field(64, ge=1, le=MAX_TOKENS)
    conventions: str = "race"
    share_prompt: bool = False
    recompute: bool = Field(False, validation_alias=_alias("recompute", "gradient_checkpointing"))
    steps: int | None = Field(None, ge=1)
    budget: BudgetField | None = Field(None, validation_alias=_alias("budget", "budget_flops"))

    @model_validator(mode="before")
    @classmethod
    def _lora_section(cls, data: Any) -> Any:
        """``lora: {r: 16}`` as in a run file; ``lora: null`` is full fine-tuning."""
        if isinstance(data, dict) and "lora" in data:
            data = dict(data)
            lora = data.pop("lora")
            if isinstance(lora, dict) and "r" in lora and "lora_rank" not in data:
                data["lora_rank"] = lora["r"]
        return data

    @model_validator(mode="after")
    def _check(self) -> "FlopsQuery":
        if self.steps is not None and self.budget is not None:
            raise ValueError("give steps or budget, not both")
        if self.update_generations is not None and self.update_generations > self.group:
            raise ValueError(f"update_generations={self.update_generations} > group={self.group}: the update trains "
                             f"on at most the {self.group} rollouts generated per prompt")
        return self


_FLAG = {"lora_rank": "--lora-rank", "prompts": "--prompts", "group": "--group", "prompt_len": "--prompt-len",
         "completion_len": "--completion-len", "iterations": "--iterations", "budget": "--budget",
         "update_generations": "--update-generations",
         "steps": "--steps", "reward": "--reward", "beta": "--beta", "model": "--model"}


def _names(field: str) -> list[str]:
    alias = FlopsQuery.model_fields[field].validation_alias
    return [field, *(getattr(alias, "choices", None) or [])]


def is_run_file(data: dict[str, Any]) -> bool:
    """Whether ``data`` holds run settings a flops query does not have (``task``,
    ``learning_rate``, ...): then it is read as a run file."""
    names = {n for f in FlopsQuery.model_fields for n in _names(f)} | {"lora"}
    return any(k in RunConfig.model_fields and k not in names for k in data)


def query_of_run(data: dict[str, Any], source: str = "run file") -> dict[str, Any]:
    """A run file's settings as flops-query settings (validated as a run config first)."""
    given_budget = "budget_flops" in data
    cfg = run_config_from_dict(data if given_budget else {**data, "budget_flops": 1.0}, source)
    q: dict[str, Any] = dict(
        model=cfg.model, lora_rank=cfg.lora.r if cfg.lora is not None else None, prompts=cfg.prompts_per_step,
        group=cfg.num_generations, prompt_len=cfg.max_prompt_length, completion_len=cfg.max_completion_length,
        iterations=cfg.num_iterations, beta=cfg.beta, reward=cfg.reward, conventions=cfg.conventions,
        update_generations=cfg.num_update_generations,
        share_prompt=cfg.engine == "builtin", recompute=cfg.gradient_checkpointing)
    if given_budget:
        q["budget"] = cfg.budget_flops
    return q


def flops_query(data: dict[str, Any], source: str = "settings", flags: dict[str, Any] | None = None) -> FlopsQuery:
    """Validate ``race flops`` settings: ``data`` from a file (flops settings or a whole run
    file), then ``flags`` (field name -> value) replacing the file's setting under any of
    its names (``steps`` and ``budget`` replace each other). ``ConfigError`` names the
    setting (and its flag)."""
    from race.spec.grid import file_kind

    if file_kind(data) == "grid":
        raise ConfigError(f"{source}: this is a grid file: `race grid plan {source}` prices every cell; `race flops` "
                          "reads one run's settings (a run file or flops settings)")
    data = query_of_run(data, source) if is_run_file(data) else dict(data)
    for field, value in (flags or {}).items():
        for name in _names(field) + (_names("budget") if field == "steps" else
                                     _names("steps") if field == "budget" else []):
            data.pop(name, None)
        data[field] = value
    try:
        return FlopsQuery.model_validate(data)
    except ValidationError as e:
        def unknown(loc: tuple[Any, ...]) -> str:
            names = {n for f in FlopsQuery.model_fields for n in _names(f)}
            return f"unknown setting{did_you_mean(str(loc[-1]), names, SETTING_ALIASES)} (check the spelling)"

        raise ConfigError(format_errors(e, f"invalid flops query ({source}):", unknown,
                                        lambda field: _FLAG.get(field, field))) from None


__all__ = ["FlopsQuery", "MAX_TOKENS", "flops_query"]
