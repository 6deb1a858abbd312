"""RACE: compute-accounted RL post-training of language models.

The accounting core (``race.accounting``) is standard-library only; heavy libraries
(torch, transformers, peft, trl, ray, matplotlib) are imported inside the functions that
need them. The public surface below is re-exported lazily (PEP 562), so ``import race``
and ``race --help`` stay fast::

    from race import ModelShape, LoRA, grpo_step_flops, FlopLedger   # accounting
    from race import RunConfig, GridSpec                             # specs (race.spec)
    from race import run_engine, add_race_accounting                 # engines (torch / trl on use)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that is its home
_PUBLIC = {
    "ModelShape": "race.accounting",
    "LoRA": "race.accounting",
    "grpo_step_flops": "race.accounting",
    "FlopLedger": "race.accounting",
    "RunConfig": "race.spec.run",
    "GridSpec": "race.spec.grid",
    "run_engine": "race.engines",
    "add_race_accounting": "race.engines.trl.callback",
}

__all__ = ["__version__", *_PUBLIC]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from race.accounting import FlopLedger, LoRA, ModelShape, grpo_step_flops
    from race.engines import run_engine
    from race.engines.trl.callback import add_race_accounting
    from race.spec.grid import GridSpec
    from race.spec.run import RunConfig


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'race' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
