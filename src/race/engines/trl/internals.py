"""Every TRL internal the drop-in ledger reads, in one place, checked against TRL's version.

The ledger uses TRL's public surface where there is one (``GRPOConfig``, the callback
events, ``rollout_func``, ``reward_funcs``). Four things have no public surface in TRL
1.16 and are read here only:

- ``GRPOTrainer._step``: the micro-step counter that decides when TRL generates (the step
  bound reads it, because it restarts on resume);
- ``GRPOTrainer._buffered_inputs``: whether a generated batch is buffered;
- ``GRPOTrainer._generate_single_turn``: one generation call (prompt ids in, completion
  ids out) whatever runs it: ``model.generate``, vLLM (colocate or server) or
  transformers' continuous batching. The ledger wraps it to charge what bypasses the
  hooked model from the token counts;
- ``trl.kernels.chunked_logprob._use_triton`` and the ``fused_lm_head`` keyword TRL passes
  to the model: where TRL's fused LM head computes logits.

:func:`check_trl` refuses a TRL older than the one these were written for, and a newer one
that lacks any of them, saying what is missing and what to do.
"""

from __future__ import annotations

from typing import Any, Callable

from race.accounting.errors import AccountingError

#: TRL release these internals were read from (tests run against it).
TESTED_TRL = (1, 16)
#: the keyword TRL passes to the causal LM's forward when its fused head runs.
FUSED_HEAD_KWARG = "fused_lm_head"
_TRAINER_ATTRS = ("_step", "_buffered_inputs", "_generate_single_turn")


def _version(text: str) -> tuple[int, int]:
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def check_trl(trainer: Any = None, version: str | None = None) -> None:
    """Refuse a TRL the ledger cannot read: older than 1.16, or (any version) a trainer
    without the internals listed in this module's docstring."""
    if version is None:
        import trl

        version = str(trl.__version__)
    if _version(version) < TESTED_TRL:
        raise AccountingError(f"RACE's TRL ledger needs trl >= {TESTED_TRL[0]}.{TESTED_TRL[1]} (it reads GRPOTrainer "
                              f"internals of that release); found trl {version}: upgrade trl")
    if trainer is None:
        return
    missing = [a for a in _TRAINER_ATTRS if not hasattr(trainer, a)]
    if missing:
        raise AccountingError(
            f"trl {version}: GRPOTrainer has no {', '.join(missing)} (RACE's TRL ledger was written against trl "
            f"{TESTED_TRL[0]}.{TESTED_TRL[1]} and reads them, see race.engines.trl.internals); install "
            f"trl=={TESTED_TRL[0]}.{TESTED_TRL[1]}.* or a RACE release that supports trl {version}")


def micro_step(trainer: Any) -> int | None:
    """TRL's micro-step counter (``training_step`` calls so far), or None without one."""
    step = getattr(trainer, "_step", None)
    return int(step) if step is not None else None


def has_buffered_batch(trainer: Any) -> bool:
    """Whether TRL holds a generated batch for the coming micro-steps."""
    return getattr(trainer, "_buffered_inputs", None) is not None


def compact_head(lm: Any) -> bool:
    """Whether TRL's fused LM head keeps only the completion tokens (Triton on CUDA/XPU)
    for this model's head; elsewhere it runs at every position but the last."""
    try:
        from trl.kernels.chunked_logprob import _use_triton
    except ImportError:  # pragma: no cover - TRL without the fused head
        return False
    head = lm.get_output_embeddings()
    return bool(_use_triton(head.weight.device)) if head is not None else False


GenerationObserver = Callable[[Callable[..., Any], tuple, dict], Any]


def wrap_generation(trainer: Any, observe: GenerationObserver) -> Callable[[], None]:
    """Route every ``trainer._generate_single_turn(prompt_ids, ...)`` call through
    ``observe(original, args, kwargs)`` (which must call ``original`` and return its
    result); returns the function that undoes it."""
    had = "_generate_single_turn" in trainer.__dict__
    saved = trainer.__dict__.get("_generate_single_turn")
    original = trainer._generate_single_turn

    def generate_single_turn(*args: Any, **kwargs: Any) -> Any:
        return observe(original, args, kwargs)

    trainer._generate_single_turn = generate_single_turn

    def undo() -> None:
        if had:
            trainer._generate_single_turn = saved
        else:
            trainer.__dict__.pop("_generate_single_turn", None)

    return undo


__all__ = ["FUSED_HEAD_KWARG", "TESTED_TRL", "check_trl", "compact_head", "has_buffered_batch", "micro_step",
           "wrap_generation"]
