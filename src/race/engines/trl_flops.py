"""Kept for users: ``race.engines.trl_flops.compare_with_builtin`` is documented in
docs/trl.md. The code lives in :mod:`race.engines.trl.flops`."""

from race.engines.trl.flops import (
    TRL_CONVENTIONS_NOTE,
    TRL_EXECUTION_NOTE,
    ModelCall,
    TrlStepPlan,
    builtin_same_shapes,
    calls_components,
    compare_with_builtin,
    counted,
    generation_components,
    update_components,
)

__all__ = ["ModelCall", "TRL_CONVENTIONS_NOTE", "TRL_EXECUTION_NOTE", "TrlStepPlan", "builtin_same_shapes",
           "calls_components", "compare_with_builtin", "counted", "generation_components", "update_components"]
