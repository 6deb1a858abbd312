"""Engines: the built-in GRPO loop and the TRL adapter. They share a Protocol (not a base
class), the run-directory writer (``common.py``) and the run directory they write
(docs/run-format.md); :func:`run_engine` picks one by name from :data:`ENGINES`."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from race.spec.run import RunConfig

if TYPE_CHECKING:
    from race.accounting import PolicyCost
    from race.engines.builtin.step_parts import Scored, UpdatePlan
    from race.engines.sampling import Rollout, SampleArgs

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
      the composer restored the weights from its checkpoint with ``read_checkpoint(ckpt)``
      (which returns ``meta``: what :meth:`save_meta` gave when it was written);
    - step: ``may_step(step, bound)`` (the budgets the run passes, then whether a step of
      ``bound`` FLOPs may start), ``evaluate(step)`` when ``eval_due()``;
      (``last_eval_step``: the last evaluation's step);
    - save: ``save_meta()`` (what a checkpoint records of the run's files),
      ``write_checkpoint(directory, step, meta)`` (the policy's trainable weights and the
      optimizer's state, with ``meta``, into a directory the composer chooses) and
      ``checkpoint(step)`` (the run's own checkpoint, in its run directory);
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

    def write_checkpoint(self, directory: Path, step: int, meta: dict[str, Any]) -> None: ...

    def read_checkpoint(self, ckpt: Path) -> dict[str, Any]: ...

    def checkpoint(self, step: int) -> None: ...

    def finish(self, step: int, status: str, stop_reason: str, error: str | None, wall: float) -> dict[str, Any]: ...


class StepMember(EngineLifecycle, Protocol):
    """A run as a member of a step that a composer batches over several runs (the gang's,
    ``race.engines.gang.step``). The composer stacks the members' policies (``model``) and
    runs the numerical passes over all of them at once (the rollout's decode, the old and
    reference log-prob passes, the update's forward and backward); each member does what is
    its own run's through these stages, never through its state or books. A solo step
    (``BuiltinEngine._train_step``) calls the same stages in the same order:

    - rollout: ``start_rollout(step)`` puts the policy in sampling mode and returns the
      step's sampling arguments (``SampleArgs``: group size, maximum completion length, EOS
      and pad ids, temperature, the generator seeded from (seed, step));
      ``rollout_charge(ro)`` is what the run's ledger charges for rollout ``ro``;
      ``policy_cost`` (shape, adapter, conventions) prices what the composer executed for
      it; ``device`` is where the policy lives (the stages' clock);
    - reward: ``score(problems, ro, step)`` (rewards, the rows the update trains on:
      ``num_update_generations`` of each group chosen by ``update_selection``, their group
      advantages, the rows kept and their batch with its learning FLOPs: a ``Scored``), then
      ``may_continue(step, roll, scored, t_roll)``, the guard's exact-cost check (False: the step does not fit; what ran is recorded as
      ``overrun`` and the member stops as its solo run would);
    - learning: ``update_plan(batch)`` (``UpdatePlan``: the loss mask, micro-batch size and
      temperature of the passes, whether the old-policy and reference passes run, the
      update's iterations, each iteration's optimizer steps as micro-batch slices, the loss
      settings), ``start_update(step)`` (the step's lr set, the policy in training mode;
      returns the lr), and for each optimizer step ``zero_grad()`` before its gradients and
      ``optimizer_step()`` after them (clipped at ``max_grad_norm``, then stepped);
    - charge: ``charge(step, ro, roll, scored, upd, t_roll, learning_seconds, named)`` charges
      the ledger with the solo step's components and appends its metrics row (``named``:
      the progress event carries the run's name).
    """

    @property
    def policy_cost(self) -> PolicyCost: ...

    @property
    def device(self) -> Any: ...

    def start_rollout(self, step: int) -> SampleArgs: ...

    def rollout_charge(self, ro: Rollout) -> dict[str, int]: ...

    def score(self, problems: list[Any], ro: Rollout, step: int) -> Scored: ...

    def may_continue(self, step: int, roll: dict[str, int], sc: Scored, t_roll: float) -> bool: ...

    def update_plan(self, batch: Rollout) -> UpdatePlan: ...

    def start_update(self, step: int) -> float: ...

    def zero_grad(self) -> None: ...

    def optimizer_step(self) -> None: ...

    def charge(self, step: int, ro: Rollout, roll: dict[str, int], sc: Scored, upd: dict[str, float], t_roll: float,
               learning_seconds: dict[str, float], named: bool = False) -> bool: ...


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


__all__ = ["ENGINES", "Engine", "EngineFactory", "EngineLifecycle", "StepMember", "engine_for", "register_engine",
           "run_engine"]
