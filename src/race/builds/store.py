"""Publishing a built artefact into the cache (``race.artefacts`` finds it there).

A build writes into a temporary sibling directory and renames it into place, so
concurrent builders never see half an artefact; an artefact already built is reused.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from race.artefacts.cache import INFO_FILE

Info = TypeVar("Info")


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


def build_or_reuse(final: Path, read: Callable[[Path], Info | None], build: Callable[[], Info],
                   force: bool = False) -> Info:
    """The cached artefact at ``final`` (``read``), else ``build()``'s (which publishes)."""
    if not force:
        info = read(final)
        if info is not None:
            return info
    return build()


__all__ = ["build_or_reuse", "publish"]
