"""LoRA wrapping with real PEFT, and the LoRA reference policy.

:func:`wrap_lora` turns a causal LM into a ``peft.PeftModel`` from
:class:`race.spec.run.LoraSettings` (PEFT's own names: ``r``, ``lora_alpha``,
``lora_dropout``, ``target_modules``). Before PEFT sees the settings it checks that every
target names at least one linear layer and that the rank fits each targeted matrix
(``r <= min(in_features, out_features)``): a rank above that adds parameters and FLOPs
without adding expressiveness, and the accounting would charge for it.

With LoRA the GRPO reference policy is the base model with the adapter switched off
(docs/design.md section 2): :func:`reference_policy` is that switch, so no second copy of the
weights is kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from race.models.family import count_params


def targeted_linears(model: Any, target_modules: list[str]) -> dict[str, Any]:
    """``{qualified name: nn.Linear}`` for every linear layer whose last name component is
    in ``target_modules`` (PEFT's suffix matching for plain names)."""
    import torch.nn as nn

    wanted = set(target_modules)
    return {name: mod for name, mod in model.named_modules()
            if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in wanted}


def validate_lora(model: Any, settings: Any) -> None:
    """Raise ``ValueError`` when a target matches no linear layer or ``r`` exceeds
    ``min(in_features, out_features)`` of a targeted matrix."""
    found = targeted_linears(model, list(settings.target_modules))
    present = {n.rsplit(".", 1)[-1] for n in found}
    missing = [t for t in settings.target_modules if t not in present]
    if missing:
        raise ValueError(f"LoRA target_modules {missing} match no linear layer of this model; "
                         f"it has {sorted(present) or 'none of the requested ones'}: remove them from lora.target_modules")
    too_small = {n: (m.in_features, m.out_features) for n, m in found.items()
                 if settings.r > min(m.in_features, m.out_features)}
    if too_small:
        name, (fan_in, fan_out) = next(iter(too_small.items()))
        limit = min(min(s) for s in too_small.values())
        raise ValueError(
            f"LoRA rank r={settings.r} exceeds min(in, out) of {len(too_small)} targeted matri"
            f"{'x' if len(too_small) == 1 else 'ces'}, e.g. {name} ({fan_in} -> {fan_out}): set lora.r <= {limit} "
            "or drop those modules from lora.target_modules")


def wrap_lora(model: Any, settings: Any) -> Any:
    """Wrap ``model`` in a PEFT LoRA adapter described by ``settings``
    (:class:`race.spec.run.LoraSettings` or anything with the same attributes).

    Only the adapter is trainable afterwards. Adapter initialisation follows PEFT
    (``B = 0``), so the wrapped model's outputs equal the base model's until training.
    """
    from peft import LoraConfig, get_peft_model

    validate_lora(model, settings)
    config = LoraConfig(
        r=int(settings.r),
        lora_alpha=float(settings.lora_alpha),
        lora_dropout=float(settings.lora_dropout),
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )
    import warnings

    with warnings.catch_warnings():
        # PEFT reads transformers' deprecated `is_gradient_checkpointing` (transformers 5.x);
        # a library-internal FutureWarning that says nothing about the user's run.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


def is_peft(model: Any) -> bool:
    """True when ``model`` is a PEFT wrapper (has adapters that can be disabled)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


@contextlib.contextmanager
def reference_policy(model: Any) -> Iterator[Any]:
    """Context in which ``model`` computes the REFERENCE policy: the base weights with the
    LoRA adapter disabled, under ``torch.no_grad()`` (reference log-probs never need
    gradients). Yields the same model object::

        with reference_policy(policy) as ref:
            ref_logits = ref(input_ids).logits

    Full fine-tuning has no adapter to switch off; keep a frozen copy of the initial
    model as the reference instead (this helper refuses rather than returning the
    moving policy).
    """
    import torch

    if not is_peft(model):
        raise TypeError("reference_policy() needs a PEFT (LoRA) model; for full fine-tuning keep a frozen "
                        "copy of the initial weights (copy.deepcopy(model).eval()) as the reference")
    with model.disable_adapter(), torch.no_grad():
        yield model


def trainable_params(model: Any) -> int:
    """Number of parameters with ``requires_grad`` (the LoRA adapter after wrapping)."""
    return count_params(p for p in model.parameters() if p.requires_grad)
