"""Engines: the built-in GRPO loop and the TRL adapter. They share a Protocol (not a base
class), the run-directory writer (``common.py``) and the run directory they write
(docs/run-format.md); :func:`run_engine` picks one by name from :data:`ENGINES`."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, Protocol

from race.spec.run import RunConfig

Progress = Callable[[dict[str, Any]], None]


class Engine(Protocol):
    """What an engine is: built from ``(cfg, run_dir, progress)``, ``run()`` trains (or
    resumes) into the run directory and returns its run.json dict."""

    name: str

    def run(self) -> dict[str, Any]: ...


class EngineLifecycle(Protocol):
    """An engine's lifecycle in stages, for what composes runs (the gang,
    ``race.engines.gang``), so a composer drives each run through these and never through
    its state or books. ``run()`` is the same stages in order for one run:

    - setup: ``prepare()`` (the run directory opened; policy, task, reward, optimizer,
      evaluator, step plan; ``model`` is then the policy);
    - begin: ``begin()`` for a fresh run, or ``resume_from(meta, step, total_steps)`` after
      the composer restored the weights from its checkpoint (``meta``: :meth:`save_meta`'s);
    - step: ``may_step(step, bound)`` (the budgets the run passes, then whether a step of
      ``bound`` FLOPs may start), ``evaluate(step)`` when ``eval_due()``;
      (``last_eval_step``: the last evaluation's step);
    - save: ``save_meta()`` (what a checkpoint records of the run's files) and
      ``checkpoint(step)`` (the run's own checkpoint);
    - finish: ``finish(step, status, stop_reason, error, wall)`` returns run.json's dict.
    """

    cfg: RunConfig
    run_dir: Path

    @property
    def total_steps(self) -> int: ...  # the lr schedule's length (once begun)

    @property
    def model(self) -> Any: ...  # the policy being trained (once set up)

    @property
    def last_eval_step(self) -> int: ...

    def prepare(self) -> None: ...

    def begin(self) -> None: ...

    def resume_from(self, meta: dict[str, Any], step: int, total_steps: int) -> None: ...

    def may_step(self, step: int, bound: int) -> bool: ...

    def eval_due(self) -> bool: ...

    def evaluate(self, step: int) -> list[dict[str, Any]]: ...

    def save_meta(self) -> dict[str, Any]: ...

    def checkpoint(self, step: int) -> None: ...

    def finish(self, step: int, status: str, stop_reason: str, error: str | None, wall: float) -> dict[str, Any]: ...


EngineFactory = Callable[[RunConfig, Path, "Progress | None"], Engine]

#: Engines by name: ``"module:Class"`` (imported on first use; the engines' modules load
#: torch/trl) or a factory registered with :func:`register_engine`.
ENGINES: dict[str, str | EngineFactory] = {
    "builtin": "race.engines.builtin:BuiltinEngine",
    "trl": "race.engines.trl.engine:TrlEngine",
}


def register_engine(name: str, factory: EngineFactory) -> None:
    """Make ``engine: NAME`` runs use ``factory(cfg, run_dir, progress)``."""
    ENGINES[name] = factory


def engine_for(name: str) -> EngineFactory:
    """The factory of engine ``name``."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; use one of {', '.join(ENGINES)}")
    entry = ENGINES[name]
    if isinstance(entry, str):
        module, attr = entry.split(":")
        entry = ENGINES[name] = getattr(importlib.import_module(module), attr)
    return entry


def run_engine(cfg: RunConfig, run_dir: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir`` with the engine it names; resume if a checkpoint is
    there; return the run.json dict (the stored one when the run is already complete).
    The metrics rows also go to the run's ``log_to`` sinks (``race train`` and grid cells
    alike; ``race.engines.sinks``)."""
    from race.engines.sinks import LazySink

    sink = LazySink(cfg, Path(run_dir), progress)
    try:
        engine: Engine = engine_for(cfg.engine)(cfg, Path(run_dir), sink if cfg.log_to else progress)
        return engine.run()
    finally:
        sink.close()


__all__ = ["ENGINES", "Engine", "EngineFactory", "EngineLifecycle", "engine_for", "register_engine", "run_engine"]
