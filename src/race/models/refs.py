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
from dataclasses import replace
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
                f"model {ref!r}: not a folder here ({Path.cwd()}) and not in the local Hugging Face cache "
                f"({hub_cache_dir()}); RACE reads hub configs from the cache only (no network): download it first "
                f"(e.g. `{hub_download_command(ref, 'config.json')}`), or fix the folder's path (./{ref} when it is "
                "one), or pass a preset or a config.json path") from None
        return ModelShape.from_hf_config(found, name=ref)
    raise AccountingError(
        f"unknown model {ref!r}: use a preset ({', '.join(preset_names())}), a tiny-family name, "
        "a config.json path, a model directory or a hub name (org/name) in the local Hugging Face cache")


def looks_like_hub_name(ref: str) -> bool:
    """``org/name`` that is not a path (:func:`looks_like_path`): a Hugging Face hub repository id."""
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not looks_like_path(ref) and " " not in ref


def hub_download_command(repo_id: str, *files: str) -> str:
    """The command that downloads hub model ``repo_id`` (or some of its ``files``) with the
    CLI the installed ``huggingface_hub`` ships: ``hf download`` (huggingface_hub >= 0.34),
    else ``huggingface-cli download`` (older releases), else how to install it."""
    from importlib import metadata

    try:
        scripts = {e.name for e in metadata.distribution("huggingface_hub").entry_points
                   if e.group == "console_scripts"}
    except metadata.PackageNotFoundError:
        scripts = set()
    args = " ".join((repo_id, *files))
    if "hf" in scripts:
        return f"hf download {args}"
    if "huggingface-cli" in scripts:
        return f"huggingface-cli download {args}"
    return f"pip install huggingface_hub && hf download {args}"


#: Qwen2.5 preset size -> the size as the hub repositories spell it.
_HUB_SIZES = {"0.5b": "0.5B", "1.5b": "1.5B", "3b": "3B", "7b": "7B", "14b": "14B", "32b": "32B", "72b": "72B"}


def preset_hub_id(preset: str) -> str | None:
    """The hub repository of a Qwen2.5 preset (``qwen2.5-0.5b`` -> ``Qwen/Qwen2.5-0.5B``,
    ``qwen2.5-7b-instruct`` -> ``Qwen/Qwen2.5-7B-Instruct``), None for another name."""
    key = preset.strip().lower()
    instruct = key.endswith("-instruct")
    size = key.removesuffix("-instruct").removeprefix("qwen2.5-")
    if not key.startswith("qwen2.5-") or size not in _HUB_SIZES:
        return "Qwen/Qwen2.5-Math-PRM-7B" if key == "qwen2.5-math-prm-7b" else None
    return f"Qwen/Qwen2.5-{_HUB_SIZES[size]}" + ("-Instruct" if instruct else "")


def hub_preset(repo_id: str) -> str | None:
    """The Qwen2.5 preset whose shapes hub model ``repo_id`` has (``Qwen/Qwen2.5-0.5B`` and
    ``Qwen/Qwen2.5-0.5B-Instruct`` -> ``qwen2.5-0.5b``), None for another name: a plan prices a
    Qwen2.5 model that is not downloaded yet from the preset (the base and instruct models
    share their shapes)."""
    parts = repo_id.split("/")
    if len(parts) != 2 or parts[0].lower() != "qwen":
        return None
    for size in _HUB_SIZES:
        for suffix in ("", "-instruct"):
            if parts[1].lower() == f"qwen2.5-{size}{suffix}":
                return f"qwen2.5-{size}"
    return None


def plan_shape(ref: str) -> ModelShape:
    """:func:`resolve_shape`, except that a Qwen2.5 hub model not in the local cache is read
    from its preset (:func:`hub_preset`): what a plan prices before the weights are there."""
    try:
        return resolve_shape(ref)
    except AccountingError:
        preset = hub_preset(ref) if looks_like_hub_name(ref) else None
        if preset is None:
            raise
        return replace(preset_shape(preset), name=ref)


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


__all__ = ["cached_hub_config", "hub_cache_dir", "hub_download_command", "hub_preset", "looks_like_hub_name",
           "looks_like_path", "model_shape", "plan_shape", "preset_hub_id", "resolve_shape", "tiny_shape"]
