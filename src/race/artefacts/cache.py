"""Where a cached artefact lives: ``<cache>/<kind>/<name>-<recipe hash>/`` with an ``info.json``.

A recipe hash is 12 hex digits of SHA-256 over a canonical JSON payload that each recipe
chooses (recipe fields, model config, tokenizer alphabet, code version): a changed recipe
has a new directory, an unchanged one is found again. The package ships some artefacts
prebuilt (:data:`PACKAGED`); :meth:`ArtefactCache.directory` installs such a copy into the
cache. Whether an artefact is built is :meth:`ArtefactCache.read_info` (``None``: not
built); a missing one raises :class:`NotBuiltError` from the loaders, naming the command
that builds it. Building (and the atomic publish) is :mod:`race.builds`'s job; this module
only finds, and knows nothing of models.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

Info = TypeVar("Info")


class NotBuiltError(FileNotFoundError):
    """An artefact (a warm start, a reward model) is not in the cache: the message names
    the command that builds it (``race base build``, ``race rm build``); a run builds what
    it needs itself (:mod:`race.builds`)."""
#: The file every artefact directory holds besides its weights.
INFO_FILE = "info.json"
WEIGHTS_FILE = "model.safetensors"


def cache_root(override: str | os.PathLike[str] | None = None) -> Path:
    """RACE's cache root: ``override`` if given, else ``$RACE_CACHE``, else ``~/.cache/race``.
    Warm starts live under ``<cache>/base/``, reward models under ``<cache>/rm/``."""
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get("RACE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "race"


def recipe_digest(payload: dict[str, Any]) -> str:
    """12 hex digits of SHA-256 over ``payload`` as canonical JSON (sorted keys, no spaces)."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ArtefactCache:
    """The cache of one kind of artefact (``base``, ``rm``)."""

    kind: str

    def directory(self, name: str, digest: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
        """``<cache>/<kind>/<name>-<digest>``. When it holds no complete artefact and the
        package ships one under the same name AND recipe hash (:func:`packaged_dir`), that
        copy is installed there first, so a fresh clone skips the build; a changed recipe
        has another hash and builds as before (``race base build --force`` rebuilds)."""
        final = cache_root(cache_dir) / self.kind / f"{name}-{digest}"
        if not is_complete(final):
            src = packaged_dir(self.kind, final.name)
            if src is not None:
                install_packaged(src, final)
        return final

    @staticmethod
    def read_info(path: Path, make: Callable[[dict[str, Any]], Info]) -> Info | None:
        """``make(info.json)`` when ``path`` holds a complete artefact (info and weights),
        else ``None`` (missing, unreadable or half-written)."""
        try:
            data = json.loads((Path(path) / INFO_FILE).read_text())
            if not (Path(path) / WEIGHTS_FILE).is_file():
                return None
            return make(data)
        except (OSError, ValueError, TypeError):
            return None


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a whole artefact (its ``info.json`` and its weights)."""
    return (path / INFO_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


#: Where the package ships prebuilt artefacts: ``race/data/artefacts/<kind>/<name>-<hash>/``.
PACKAGED = Path(__file__).resolve().parents[1] / "data" / "artefacts"


def packaged_dir(kind: str, dirname: str) -> Path | None:
    """The packaged artefact ``<kind>/<dirname>`` (``$RACE_NO_PACKAGED=1``: none)."""
    if os.environ.get("RACE_NO_PACKAGED", "") not in ("", "0"):
        return None
    path = PACKAGED / kind / dirname
    return path if is_complete(path) else None


def install_packaged(src: Path, final: Path) -> None:
    """Copy a packaged artefact into the cache atomically (temporary sibling, rename), its
    ``info.json`` saying where it now lives."""
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tmp)
    info = json.loads((tmp / INFO_FILE).read_text())
    info["path"] = str(final)  # no other key: the builders read info.json back into their dataclasses
    (tmp / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    if final.exists() and not is_complete(final):
        shutil.rmtree(final, ignore_errors=True)  # a damaged artefact: replace it
    try:
        os.replace(tmp, final)
    except OSError:  # another process installed it first
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_complete(final):
            raise


__all__ = ["ArtefactCache", "INFO_FILE", "NotBuiltError", "PACKAGED", "WEIGHTS_FILE", "cache_root", "install_packaged",
           "is_complete", "packaged_dir", "recipe_digest"]
