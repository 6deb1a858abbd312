"""The run file: typed run configuration, one object per concept, validated on load.

Field names follow TRL's ``GRPOConfig`` where a setting means the same thing
(``num_generations``, ``max_completion_length``, ``temperature``, ``learning_rate``,
``beta``, ``num_iterations``, ``epsilon``, ``epsilon_high``, ``loss_type``,
``scale_rewards``, ``mask_truncated_completions``, ``per_device_train_batch_size``,
``gradient_accumulation_steps``, ``sapo_temperature_pos``/``_neg``) and PEFT's names for
LoRA (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``), so a TRL user reads a
RACE run file without a glossary. Values are accepted as TRL 1.16 accepts them:
``scale_rewards: true/false`` mean ``"group"``/``"none"``, ``target_modules: all-linear``
means every linear layer of the decoder (the seven matrices of the models RACE accounts).

Batch sizes, with TRL's meaning on one process: ``per_device_train_batch_size`` sequences
(completions) per micro-batch, ``gradient_accumulation_steps`` micro-batches per optimizer
step, ``steps_per_generation`` micro-batches per generation (TRL's default and RACE's:
``gradient_accumulation_steps``, one generation per optimizer step), so a step generates
``per_device_train_batch_size x steps_per_generation = prompts_per_step x num_generations``
sequences and trains on them in ``steps_per_generation / gradient_accumulation_steps``
optimizer steps (RACE asks for a whole number). Unset, they are ``prompts_per_step x
num_generations``, 1 and 1; given without ``prompts_per_step``, they set it. A RACE *step*
is one generation batch: its ledger rows, its lr, ``max_steps``.

``num_update_generations: m`` (PODS, arXiv 2504.13818; not a TRL setting: TRL 1.16 cannot
train on a subset, docs/trl.md) generates ``num_generations`` rollouts per prompt and
trains on ``m`` of them, chosen by ``update_selection`` (``race.spec.selection``). The
batch sizes then describe the update: ``per_device_train_batch_size x steps_per_generation
= prompts_per_step x num_update_generations`` sequences trained per step (the rollout still
generates ``prompts_per_step x num_generations``).

Configs load from YAML with ``yaml.safe_load``; ``--set key=value`` overrides use dotted
paths (``lora.r=16``).  Every validation error says which field is wrong and what to
change.

Kept whole (about 440 lines): RunConfig is one validated type; its loaders (overrides, YAML)
are the few functions beside it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, ValidationError, \
    field_validator, model_validator

from race.accounting.guard import check_budget

from race.spec.errors import ConfigError, blame_flags, format_errors, load_yaml_mapping, parse_scalar
from race.spec.reward import RewardSpec, parse_reward
from race.spec.selection import DEFAULT_SELECTION, update_selection
from race.spec.task import TASK_ID_NEUTRAL, TaskSettings

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: The loss types both engines run (TRL 1.16's names and formulas).
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo")
#: TRL 1.16 loss types RACE refuses, and why.
REFUSED_LOSS_TYPES = {
    "luspo": "it needs sequence-level importance sampling (TRL's importance_sampling_level='sequence'), "
             "which RACE's engines do not implement",
    "vespo": "its gamma-weighted sequence-level importance weights are not implemented by RACE's built-in engine",
}
#: Settings that change neither training nor accounting (left out of the run id).
LOGGING_ONLY = ("output_dir", "log_to", "wandb_project", "eval_cache_dir")
#: Settings added after run ids were first issued: left out of the id while at these values,
#: so the ids of existing runs (and the run directories and grid stores keyed by them) hold.
_ID_NEUTRAL = {"per_device_train_batch_size": None, "gradient_accumulation_steps": None,
               "steps_per_generation": None, "num_update_generations": None, "update_selection": DEFAULT_SELECTION}


def _reward_spec(v: Any) -> RewardSpec:
    if not isinstance(v, (str, RewardSpec)):
        raise ValueError(f"reward={v!r}: write a reward spec string such as rule, rule:partial, random, prm:prm-s "
                         "or py:mypkg.rewards:correctness (your function)")
    return parse_reward(v)  # the one grammar (race.spec.reward); raises ValueError saying what to write


#: A FLOP budget: race.accounting.guard's one check (a finite count > 0).
BudgetField = Annotated[float, AfterValidator(check_budget)]
#: A reward setting: parsed once on load, written back as the string it was given.
RewardField = Annotated[RewardSpec, PlainValidator(_reward_spec), PlainSerializer(str, return_type=str)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraSettings(_Strict):
    """PEFT LoRA settings (PEFT's names). ``r: 0`` is not allowed: use ``lora: null`` for
    full fine-tuning."""

    r: int = Field(16, ge=1, description="LoRA rank")
    lora_alpha: float = Field(16.0, gt=0)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS),
                                      description="matrices to adapt, or 'all-linear' (PEFT: every linear layer "
                                      "but the output head)")

    @field_validator("target_modules", mode="before")
    @classmethod
    def _all_linear(cls, v: Any) -> Any:
        if v == "all-linear" or v == ["all-linear"]:
            return list(LORA_TARGETS)  # PEFT's all-linear on the decoders RACE accounts: these seven
        if isinstance(v, str):
            raise ValueError(f"target_modules={v!r}: write a list of module names or 'all-linear'")
        return v

    @field_validator("target_modules")
    @classmethod
    def _known_targets(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("target_modules is empty: name at least one of " + ", ".join(LORA_TARGETS))
        bad = [t for t in v if t not in LORA_TARGETS]
        if bad:
            raise ValueError(f"unknown LoRA target(s) {bad}; choose from {list(LORA_TARGETS)}")
        return v


class EvalSettings(_Strict):
    """Evaluation targets, run at regular FLOP intervals (not charged to the budget)."""

    every_flops: float | None = Field(None, gt=0, description="evaluate each time this many training FLOPs pass; default budget/4")
    num_points: int = Field(4, ge=1, description="used when every_flops is null: evaluations spread over the budget")
    at_budgets: list[float] = Field(
        default_factory=list, description="also evaluate where a run of each of these smaller budgets would stop "
        "(its last step that fits): the run's prefixes stand for those budgets (nested pilots, docs/analysis.md)")
    n_problems: int = Field(200, ge=1)
    n_hard_problems: int = Field(100, ge=0)
    pass_k: int = Field(4, ge=1)
    n_pass_problems: int = Field(50, ge=0)
    targets: list[Literal["greedy", "pass@k", "pass@1", "hard"]] = Field(
        default_factory=lambda: ["greedy", "pass@k", "hard"],
        description="greedy accuracy; pass@k and pass@1 (the mean accuracy of the same k samples at the training "
        "temperature: what GRPO optimises) on n_pass_problems; greedy accuracy on the hard split")


class RunConfig(_Strict):
    """One GRPO run: policy, LoRA, task, reward system, budget, and GRPO settings."""

    name: str = "run"
    engine: Literal["builtin", "trl"] = "builtin"
    model: str = Field("tiny-s", description="tiny family name, Qwen2.5 preset, HF hub name or local directory")
    lora: LoraSettings | None = Field(default_factory=LoraSettings)
    task: TaskSettings = Field(default_factory=TaskSettings)
    reward: RewardField = Field(default_factory=lambda: parse_reward("rule"),
                                description="rule[:TERMS] | random | math | orm:NAME | prm:NAME[:AGG] | "
                                "judge:NAME | py:MODULE:FUNCTION (grammar: race.spec.reward), held parsed")
    eval: EvalSettings = Field(default_factory=EvalSettings)

    budget_flops: BudgetField = Field(..., description="the run's FLOP budget (finite); the ledger total never exceeds it")
    max_steps: int | None = Field(None, ge=1)

    # GRPO (TRL names)
    prompts_per_step: int = Field(16, ge=1)
    per_device_train_batch_size: int | None = Field(
        None, ge=1, description="TRL: sequences per micro-batch; default prompts_per_step x num_generations / "
        "gradient_accumulation_steps")
    gradient_accumulation_steps: int | None = Field(
        None, ge=1, description="TRL: micro-batches per optimizer step (default 1)")
    steps_per_generation: int | None = Field(
        None, ge=1, description="TRL: micro-batches per generation batch (default gradient_accumulation_steps: one "
        "optimizer step per generation); a multiple k of it trains each generation in k optimizer steps")
    num_generations: int = Field(8, description="group size G: rollouts generated per prompt")
    num_update_generations: int | None = Field(
        None, description="rollouts per prompt the update trains on (PODS's m, 2 <= m <= num_generations), chosen "
        "by update_selection; their advantages are relative to each other; null: all num_generations")
    update_selection: str = Field(DEFAULT_SELECTION, description="how num_update_generations rollouts are chosen "
                                  "of each prompt's num_generations: max_variance (PODS) or random (its control); "
                                  "the table: race.spec.selection")
    max_prompt_length: int = Field(64, ge=1)
    max_completion_length: int = Field(64, ge=1)
    temperature: float = Field(1.0, gt=0)
    learning_rate: float = Field(1e-4, gt=0)
    lr_scheduler_type: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    beta: float = Field(0.0, ge=0)
    num_iterations: int = Field(1, ge=1)
    epsilon: float = Field(0.2, gt=0)
    epsilon_high: float | None = Field(None, gt=0)
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo"] = "dapo"
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="divide advantages by the group's reward std (group), the batch's (batch) or not "
        "(none); true/false mean group/none, as in TRL")
    sapo_temperature_pos: float = Field(1.0, gt=0, description="loss_type: sapo, tokens with advantage > 0")
    sapo_temperature_neg: float = Field(1.05, gt=0, description="loss_type: sapo, the other tokens")
    mask_truncated_completions: bool = False
    drop_zero_variance_groups: bool = Field(
        True, description="leave groups whose rewards are all equal out of the update (they carry no signal; "
        "the update then costs only what it runs on)")
    max_grad_norm: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    seed: int = 0

    # execution
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="the base model's weights (TRL's model_init_kwargs dtype); LoRA adapters and their "
        "optimizer state stay float32. auto: bfloat16 on CUDA with LoRA, else float32")
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads; default: the grid "
                                      "worker's, else 1 for the tiny family (faster there), else torch's")
    gradient_checkpointing: bool = False
    attn_implementation: Literal["eager", "sdpa"] = "eager"
    checkpoint_every: int = Field(10, ge=1, description="steps between resumable checkpoints")
    conventions: str = "race"
    output_dir: str | None = None
    log_to: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list)
    wandb_project: str | None = Field(None, description="W&B project for log_to: wandb (default $WANDB_PROJECT, "
                                      "else 'race')")
    eval_cache_dir: str | None = Field(
        None, description="share the step-0 evaluation with every run that starts from the same base on the same "
        "task and evaluation settings (race.engines.eval_share); grids set <study>/eval-cache")

    @field_validator("num_generations")
    @classmethod
    def _group(cls, v: int) -> int:
        if v < 2:
            raise ValueError(
                f"num_generations={v}: GRPO needs a group of at least 2 completions per prompt "
                "(advantages are relative to the group); set num_generations >= 2"
            )
        return v

    @field_validator("update_selection")
    @classmethod
    def _selection(cls, v: str) -> str:
        return update_selection(v).name  # the table's names (race.spec.selection); ValueError names them

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _scale_bool(cls, v: Any) -> Any:
        return {True: "group", False: "none"}.get(v, v) if isinstance(v, bool) else v  # TRL's mapping

    @field_validator("loss_type", mode="before")
    @classmethod
    def _loss_type(cls, v: Any) -> Any:
        if v in REFUSED_LOSS_TYPES:
            raise ValueError(f"loss_type={v!r} (TRL 1.16) is not supported: {REFUSED_LOSS_TYPES[v]}; "
                             f"use one of {', '.join(LOSS_TYPES)}")
        return v

    @model_validator(mode="after")
    def _combos(self) -> "RunConfig":
        if self.engine == "trl" and "drop_zero_variance_groups" not in self.model_fields_set:
            # TRL trains on zero-variance groups (and spends their FLOPs); follow it by default.
            self.__dict__["drop_zero_variance_groups"] = False
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(f"epsilon_high ({self.epsilon_high}) < epsilon ({self.epsilon}): set epsilon_high >= epsilon or null")
        if self.lora is None and self.dtype in ("bfloat16", "float16"):
            raise ValueError(f"dtype={self.dtype} with lora: null would train the weights themselves, and keep "
                             f"AdamW's state, in {self.dtype} (updates below its resolution are lost): set dtype: "
                             "float32 for full fine-tuning, or train a LoRA adapter (kept in float32)")
        self._check_update_generations()
        self._check_batches()
        self._check_at_budgets()
        return self

    def _check_at_budgets(self) -> None:
        """``eval.at_budgets``: finite budgets below this run's, each a prefix of it."""
        at = self.eval.at_budgets
        for b in at:
            check_budget(b)
            if b >= self.budget_flops:
                raise ValueError(f"eval.at_budgets has {b:.4g}, not below budget_flops={self.budget_flops:.4g}: a run "
                                 "can only stand in for smaller budgets (its prefixes); drop it or raise budget_flops")
        if len(set(at)) != len(at):
            raise ValueError(f"eval.at_budgets {at} lists a budget twice: list each once")

    def _check_update_generations(self) -> None:
        """``num_update_generations`` (m) against ``num_generations`` (n): 2 <= m <= n;
        ``update_selection`` other than the default only where it chooses (m is set)."""
        m, n = self.num_update_generations, self.num_generations
        if m is None:
            if self.update_selection != DEFAULT_SELECTION and "update_selection" in self.model_fields_set:
                raise ValueError(f"update_selection={self.update_selection!r} chooses which rollouts the update "
                                 "trains on, but num_update_generations is null (the update trains on all "
                                 f"num_generations={n}): set num_update_generations below {n}, or drop "
                                 "update_selection")
            return
        if m < 2:
            raise ValueError(f"num_update_generations={m}: the update's advantages are relative to the rollouts it "
                             "trains on (their mean and std), so one rollout carries no signal; set it to 2 or more "
                             "(or null for all num_generations)")
        if m > n:
            raise ValueError(f"num_update_generations={m} > num_generations={n}: the update trains on a subset of "
                             f"the rollouts generated; set num_update_generations <= {n}, or raise num_generations")

    def _check_batches(self) -> None:
        """TRL's batch settings against the update's ``prompts_per_step x
        num_update_generations`` sequences (``num_generations`` unless it is set: module
        docstring)."""
        B, ga, spg, G = (self.per_device_train_batch_size, self.gradient_accumulation_steps,
                         self.steps_per_generation, self.update_generations)
        name = "num_update_generations" if self.num_update_generations is not None else "num_generations"
        rows, group = f"prompts_per_step x {name}", f"{name}={G}"
        if B is None and ga is None and spg is None:
            return
        a = ga or 1
        k = spg or a  # micro-batches per generation
        if k % a:
            raise ValueError(f"steps_per_generation={k} is not a multiple of gradient_accumulation_steps={a}: RACE "
                             "trains each generation in whole optimizer steps; set steps_per_generation to "
                             f"{a}, {2 * a}, {3 * a}, ...")
        per = (f"per_device_train_batch_size x steps_per_generation = {B} x {k}" if spg is not None else
               f"per_device_train_batch_size x gradient_accumulation_steps = {B} x {k}")
        if B is not None and "prompts_per_step" not in self.model_fields_set:
            if (B * k) % G:
                raise ValueError(f"{per} sequences per step is not a multiple of {group}: every prompt "
                                 "needs its whole group")
            self.__dict__["prompts_per_step"] = B * k // G
        n = self.prompts_per_step * G
        if B is None and n % k:
            raise ValueError(f"{'steps_per_generation' if spg is not None else 'gradient_accumulation_steps'}={k} "
                             f"does not divide {rows} = {n} sequences: choose a divisor of {n}")
        if B is not None and B * k != n:
            raise ValueError(
                f"{per} = {B * k} sequences per step, but {rows} = {n}: the update trains on "
                f"{n} sequences per step; set {'steps_per_generation' if spg is not None else 'gradient_accumulation_steps'}: "
                f"{n // B if n % B == 0 else '...'} or leave prompts_per_step out (it is then derived)")

    @property
    def update_generations(self) -> int:
        """Rollouts per prompt the update trains on: ``num_update_generations``, else
        ``num_generations`` (all of them)."""
        return self.num_update_generations or self.num_generations

    @property
    def micro_batch_size(self) -> int:
        """Sequences per micro-batch (TRL's ``per_device_train_batch_size``)."""
        return self.per_device_train_batch_size or self.prompts_per_step * self.update_generations // self.generation_steps

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (TRL's ``gradient_accumulation_steps``)."""
        return self.gradient_accumulation_steps or 1

    @property
    def generation_steps(self) -> int:
        """Micro-batches per generation (TRL's ``steps_per_generation``; its default,
        ``gradient_accumulation_steps``, when unset)."""
        return self.steps_per_generation or self.accumulation_steps

    @property
    def optimizer_steps_per_generation(self) -> int:
        """Optimizer steps each generation batch feeds, per iteration over it:
        ``steps_per_generation / gradient_accumulation_steps``."""
        return self.generation_steps // self.accumulation_steps

    # -- helpers -----------------------------------------------------------------------
    def run_id(self) -> str:
        """Stable id: a hash of the resolved spec (output location and logging excluded;
        settings added later leave the ids of runs that do not use them unchanged)."""
        d = self.model_dump(mode="json")
        for k in LOGGING_ONLY:
            d.pop(k, None)
        for k, neutral in _ID_NEUTRAL.items():
            if d.get(k) == neutral:
                d.pop(k)
        if not d["eval"].get("at_budgets"):  # added later, likewise
            d["eval"].pop("at_budgets", None)
        for k, neutral in TASK_ID_NEUTRAL.items():  # task settings added later, likewise
            if d["task"].get(k) == neutral:
                d["task"].pop(k)
        if d["loss_type"] != "sapo":  # the SAPO temperatures change nothing else
            d.pop("sapo_temperature_pos"), d.pop("sapo_temperature_neg")
        d["scale_rewards"] = {"group": True, "none": False}.get(d["scale_rewards"], d["scale_rewards"])  # was a bool
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def needs_old_logprobs(self) -> bool:
        """Old-policy log-probs are needed only when the policy moves before the last pass
        over the batch: ``num_iterations > 1`` or more than one optimizer step per
        generation (``steps_per_generation > gradient_accumulation_steps``; TRL's rule,
        ``gradient_accumulation_steps % (steps_per_generation x num_iterations) != 0``)."""
        return self.num_iterations > 1 or self.optimizer_steps_per_generation > 1


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``key.sub=value`` (value parsed as YAML scalar/list)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value (e.g. --set lora.r=16)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    return key.split("."), parse_scalar(raw)


def set_path(data: dict[str, Any], path: list[str], value: Any, where: str) -> None:
    """Set ``data[path[0]][path[1]]... = value``, creating sections (in place)."""
    node = data
    for p in path[:-1]:
        if node.get(p) is None:
            node[p] = {}
        node = node[p]
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {p} is not a section")
    node[path[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str] | None,
                    values: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of ``data`` with ``key=value`` strings applied, then typed ``values``
    (dotted key -> value, e.g. ``{"budget_flops": 1e16}`` from a CLI flag: no trip
    through YAML text)."""
    data = json.loads(json.dumps(data))  # deep copy of plain data
    for item in overrides or []:
        path, value = parse_override(item)
        set_path(data, path, value, f"override {item!r}")
    for key, value in (values or {}).items():
        set_path(data, key.split("."), value, f"setting {key}")
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The settings mapping of a YAML file (see :func:`race.spec.errors.load_yaml_mapping`)."""
    return load_yaml_mapping(path, ConfigError, "config file")


def run_config_from_dict(data: dict[str, Any], source: str = "dict", flags: dict[str, str] | None = None
                         ) -> RunConfig:
    """Validate run settings; ``ConfigError`` names each wrong field (an unknown one with
    the closest valid name). ``flags``: dotted setting -> the command-line flag that set it
    (``--set lora.rank=8``): its errors blame the flag, and when every error is a flag's the
    title does not name ``source``."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        title, label = blame_flags(e, flags or {}, f"invalid run config ({source}):", "invalid --set override:")
        raise ConfigError(format_errors(e, title, label=label, model=RunConfig)) from None


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None,
                    base: dict[str, Any] | None = None, values: dict[str, Any] | None = None) -> RunConfig:
    """Load a run config from YAML (safe_load), apply ``key=value`` overrides and typed
    ``values``, validate (an override's errors name its ``--set``). A grid file given here
    is refused as such by :func:`race.spec.files.load_run_file`."""
    data: dict[str, Any] = dict(base or {})
    if path is not None:
        data.update(load_yaml(path))
    data = apply_overrides(data, overrides, values)
    flags = {".".join(parse_override(item)[0]): f"--set {item}" for item in overrides or []}
    return run_config_from_dict(data, str(path) if path else "overrides", flags=flags)
