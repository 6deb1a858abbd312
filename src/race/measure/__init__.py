"""Measured FLOPs: run a real model under ``torch.utils.flop_counter.FlopCounterMode`` and
return counts under the same ``phase/component`` keys as ``race.accounting``'s analytic
ledger (``PhaseFlops.components``).

Needs torch (``race.accounting`` does not). Under ``conventions="torch"`` the analytic
numbers equal these counts exactly (tests/accounting/test_exactness.py proves it); the
counter ignores the causal mask (full-square attention) and counts elementwise work as 0.

    from race.measure import FlopMeter, measure_generate, measure_train_step
    meter = FlopMeter()
    meter.add(measure_generate(model, prompt_ids, 64, prompt_mask).components)
    meter.add(measure_train_step(model, seqs, mask, logits_to_keep=65).components)
    meter.components   # {"rollout/prefill": ..., "rollout/decode": ..., "update/forward": ...}
"""

from .counter import Counter, FlopMeter, count_flops, flop_formulas, relative_errors
from .passes import (
    COUNTABLE_ATTENTION,
    GenerateMeasurement,
    TrainMeasurement,
    attention_implementation,
    ensure_countable,
    measure_forward,
    measure_generate,
    measure_grpo_step,
    measure_reward_forward,
    measure_train_step,
)
from .models import build_model, qwen2_config

__all__ = [
    "COUNTABLE_ATTENTION", "Counter", "FlopMeter", "GenerateMeasurement", "TrainMeasurement",
    "attention_implementation", "build_model", "count_flops", "ensure_countable", "flop_formulas", "measure_forward",
    "measure_generate", "measure_grpo_step", "measure_reward_forward", "measure_train_step", "qwen2_config", "relative_errors",
]
