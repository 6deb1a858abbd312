"""The artefact cache: ``<cache>/<kind>/<name>-<recipe hash>/`` with an ``info.json``.

A recipe hash is 12 hex digits of SHA-256 over a canonical JSON payload that each builder
chooses (recipe fields, model config, tokenizer alphabet, code version): a changed recipe
builds a new directory, an unchanged one is reused. A build writes into a temporary
sibling directory and renames it into place, so concurrent builders never see half an
artefact. What is cached is decided by the caller; this module knows nothing of models.
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
        if not _complete(final):
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

    @staticmethod
    def publish(final: Path, info: dict[str, Any], write: Callable[[Path], None]) -> None:
        """Write an artefact: ``write(tmp)`` fills a temporary directory, ``info`` goes to
        its ``info.json``, then it is renamed over ``final``."""
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)

    def build_or_reuse(self, final: Path, read: Callable[[Path], Info | None], build: Callable[[], Info],
                       force: bool = False) -> Info:
        """The cached artefact at ``final`` (``read``), else ``build()``'s (which publishes)."""
        if not force:
            info = read(final)
            if info is not None:
                return info
        return build()


def _complete(path: Path) -> bool:
    return (path / INFO_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


#: Where the package ships prebuilt artefacts: ``race/data/artefacts/<kind>/<name>-<hash>/``.
PACKAGED = Path(__file__).resolve().parents[1] / "data" / "artefacts"


def packaged_dir(kind: str, dirname: str) -> Path | None:
    """The packaged artefact ``<kind>/<dirname>`` (``$RACE_NO_PACKAGED=1``: none)."""
    if os.environ.get("RACE_NO_PACKAGED", "") not in ("", "0"):
        return None
    path = PACKAGED / kind / dirname
    return path if _complete(path) else None


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
    if final.exists() and not _complete(final):
        shutil.rmtree(final, ignore_errors=True)  # a damaged artefact: replace it
    try:
        os.replace(tmp, final)
    except OSError:  # another process installed it first
        shutil.rmtree(tmp, ignore_errors=True)
        if not _complete(final):
            raise


def build_each(names: list[str], build: Callable[..., Info],
               progress: Callable[[str, int, int, float], None] | None = None, **kwargs: Any) -> list[Info]:
    """``build(name, progress=..., **kwargs)`` for each name, with ``progress(name, step,
    steps, loss)`` turned into each build's ``progress(step, steps, loss)``."""
    out = []
    for name in names:
        cb = (lambda s, n, loss, _name=name: progress(_name, s, n, loss)) if progress else None
        out.append(build(name, progress=cb, **kwargs))
    return out


__all__ = ["ArtefactCache", "INFO_FILE", "PACKAGED", "build_each", "cache_root", "install_packaged", "packaged_dir",
           "recipe_digest"]
