"""The fields of a run trained outside RACE (``race import``, docs/import.md): its allocation
by RACE's names, its seed, and the settings RACE needs to charge its tokens, validated once.

An imported run names its allocation as a grid cell does: the six allocation columns of
``race.schema.ALLOCATION_COLUMNS`` (``model``, ``num_generations``, ``prompts_per_step``,
``num_iterations``, ``learning_rate``, ``reward``, a RACE reward spec) are required; any
other setting is given by its ``RunConfig`` name (TRL's names: ``beta``,
``max_completion_length``, ``gradient_checkpointing``, ...; ``lora.r`` or ``lora_r``) and
becomes one more allocation axis, as a grid axis does (the analysis keys allocations on the
axes whose values differ between runs). ``engine`` is free text (``trl``, ``verl``, ...).

Charging tokens reads TRL's settings from those axes, with TRL 1.16's defaults where a run
does not say (:class:`ChargeSettings`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from race.schema import ALLOCATION_COLUMNS
from race.spec.errors import ConfigError, format_errors
from race.spec.run import LoraSettings, RewardField, RunConfig

#: Fields every imported run must give (the allocation columns and the seed).
REQUIRED_FIELDS: tuple[str, ...] = (*ALLOCATION_COLUMNS, "seed")
#: Settings of RunConfig that are not allocation axes of an imported run (RACE's own
#: bookkeeping: where, how long, how RACE would run it).
NOT_AXES = frozenset({"name", "engine", "budget_flops", "max_steps", "seed", "output_dir", "log_to", "wandb_project",
                      "eval_cache_dir", "device", "torch_threads", "checkpoint_every", "eval", "task", "conventions",
                      "lora"})
_ALIASES = {"lora_r": "lora.r"}


class ImportedFields(BaseModel):
    """One imported run's allocation, seed and other settings (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1, description="the policy: a name --model maps to a shape, or a reference")
    num_generations: int = Field(..., ge=1, description="completions per prompt (G)")
    prompts_per_step: int = Field(..., ge=1, description="prompts per generation batch")
    num_iterations: int = Field(..., ge=1, description="updates per generation batch (TRL's mu; verl's ppo_epochs)")
    learning_rate: float = Field(..., gt=0)
    reward: RewardField
    seed: int
    engine: str | None = Field(None, description="what trained it: trl, verl, ...")
    axes: dict[str, Any] = Field(default_factory=dict, description="other RunConfig settings, by their names")

    def allocation(self) -> dict[str, Any]:
        """The allocation as a grid cell's ``allocation`` mapping: the allocation columns,
        then every other setting (``lora.r`` by its dotted path)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in ALLOCATION_COLUMNS}
        out["reward"] = str(self.reward)
        out.update(self.axes)
        return out


def _axis_type(path: str) -> Any:
    """The type of the RunConfig setting at ``path`` (``beta``, ``lora.r``), else None."""
    head, _, tail = path.partition(".")
    if tail:
        return LoraSettings.model_fields[tail].annotation if head == "lora" and tail in LoraSettings.model_fields \
            else None
    field = RunConfig.model_fields.get(head)
    return None if field is None or head in NOT_AXES else field.annotation


def axis_names() -> list[str]:
    """Every setting an imported run may give beyond :data:`REQUIRED_FIELDS` and ``engine``."""
    own = [k for k in RunConfig.model_fields if k not in NOT_AXES and k not in REQUIRED_FIELDS]
    return sorted(own + [f"lora.{k}" for k in LoraSettings.model_fields])


def imported_fields(values: dict[str, Any], where: str) -> ImportedFields:
    """Validate one run's fields (``where`` names it in errors). Keys beyond the required
    fields and ``engine`` must be RunConfig settings (``lora_r`` reads as ``lora.r``); each
    value is checked against that setting's type."""
    core = {k: v for k, v in values.items() if k in ImportedFields.model_fields and k != "axes"}
    axes: dict[str, Any] = {}
    problems, unknown = [], []
    for key, value in values.items():
        if key in core:
            continue
        path = _ALIASES.get(key, key)
        kind = _axis_type(path)
        if kind is None:
            unknown.append(key)
            continue
        try:
            axes[path] = TypeAdapter(kind).validate_python(value)
        except ValidationError as e:
            problems.append(f"  - {key}: {e.errors()[0]['msg']} (got {value!r})")
    if unknown:
        problems.append(f"  - {', '.join(unknown)}: not a setting RACE knows (rename a column to RACE's name: "
                        f"docs/import.md); a run's fields are {', '.join(REQUIRED_FIELDS)}, engine, and any of "
                        f"{', '.join(axis_names())}")
    try:
        fields = ImportedFields.model_validate({**core, "axes": axes})
    except ValidationError as e:
        problems += format_errors(e, "").splitlines()[1:]
        fields = None
    if problems:
        raise ConfigError("\n".join([f"{where}: its fields are wrong:", *problems]))
    assert fields is not None
    return fields


class ChargeSettings(BaseModel):
    """TRL's settings that decide what a step executes, as token charging reads them from an
    imported run's axes (TRL 1.16's defaults where the run does not say)."""

    model_config = ConfigDict(extra="ignore")

    beta: float = Field(0.0, ge=0)
    gradient_checkpointing: bool = True  # TRL's default (transformers': False)
    gradient_accumulation_steps: int = Field(1, ge=1)
    steps_per_generation: int | None = Field(None, ge=1)  # None: gradient_accumulation_steps (TRL's default)

    @classmethod
    def of(cls, fields: ImportedFields) -> "ChargeSettings":
        return cls.model_validate(fields.axes)


__all__ = ["ChargeSettings", "ImportedFields", "NOT_AXES", "REQUIRED_FIELDS", "axis_names", "imported_fields"]
