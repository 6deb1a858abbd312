"""What the drop-in ledger reads from a TRL trainer when it attaches and when training
begins: where rollouts run, the vLLM weight sync it times, TRL's own flags that change a
step's plan (vLLM's importance-sampling correction, the tool loop), the longest prompt as
TRL renders it, and the device's peak for the MFU logs. Kept out of ``callback.py`` so the
callback's event handlers stay readable."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, Callable

from race.accounting.errors import AccountingError
from race.accounting.trl_step import TrlStepPlan
from race.engines.trl.hooks import bound_prompt_length
from race.models.timing import device_clock


def rollout_location(trainer: Any, args: Any) -> str:
    """Where TRL's rollouts run: ``policy`` (the hooked ``model.generate`` on the training
    ranks), ``vllm_colocate``, ``vllm_server`` (other GPUs: their FLOPs are charged to the
    training ranks' ledger, their seconds are the training ranks' wait), or
    ``continuous_batching``; ``rollout_func (...)`` around it when a ``rollout_func`` is set."""
    where = "policy"
    if bool(getattr(trainer, "use_vllm", getattr(args, "use_vllm", False))):
        where = f"vllm_{getattr(trainer, 'vllm_mode', getattr(args, 'vllm_mode', 'server'))}"
    elif bool(getattr(args, "use_transformers_continuous_batching", False)):
        where = "continuous_batching"
    return f"rollout_func ({where})" if getattr(trainer, "rollout_func", None) is not None else where


def time_weight_sync(generation: Any, tracker: Any, device: Callable[[], Any]) -> Callable[[], None] | None:
    """Time ``vllm_generation.sync_weights()`` into ``tracker.weight_sync_seconds`` (booked
    as ``rollout/weight_sync``, apart from the rollouts); returns the undo, or None when
    there is nothing to time."""
    original = getattr(generation, "sync_weights", None)
    if original is None:
        return None
    had = "sync_weights" in getattr(generation, "__dict__", {})

    def sync_weights(*args: Any, **kwargs: Any) -> Any:
        dev = device()
        t0 = device_clock(dev)
        try:
            return original(*args, **kwargs)
        finally:
            tracker.weight_sync_seconds += device_clock(dev) - t0

    generation.sync_weights = sync_weights

    def undo() -> None:
        if had:
            generation.sync_weights = original
        else:
            generation.__dict__.pop("sync_weights", None)

    return undo


def trainer_plan(plan: TrlStepPlan, trainer: Any, args: Any) -> TrlStepPlan:
    """``plan`` with TRL's own flags, which win over ``args``: vLLM's importance-sampling
    correction, and the tool loop's extra turns, ``min(max_tool_calling_iterations,
    max_completion_length)`` (each turn adds at least one token to a completion capped at
    ``max_completion_length``)."""
    if trainer is None:
        return plan
    if getattr(trainer, "use_vllm", False):
        plan = replace(plan, vllm_is_correction=bool(getattr(trainer, "vllm_importance_sampling_correction", False)))
    if getattr(trainer, "tools", None):
        T = int(args.max_completion_length)
        turns = getattr(trainer, "max_tool_calling_iterations", None)
        plan = replace(plan, tool_iterations=T if turns is None else min(int(turns), T))
    return plan


def dataset_prompt_bound(trainer: Any, loader: Any, tokenizer: Any, args: Any) -> int:
    """The longest training prompt in tokens, rendered as TRL renders it (its tools and
    chat template when the trainer is known). Environment observations are appended at
    ``reset()`` and cannot be read in advance: a warning asks for ``max_prompt_length``."""
    ds = getattr(loader, "dataset", None)
    try:
        prompts = ds["prompt"]  # type: ignore[index]
    except Exception:
        raise AccountingError("cannot read the training prompts to bound a step: pass "
                              "max_prompt_length=... (the longest prompt in tokens)") from None
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    if getattr(trainer, "environment_factories", None) is not None:
        warnings.warn("environment_factory: each environment's reset() observation is appended to its prompt, "
                      "which the step bound cannot read in advance; pass max_prompt_length=<longest prompt with "
                      "its observation, in tokens> (a step that still overruns ends training as a budget stop)",
                      stacklevel=4)
    return bound_prompt_length(tok, list(prompts), chat_template_kwargs=getattr(args, "chat_template_kwargs", None),
                               tools=getattr(trainer, "tools", None) or None,
                               chat_template=getattr(trainer, "chat_template", None))


def model_peak(model: Any, args: Any) -> tuple[float | None, str, str | None]:
    """(one device's peak FLOP/s from the table or None, the device's name, the dtype) for
    ``model`` as the trainer runs it: ``bf16``/``fp16`` under mixed precision, else its
    parameters' dtype (``tf32`` for fp32 with ``args.tf32``)."""
    from race.engines.trl.usage import device_peak
    from race.accounting.devices import dtype_name

    param = next(model.parameters())
    dtype = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else \
        dtype_name(param.dtype)
    if dtype == "fp32" and getattr(args, "tf32", None):
        dtype = "tf32"
    peak, name = device_peak(param.device, dtype)
    return peak, name, dtype


def keep_work(args: Any, control: Any) -> None:
    """A budget stop ends training like TRL's own ``max_steps`` stop does
    (``DefaultFlowCallback``): it saves a checkpoint and evaluates, when the run saves and
    evaluates at all, so the steps since the last checkpoint are not lost."""
    if str(getattr(args, "save_strategy", "no")).lower().rsplit(".", 1)[-1] != "no":
        control.should_save = True
    if str(getattr(args, "eval_strategy", "no")).lower().rsplit(".", 1)[-1] != "no":
        control.should_evaluate = True


class TablePeak:
    """One device's peak FLOP/s from the table for a model, read once (at the first log,
    after the trainer placed the model); without one, a one-time note and ``None``."""

    def __init__(self) -> None:
        self.read, self.value = False, None

    def get(self, model: Any, args: Any) -> float | None:
        if not self.read:
            self.read = True
            self.value, name, dtype = model_peak(model, args)
            if self.value is None:
                import logging

                logging.getLogger(__name__).warning(
                    "race/mfu/* not logged: no peak FLOP/s for device %r at %s in the device table "
                    "(race.accounting.devices); pass peak_flops=<one device's FLOP/s> to add_race_accounting / RaceFlopCallback",
                    name, dtype)
        return self.value


def utilisation_logs(cb: Any, args: Any, state: Any, policy: Any, trainer: Any) -> dict[str, float]:
    """The utilisation values of ``race.engines.trl.usage`` for callback ``cb``'s ledger,
    against ``cb.peak_flops`` or the table's peak for ``policy``'s device and dtype
    (``cb.table_peak``, read once). Sets TRL's ``state.total_flos`` to the ledger's counted
    total (and zeroes ``trainer``'s own transformers estimate, which it would add at the end)."""
    from race.engines.trl.usage import utilisation_values

    peak = cb.peak_flops if cb.peak_flops is not None else cb.table_peak.get(policy, args)
    state.total_flos = float(cb.ledger.total)
    if trainer is not None and hasattr(trainer, "current_flos"):
        trainer.current_flos = 0
    led = cb.ledgers
    return utilisation_values(cb.ledger, world=led.world, peak=peak, rank_flops=led.rank_flops,
                              rank_seconds=led.rank_seconds, remote_rollout=cb.rollout_location.endswith("vllm_server"))


def report_card(cb: Any, meta: dict[str, Any]) -> Any:
    """Callback ``cb``'s compute report card from its ledger so far (``meta``: more
    ``ReportCard.from_ledger`` fields and ``extra`` entries)."""
    from race.accounting import ReportCard
    from race.accounting.trl_step import TRL_CONVENTIONS_NOTE, TRL_EXECUTION_NOTE
    from race.engines.trl.rollouts import ROLLOUT_NOTE

    if cb.ledger is None or cb.shape is None or cb.plan is None:
        raise AccountingError("no ledger yet: the report card exists once training has begun")
    extra: dict[str, Any] = {"engine": "trl", "trl_execution": TRL_EXECUTION_NOTE}
    if cb.watch is not None and cb.watch.charged_rows:
        extra["trl_rollouts"] = (f"{cb.watch.charged_rows} rows generated outside the hooked model (vLLM, "
                                 f"continuous batching or rollout_func), {ROLLOUT_NOTE}")
    if cb.ledgers is not None and cb.ledgers.world > 1:
        extra["processes"] = cb.ledgers.world
    extra["rollout_location"] = cb.rollout_location
    extra.update({**cb.card_extra, **meta.pop("extra", {})})
    card = ReportCard.from_ledger(
        cb.ledger, conventions=cb.conventions, model=meta.pop("model", cb.model_name or cb.shape.name),
        model_params=meta.pop("model_params", cb.shape.num_params()),
        lora_rank=cb.lora.rank if cb.lora is not None else None,
        num_generations=cb.plan.num_generations, extra=extra, **meta)
    card.conventions_text = f"{card.conventions_text}; {TRL_CONVENTIONS_NOTE}"
    return card


__all__ = ["dataset_prompt_bound", "keep_work", "model_peak", "report_card", "rollout_location", "time_weight_sync",
           "trainer_plan", "utilisation_logs", "TablePeak"]
