"""Model references -> ``ModelShape``: the one place a model name becomes a shape.

A reference is a tiny-family name (``tiny-s``), a Qwen2.5 preset (``qwen2.5-7b``), a
``config.json`` path or a model directory; :func:`resolve_shape` reads it without torch
(``race flops``, ``race plan``, the grid's dry run). :func:`model_shape` reads the shape of
a model already loaded (PEFT-wrapped or not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from race.accounting import AccountingError, ModelShape, preset_names
from race.accounting.shapes import preset_shape
from race.models.family import TINY_FAMILY, is_tiny_name, tiny_config_kwargs


def looks_like_path(ref: str) -> bool:
    """``./x``, ``/x``, ``~/x`` or ``*.json``: the user meant a file or directory."""
    return ref.startswith((".", "/", "~")) or ref.endswith(".json")


def resolve_shape(ref: str) -> ModelShape:
    """A Qwen2.5 preset name, a tiny-family name, a config.json path or an HF model
    directory -> its ``ModelShape``; ``AccountingError`` says what to pass instead."""
    p = Path(ref).expanduser()
    if p.exists():
        return ModelShape.from_hf_config(p)
    if looks_like_path(ref):
        raise AccountingError(f"model {ref!r}: file not found (pass an existing config.json or model directory, "
                              "a preset or a tiny-family name)")
    if ref.startswith("tiny-"):
        if not is_tiny_name(ref):
            raise AccountingError(f"unknown tiny model {ref!r}; the family is {', '.join(TINY_FAMILY)}")
        return tiny_shape(ref)
    try:
        return preset_shape(ref)
    except AccountingError:
        raise AccountingError(
            f"unknown model {ref!r}: use a preset ({', '.join(preset_names())}), a tiny-family name, "
            "a config.json path or a model directory"
        ) from None


def tiny_shape(name: str) -> ModelShape:
    """``ModelShape`` of tiny-family size ``name`` from its config alone."""
    return ModelShape.from_hf_config(dict(tiny_config_kwargs(name), model_type="qwen2"), name=name)


def model_shape(model: Any) -> ModelShape:
    """The ``ModelShape`` of a loaded causal LM (PEFT-wrapped or not; a multimodal config
    contributes its text config), named after ``_name_or_path``."""
    get = getattr(model, "get_base_model", None)
    cfg = (get() if callable(get) else model).config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return ModelShape.from_hf_config(text.to_dict(), name=str(getattr(cfg, "_name_or_path", "") or "") or None)


__all__ = ["looks_like_path", "model_shape", "resolve_shape", "tiny_shape"]
