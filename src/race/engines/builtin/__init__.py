"""RACE's built-in GRPO engine, in one room:

    engine.py        the training loop (BuiltinEngine, run_builtin): every phase charged
                     to the ledger, every stop decided by the run's BudgetGuard
    state.py         its lifecycle, declared: what setup() builds (BuiltinState) and the
                     run's records once it knows where it starts (RunBooks)
    micro_batch.py   micro-batches, gradient accumulation and checkpointing of those passes
    step_parts.py    one run's stages of a step (StepStages: what race.engines.StepMember
                     declares), shared by the solo loop and the gang's batched step

The gang runner (``race.engines.gang``) batches several of these engines' steps; the
shared pieces both engines use (sampling, GRPO math, run directory, checkpoints,
evaluation) lie one level up in ``race.engines``, and the kernels (the functional prefill +
KV-cache decoder, the prefix-shared forward of the log-prob passes and the update) in
``race.engines.kernels``.
"""

from race.engines.builtin.engine import BuiltinEngine, run_builtin

__all__ = ["BuiltinEngine", "run_builtin"]
