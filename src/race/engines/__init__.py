"""Engines: the built-in GRPO loop and the TRL adapter. They share a Protocol (not a base
class) and write the same run directory (docs/run-format.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

from race.spec.run import RunConfig


class Engine(Protocol):
    name: str

    def run(self) -> dict[str, Any]: ...


def run_engine(cfg: RunConfig, run_dir: str | Path, progress: Callable[[dict[str, Any]], None] | None = None
               ) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir`` with the engine it names; resume if a checkpoint is
    there; return the run.json dict (the stored one when the run is already complete)."""
    if cfg.engine == "builtin":
        from race.engines.builtin import run_builtin

        return run_builtin(cfg, Path(run_dir), progress)
    if cfg.engine == "trl":
        from race.engines.trl import run_trl

        return run_trl(cfg, Path(run_dir), progress)
    raise ValueError(f"unknown engine {cfg.engine!r}; use builtin or trl")


__all__ = ["Engine", "run_engine"]
