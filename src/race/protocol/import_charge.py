"""FLOPs of runs trained elsewhere, charged by RACE's accounting from the token counts their
logs keep (``race import``, docs/import.md).

A run's model becomes a shape through ``race.models.refs.resolve_shape`` (a preset, a
tiny-family name, a ``config.json`` path, a model directory, a hub name in the local cache;
``--model NAME=REF`` maps a name the source uses to one of those). Its tokens are charged
interval by interval (between two logged points: the sequences generated, their prompt and
completion tokens) by ``race.accounting.trl_step.trl_tokens_components``: every row at its
own lengths, as even as integers allow, executed as TRL 1.16 executes a step (rollout per
row, old-policy and reference passes where TRL runs them, ``num_iterations`` updates), under
the run's FLOP conventions. Each interval becomes one ledger row per ``phase/component`` at
the interval's last step, so the study's compute split and report card read as for a grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from race.accounting import AccountingError, LoRA, ModelShape, PolicyCost
from race.accounting.guard import is_counted
from race.accounting.trl_step import TrlStepPlan, trl_tokens_components
from race.spec.imported import ChargeSettings, ImportedFields
from race.spec.run import LORA_TARGETS

from .errors import ImportRefused

#: The convention of a token charge, as the study's caveat names it.
TOKENS_NOTE = ("charged by RACE from the logged token counts (race.accounting.trl_step.trl_tokens_components): "
               "each generation's rows at lengths as even as the totals allow, executed as TRL 1.16 runs a step "
               "(rollout per row, no shared prompt; old-policy and reference passes where TRL runs them; "
               "num_iterations updates), without padding: at most what the trainer executed, equal when a "
               "generation's rows have equal lengths")


@dataclass(frozen=True)
class Shapes:
    """Model names -> shapes: ``mapping`` (``--model NAME=REF``) first, then ``default``
    (``--model REF``) for every name, then the name itself as a reference."""

    mapping: dict[str, str]
    default: str | None = None

    @classmethod
    def parse(cls, items: list[str] | None) -> "Shapes":
        mapping: dict[str, str] = {}
        default = None
        for item in items or []:
            name, sep, ref = item.partition("=")
            if sep and name.strip() and ref.strip():
                mapping[name.strip()] = ref.strip()
            elif default is None and not sep:
                default = item.strip()
            else:
                raise ImportRefused(f"--model {item!r}: give REF (every run's shape) once, or NAME=REF per name")
        return cls(mapping, default)

    def shape(self, name: str, where: str) -> ModelShape:
        from race.models.refs import resolve_shape

        ref = self.mapping.get(name, self.default or name)
        try:
            return resolve_shape(ref)
        except AccountingError as e:
            raise ImportRefused(f"{where}: model {name!r} is unknown to RACE ({e}); map it to its shape with "
                                f"--model {name}=REF (a preset, a tiny-family name, a config.json path or a model "
                                "directory)") from None


def lora_of(fields: ImportedFields, adapter: dict[str, Any] | None = None) -> LoRA | None:
    """The run's LoRA: ``lora.r`` / ``lora.target_modules`` of its fields, else a PEFT
    ``adapter_config.json`` (``r``, ``target_modules``), else None (full fine-tuning)."""
    r = fields.axes.get("lora.r", (adapter or {}).get("r"))
    if r is None:
        return None
    targets = fields.axes.get("lora.target_modules", (adapter or {}).get("target_modules"))
    if targets is None or targets == "all-linear" or targets == ["all-linear"]:
        targets = list(LORA_TARGETS)  # PEFT's all-linear on the decoders RACE accounts
    return LoRA(int(r), tuple(sorted(str(t) for t in targets)))


def charge_intervals(fields: ImportedFields, policy: PolicyCost, intervals: list[tuple[int, int, int, int]], *,
                     compact_head: bool, where: str) -> list[dict[str, Any]]:
    """Ledger rows of ``intervals`` ``(step, sequences, prompt_tokens, completion_tokens)``
    (the sequences generated since the previous point and their tokens), charged to
    ``policy`` (its shape, LoRA and conventions; module docstring)."""
    settings = ChargeSettings.of(fields)
    g = fields.num_generations
    try:
        plan = TrlStepPlan(per_device_train_batch_size=g, num_generations=g,
                           gradient_accumulation_steps=settings.gradient_accumulation_steps,
                           steps_per_generation=settings.steps_per_generation or settings.gradient_accumulation_steps,
                           num_iterations=fields.num_iterations, beta=settings.beta, compact_head=compact_head)
    except AccountingError as e:
        raise ImportRefused(f"{where}: {e}") from None
    recompute = "early_stop" if settings.gradient_checkpointing else None
    rows: list[dict[str, Any]] = []
    for step, seqs, prompt, completion in intervals:
        if seqs == 0 and prompt == 0 and completion == 0:
            continue
        try:
            comps = trl_tokens_components(plan, policy, n_seqs=seqs, prompt_tokens=prompt,
                                          completion_tokens=completion, recompute=recompute)
        except AccountingError as e:
            raise ImportRefused(f"{where}, step {step}: {seqs} sequences with {prompt} prompt and {completion} "
                                f"completion tokens cannot be charged ({e}); check prompts_per_step x num_generations "
                                "(the sequences of one generation batch) and the token counts") from None
        for key, flops in sorted(comps.items()):
            phase, _, component = key.partition("/")
            tokens = prompt + completion if phase != "rollout" else (prompt if component == "prefill" else completion)
            rows.append({"step": step, "phase": phase, "component": component, "flops": int(flops),
                         "tokens": tokens, "seconds": None, "counted": is_counted(key)})
    return rows


def policy_cost(run: tuple[ModelShape, LoRA | None], conventions: str, where: str) -> PolicyCost:
    """The cost context of a run's ``(shape, LoRA)`` under ``conventions``; a LoRA rank the
    shape cannot hold is refused naming the run."""
    try:
        return PolicyCost(run[0], run[1], conventions)
    except AccountingError as e:
        raise ImportRefused(f"{where}: {e}") from None


def head_note(compact_head: bool) -> str:
    """The caveat line of where a token charge put TRL's fused LM head."""
    head = "at completion tokens (Triton on CUDA)" if compact_head else "at every position but the last (as on CPU)"
    return f"Charged tokens: the fused LM head of the log-prob and update passes runs {head}."


def lora_text(lora: LoRA | None) -> str:
    return f"LoRA r={lora.rank} on {', '.join(lora.targets)}" if lora else "full fine-tuning"


__all__ = ["Shapes", "TOKENS_NOTE", "charge_intervals", "head_note", "lora_of", "lora_text", "policy_cost"]
