"""The one run record (``race.records``): a run's summary from its rows, and the one
over-optimisation rule, as the engine, the store's prefix writer and the report use them."""

from __future__ import annotations

import math

import pytest

from race.records import RUN_PHASES, overoptimisation, overoptimised, run_record, slope


def test_slope_is_least_squares_and_needs_three_spread_points():
    assert slope([0, 1, 2], [1, 3, 5]) == pytest.approx(2.0)
    assert math.isnan(slope([1, 1, 1], [0, 5, 3])) and math.isnan(slope([0, 1], [0, 1]))
    assert slope([0, 1, 2, float("nan")], [1, 3, 5, 9]) == pytest.approx(2.0)  # non-finite points are skipped


def test_the_rule_flags_proxy_up_and_verified_down_on_flops():
    # x = flops / 100: proxy rises 0.3 over the run, verified falls 0.2 -> slopes +0.3 / -0.2
    proxy = [(f, 0.3 + 0.003 * f) for f in range(10, 101, 10)]
    verified = [(0, 0.5), (50, 0.4), (100, 0.3)]
    out = overoptimisation(proxy, verified)
    assert out["flag"] and out["proxy_slope"] == pytest.approx(0.3) and out["verified_slope"] == pytest.approx(-0.2)
    assert not overoptimisation(proxy, verified, threshold=0.25)["flag"]  # the verified fall is below 0.25
    assert not overoptimisation(proxy, [(0, 0.3), (50, 0.4), (100, 0.5)])["flag"]  # real gains
    late = overoptimisation(proxy, verified, from_fraction=0.6)  # too few verified points late in the run
    assert math.isnan(late["verified_slope"]) and not late["flag"]
    assert not overoptimised(float("nan"), -1.0) and not overoptimised(None, -1.0)  # type: ignore[arg-type]


LEDGER = [{"step": 1, "phase": "rollout", "flops": 10, "counted": True},
          {"step": 1, "phase": "update", "flops": 5, "counted": True},
          {"step": 1, "phase": "eval", "flops": 7, "counted": False},
          {"step": 2, "phase": "rollout", "flops": 11, "counted": True},
          {"step": 3, "phase": "overrun", "flops": 4, "counted": False}]
EVALS = [{"step": 0, "flops": 0, "target": "greedy", "score": 0.5}, {"step": 1, "flops": 15, "target": "greedy",
                                                                      "score": 0.6},
         {"step": 2, "flops": 26, "target": "greedy", "score": 0.55}]
TRAIN = [{"step": 1, "flops": 15, "zero_var_frac": 0.5, "reward_mean": 0.2},
         {"step": 2, "flops": 26, "zero_var_frac": 0.25, "reward_mean": 0.4}]


def test_a_record_from_rows_and_its_prefix():
    rec = run_record(evals=EVALS, train=TRAIN, ledger=LEDGER)
    assert rec.steps == 2 and rec.total_flops == 26  # the overrun step is not charged
    assert set(RUN_PHASES) <= set(rec.phase_flops) and rec.phase_flops["eval"] == 7 and rec.phase_flops["overrun"] == 4
    assert rec.initial == {"greedy": 0.5} and rec.final == {"greedy": 0.55}
    assert rec.diagnostics["zero_var_frac"] == pytest.approx(0.375) and rec.diagnostics["overoptimisation"] is None
    pre = run_record(evals=EVALS, train=TRAIN, ledger=LEDGER, upto_step=1)
    assert pre.steps == 1 and pre.total_flops == 15 and pre.final == {"greedy": 0.6}
    assert pre.diagnostics["reward_mean"] == pytest.approx(0.2)
    assert run_record(evals=EVALS, train=TRAIN, ledger=LEDGER, steps=3).steps == 3  # the engine's own count
    learned = run_record(evals=EVALS, train=TRAIN, ledger=LEDGER, learned=True).diagnostics["overoptimisation"]
    # two proxy points cannot be fitted: None, JSON-able, and no flag
    assert learned["flag"] is False and learned["proxy_slope"] is None and learned["target"] == "greedy"
