"""Every TRL internal the drop-in ledger reads, in one place, checked against TRL's version.

The ledger uses TRL's public surface where there is one (``GRPOConfig``, the callback
events, ``rollout_func``, ``reward_funcs``); it counts TRL's micro-steps from the callback
events (``on_substep_end`` + ``on_step_end``: one per ``training_step`` call, as TRL's
private ``_step``). Four things have no public surface in TRL 1.16 and are read here only:

- ``GRPOTrainer._buffered_inputs``: whether a generated batch is buffered;
- ``GRPOTrainer._generate_single_turn(prompt_ids, images, multimodal_fields,
  num_generations, ...)``: one generation call (prompt ids in, completion ids out) whatever
  runs it: ``model.generate``, vLLM (colocate or server) or transformers' continuous
  batching. The ledger wraps it to charge what bypasses the hooked model from the token
  counts; its signature is checked with ``inspect.signature`` (it changed between TRL
  releases);
- ``GRPOTrainer.vllm_generation.sync_weights()`` (vLLM only): timed apart from generation;
- ``trl.kernels.chunked_logprob._use_triton`` and the ``fused_lm_head`` keyword TRL passes
  to the model: where TRL's fused LM head computes logits.

:func:`check_trl` refuses a TRL older than the one these were written for, and any that
lacks one of them or calls it differently, saying what is missing and what to do; it warns
once on a minor version the tests have not run against, naming the version to pin.
"""

from __future__ import annotations

from typing import Any, Callable

from race.accounting.errors import AccountingError

#: TRL release these internals were read from (tests run against it).
TESTED_TRL = (1, 16)
#: the keyword TRL passes to the causal LM's forward when its fused head runs.
FUSED_HEAD_KWARG = "fused_lm_head"
_TRAINER_ATTRS = ("_buffered_inputs", "_generate_single_turn")
#: the leading parameters of ``_generate_single_turn`` the ledger relies on (it reads ``prompt_ids``).
GENERATION_PARAMS = ("prompt_ids", "images", "multimodal_fields", "num_generations")
_warned_versions: set[str] = set()


def _version(text: str) -> tuple[int, int]:
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def _pin() -> str:
    return f"trl=={TESTED_TRL[0]}.{TESTED_TRL[1]}.*"


def _generation_params(trainer: Any) -> list[str] | None:
    """Parameter names of ``trainer._generate_single_turn`` (without ``self``): the first
    definition along the class's MRO that names them (a subclass's ``(*args, **kwargs)``
    override passes them on to the next); None when none can be read."""
    import inspect

    candidates = [trainer._generate_single_turn]
    candidates += [c.__dict__["_generate_single_turn"] for c in type(trainer).__mro__
                   if "_generate_single_turn" in c.__dict__]
    for fn in candidates:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # a builtin or C callable: nothing to read
            continue
        if params and params[0].name == "self":
            params = params[1:]
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params[:len(GENERATION_PARAMS)]):
            continue  # an override that passes its arguments on (``(prompt_ids, *args, **kwargs)``)
        return [p.name for p in params]
    return None


def check_trl(trainer: Any = None, version: str | None = None) -> None:
    """Refuse a TRL the ledger cannot read: older than 1.16, or (any version) a trainer
    without the internals listed in this module's docstring or whose
    ``_generate_single_turn`` takes other parameters; warn once per version on an untested
    minor version (what to pin)."""
    import warnings

    if version is None:
        import trl

        version = str(trl.__version__)
    if _version(version) < TESTED_TRL:
        raise AccountingError(f"RACE's TRL ledger needs trl >= {TESTED_TRL[0]}.{TESTED_TRL[1]} (it reads GRPOTrainer "
                              f"internals of that release); found trl {version}: upgrade trl")
    if _version(version) != TESTED_TRL and version not in _warned_versions:
        _warned_versions.add(version)
        warnings.warn(f"RACE's TRL ledger was tested with trl {TESTED_TRL[0]}.{TESTED_TRL[1]}; found trl {version}. "
                      f"It reads GRPOTrainer internals (race.engines.trl.internals) that may behave differently: if "
                      f"the ledger looks wrong, pin {_pin()} (pip install '{_pin()}')", stacklevel=3)
    if trainer is None:
        return
    missing = [a for a in _TRAINER_ATTRS if not hasattr(trainer, a)]
    if missing:
        raise AccountingError(
            f"trl {version}: GRPOTrainer has no {', '.join(missing)} (RACE's TRL ledger was written against trl "
            f"{TESTED_TRL[0]}.{TESTED_TRL[1]} and reads them, see race.engines.trl.internals); install "
            f"{_pin()} or a RACE release that supports trl {version}")
    params = _generation_params(trainer)
    if params is not None and tuple(params[:len(GENERATION_PARAMS)]) != GENERATION_PARAMS:
        raise AccountingError(
            f"trl {version}: GRPOTrainer._generate_single_turn{tuple(params)} does not take "
            f"({', '.join(GENERATION_PARAMS)}, ...) as trl {TESTED_TRL[0]}.{TESTED_TRL[1]} does, and RACE's TRL ledger "
            f"reads its prompt_ids; install {_pin()} or a RACE release that supports trl {version}")


def micro_step(trainer: Any) -> int | None:
    """TRL's private micro-step counter (``training_step`` calls so far), or None without
    one: for cross-checks only (the ledger counts micro-steps from callback events)."""
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


__all__ = ["FUSED_HEAD_KWARG", "GENERATION_PARAMS", "TESTED_TRL", "check_trl", "compact_head", "has_buffered_batch",
           "micro_step", "wrap_generation"]
