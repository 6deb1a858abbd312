"""Model references -> ``ModelShape``: the one place a model name becomes a shape.

A reference is a tiny-family name (``tiny-s``), an imported model (``smollm2-135m``,
after ``race base import smollm2``), a Qwen2.5 preset (``qwen2.5-7b``), a
``config.json`` path, a model directory or a Hugging Face hub name (``Qwen/Qwen2.5-0.5B``)
already in the local hub cache; :func:`resolve_shape` reads it without torch or network
(``race flops``, ``race plan``, the grid's dry run). :func:`model_shape` reads the shape of
a model already loaded (PEFT-wrapped or not).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from race.accounting import AccountingError, ModelShape, preset_names
from race.accounting.shapes import preset_shape
from race.models.family import TINY_FAMILY, is_tiny_name, tiny_shape
from race.models.imported import imported_path, is_imported_name


def looks_like_path(ref: str) -> bool:
    """Whether a model or reward-model reference names a file or directory: ``./x``,
    ``../x``, ``/abs``, ``~/x`` or ``x.json``, or anything that exists on disk. A hub name
    (``Qwen/Qwen2.5-0.5B``), a preset or a tiny-family name that is not a local path is
    not one. The one rule of "is this a path?" (policies, reward models, shapes)."""
    return ref.startswith((".", "/", "~")) or ref.endswith(".json") or Path(ref).expanduser().exists()


def resolve_shape(ref: str) -> ModelShape:
    """A Qwen2.5 preset name, a tiny-family name, a config.json path, an HF model
    directory or a hub name in the local hub cache -> its ``ModelShape``;
    ``AccountingError`` says what to pass instead (never touches the network)."""
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
    if is_imported_name(ref):
        try:
            return ModelShape.from_hf_config(imported_path(ref) / "config.json", name=ref)
        except FileNotFoundError as err:  # NotBuiltError: says which command imports it
            raise AccountingError(str(err)) from None
    try:
        return preset_shape(ref)
    except AccountingError:
        pass
    if looks_like_hub_name(ref):
        found = cached_hub_config(ref)
        if found is None:
            raise AccountingError(
                f"model {ref!r}: not in the local Hugging Face cache ({hub_cache_dir()}); RACE reads hub "
                "configs from the cache only (no network): download it first (e.g. `huggingface-cli download "
                f"{ref} config.json`) or pass a preset, a config.json path or a model directory") from None
        return ModelShape.from_hf_config(found, name=ref)
    raise AccountingError(
        f"unknown model {ref!r}: use a preset ({', '.join(preset_names())}), a tiny-family name, "
        "a config.json path, a model directory or a hub name (org/name) in the local Hugging Face cache")


def looks_like_hub_name(ref: str) -> bool:
    """``org/name`` that is not a path (:func:`looks_like_path`): a Hugging Face hub repository id."""
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not looks_like_path(ref) and " " not in ref


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (the layout huggingface_hub uses)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def cached_hub_config(repo_id: str) -> Path | None:
    """``config.json`` of hub model ``repo_id`` in the local cache, or None: the snapshot
    ``refs/main`` points at when it holds one, else the newest snapshot that does."""
    repo = hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return None
    main = repo / "refs" / "main"
    if main.is_file():
        cfg = snaps / main.read_text().strip() / "config.json"
        if cfg.is_file():
            return cfg
    found = [d / "config.json" for d in snaps.iterdir() if (d / "config.json").is_file()]
    return max(found, key=lambda c: c.stat().st_mtime) if found else None


def model_shape(model: Any) -> ModelShape:
    """The ``ModelShape`` of a loaded causal LM (PEFT-wrapped or not; a multimodal config
    contributes its text config), named after ``_name_or_path``."""
    get = getattr(model, "get_base_model", None)
    cfg = (get() if callable(get) else model).config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return ModelShape.from_hf_config(text.to_dict(), name=str(getattr(cfg, "_name_or_path", "") or "") or None)


__all__ = ["cached_hub_config", "hub_cache_dir", "looks_like_hub_name", "looks_like_path", "model_shape", "resolve_shape", "tiny_shape"]
