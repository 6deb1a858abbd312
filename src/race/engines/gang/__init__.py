"""Gang training: LoRA runs of one base model train together in one process, their rows
batched over the shared frozen base (``forward``: the multi-LoRA pass; ``sample``: the
batched rollout; ``passes``: batched log-probs and updates; ``step``/``engine``: the
built-in engine's loop for every member in lockstep; ``checkpoint``: the gang's resumable
state; ``members``: who may share a gang, the budget decision, the seconds split)."""

from race.engines.gang.engine import GangEngine, run_gang
from race.engines.gang.members import gang_key, gang_refusal, split_seconds

__all__ = ["GangEngine", "gang_key", "gang_refusal", "run_gang", "split_seconds"]
