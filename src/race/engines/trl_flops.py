"""Kept for users: ``race.engines.trl_flops.compare_with_builtin`` is documented in
docs/trl.md. The rules live in :mod:`race.accounting.trl_step` and
:mod:`race.accounting.trl_compare`."""

from race.accounting.trl_compare import builtin_same_shapes, compare_with_builtin
from race.accounting.trl_step import (
    TRL_CONVENTIONS_NOTE,
    TRL_EXECUTION_NOTE,
    ModelCall,
    TrlStepPlan,
    calls_components,
    counted,
    generation_components,
    update_components,
)

__all__ = ["ModelCall", "TRL_CONVENTIONS_NOTE", "TRL_EXECUTION_NOTE", "TrlStepPlan", "builtin_same_shapes",
           "calls_components", "compare_with_builtin", "counted", "generation_components", "update_components"]
