"""The ledger as training-log scalars (what the TRL drop-in adds to TRL's logs)."""

from __future__ import annotations

from race.accounting import FlopLedger, log_values


def test_log_values_are_the_ledgers_totals_budget_fraction_and_split():
    led = FlopLedger(budget=1000)
    led.add_components(1, {"rollout/decode": 300, "update/forward": 100, "update/backward": 200,
                           "reward/forward": 100, "recompute/forward": 50})
    led.add(1, "eval", "generate", 70, counted=False)
    v = log_values(led)
    assert v == {"race/flops": 700, "race/flops/eval": 70, "race/flops/recompute": 50, "race/flops/reward": 100,
                 "race/flops/rollout": 300, "race/flops/update": 300, "race/budget_fraction": 0.7,
                 "race/split/search": 300 / 700, "race/split/learning": 300 / 700, "race/split/feedback": 100 / 700}
    empty = log_values(FlopLedger(), prefix="")
    assert empty == {"flops": 0, "split/search": 0.0, "split/learning": 0.0, "split/feedback": 0.0}
