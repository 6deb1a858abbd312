"""The FLOP ledger (JSON Lines, torn-write recovery, budget) and budget arithmetic."""

from __future__ import annotations

import json

import pytest

from race.accounting import (
    AccountingError,
    BudgetExceededError,
    BudgetGuard,
    FlopLedger,
    LedgerCorruptError,
    LedgerRecord,
    ModelShape,
    LoRA,
    RewardSystem,
    StepPlan,
    allocations,
    plan_allocations,
    split_shares,
    steps_in_budget,
    uniform_step_flops,
)


def _filled(path=None, budget=None) -> FlopLedger:
    led = FlopLedger(path, budget=budget)
    for step in range(3):
        led.add(step, "rollout", "decode", 100, tokens=10, seconds=0.5)
        led.add(step, "update", "backward", 40)
        led.add(step, "recompute", "forward", 7)  # hardware FLOPs: never charged
    return led


def test_jsonl_round_trip(tmp_path):
    p = tmp_path / "run" / "ledger.jsonl"
    led = _filled(p)
    lines = p.read_text().splitlines()
    assert len(lines) == 9
    assert json.loads(lines[0]) == {"step": 0, "phase": "rollout", "component": "decode", "flops": 100, "tokens": 10,
                                    "seconds": 0.5, "counted": True}
    assert json.loads(lines[2])["counted"] is False
    back = FlopLedger.load(p)
    assert back.records == led.records
    assert back.total == 3 * 140
    assert back.totals_by_phase() == {"rollout": 300, "update": 120, "recompute": 21}
    assert back.totals_by_phase(counted_only=True) == {"rollout": 300, "update": 120}
    assert back.totals_by_key()["update/backward"] == 120
    assert back.tokens_by_phase()["rollout"] == 30
    assert back.seconds_by_phase()["rollout"] == pytest.approx(1.5)
    assert back.steps() == 3 and len(back) == 9
    with pytest.raises(AccountingError, match="no ledger"):
        FlopLedger.load(tmp_path / "nope.jsonl")


def test_torn_last_line_is_dropped_and_file_truncated(tmp_path):
    p = tmp_path / "ledger.jsonl"
    _filled(p)
    good = p.read_bytes()
    p.write_bytes(good + b'{"step": 3, "phase": "rollout", "comp')  # a crash mid-write
    with pytest.warns(UserWarning, match="torn last line"):
        led = FlopLedger.load(p)
    assert len(led) == 9 and led.total == 420
    assert p.read_bytes() == good  # truncated back to whole lines
    led.add(3, "rollout", "prefill", 5)  # later appends stay clean
    assert FlopLedger.load(p).total == 425


def test_complete_record_without_newline_counts_as_torn(tmp_path):
    p = tmp_path / "ledger.jsonl"
    _filled(p)
    good = p.read_bytes()
    p.write_bytes(good + LedgerRecord(3, "update", "forward", 1).to_json().encode())
    with pytest.warns(UserWarning):
        assert len(FlopLedger.load(p)) == 9
    assert p.read_bytes() == good


def test_corrupt_middle_line_raises(tmp_path):
    p = tmp_path / "ledger.jsonl"
    _filled(p)
    lines = p.read_text().splitlines(keepends=True)
    lines[4] = "{not json\n"
    p.write_text("".join(lines))
    with pytest.raises(LedgerCorruptError, match="line 5"):
        FlopLedger.load(p)
    lines[4] = "[1, 2]\n"  # valid JSON, not a record
    p.write_text("".join(lines))
    with pytest.raises(LedgerCorruptError, match="line 5"):
        FlopLedger.load(p)


def test_budget_enforcement(tmp_path):
    p = tmp_path / "ledger.jsonl"
    led = FlopLedger(p, budget=1000)
    led.add(0, "rollout", "decode", 600)
    led.add(0, "recompute", "forward", 10_000)  # uncounted: does not touch the budget
    assert led.remaining == 400
    assert BudgetGuard(led).fits(400) and not BudgetGuard(led).fits(401)
    before = p.read_bytes()
    with pytest.raises(BudgetExceededError, match="exceed the budget"):
        led.add_components(1, {"rollout/decode": 300, "update/backward": 200})  # all or nothing
    assert p.read_bytes() == before and led.total == 600
    led.extend([LedgerRecord(1, "update", "forward", 500)], enforce_budget=False)  # explicit override
    assert led.total == 1100 and led.remaining == -100
    assert BudgetGuard(FlopLedger()).fits(1e30)  # no budget
    with pytest.raises(AccountingError, match="budget must be > 0"):
        FlopLedger(budget=0)


def test_record_validation():
    with pytest.raises(AccountingError, match="unknown ledger phase"):
        LedgerRecord(0, "search", "x", 1)
    with pytest.raises(AccountingError, match="non-negative integer"):
        LedgerRecord(0, "update", "x", -1)
    with pytest.raises(AccountingError, match="never charged"):
        LedgerRecord(0, "recompute", "forward", 1, counted=True)
    assert LedgerRecord(0, "eval", "forward", 3, counted=False).key == "eval/forward"


def test_truncate_after(tmp_path):
    p = tmp_path / "ledger.jsonl"
    led = _filled(p)
    led.truncate_after(1)
    assert {r.step for r in led} == {0, 1} and led.total == 280
    assert FlopLedger.load(p).records == led.records
    assert not (tmp_path / "ledger.jsonl.tmp").exists()
    led.add(2, "update", "forward", 1)
    assert FlopLedger.load(p).total == 281


def test_add_components_uses_phase_keys():
    led = FlopLedger()
    led.add_components(4, {"rollout/prefill": 3, "recompute/forward": 9}, tokens={"rollout/prefill": 2},
                       seconds={"rollout/prefill": 0.25})
    a, b = led.records
    assert (a.phase, a.component, a.tokens, a.seconds, a.counted) == ("rollout", "prefill", 2, 0.25, True)
    assert (b.phase, b.counted) == ("recompute", False)


# -- budget arithmetic ------------------------------------------------------------------------------
SMALL = ModelShape("s", num_layers=2, hidden=16, num_heads=4, num_kv_heads=2, head_dim=4, intermediate=24, vocab=50)
BIG = ModelShape("b", num_layers=4, hidden=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate=48, vocab=50)


def test_steps_in_budget():
    assert steps_in_budget(10, 3) == 3
    assert steps_in_budget(9, 3) == 3
    with pytest.raises(AccountingError, match="smaller than one step"):
        steps_in_budget(2, 3)
    with pytest.raises(AccountingError, match="budget must be > 0"):
        steps_in_budget(0, 3)


def test_split_shares_sum_to_one():
    rm = RewardSystem("orm", SMALL)
    step = uniform_step_flops(SMALL, prompts=2, num_generations=4, prompt_len=8, completion_len=6, beta=0.1,
                              num_iterations=2, reward=rm)
    s = split_shares(step)
    assert s["search"] == step.rollout / step.total
    assert s["learning"] == (step.update + step.old_logprobs + step.reference) / step.total
    assert s["feedback"] == step.reward / step.total > 0
    assert sum(s.values()) == pytest.approx(1.0)


def test_plan_allocations():
    kw = dict(prompts_per_step=2, prompt_len=8, completion_len=6)
    one_big = uniform_step_flops(BIG, prompts=2, num_generations=8, prompt_len=8, completion_len=6).total
    budget = 3 * one_big
    plans = plan_allocations(budget, [SMALL, BIG], [2, 8], **kw)
    assert [a.steps for a in plans] == sorted((a.steps for a in plans), reverse=True)
    big8 = next(a for a in plans if a.model == "b" and a.num_generations == 8)
    assert big8.steps == 3 and big8.total <= budget
    # group_tokens_fixed: G=2 runs 2 * 8 // 2 = 8 prompts, the same 16 sequences as G=8
    small2 = next(a for a in plans if a.model == "s" and a.num_generations == 2)
    assert small2.step.total == uniform_step_flops(SMALL, prompts=8, num_generations=2, prompt_len=8,
                                                   completion_len=6).total
    assert small2.row()["steps"] == budget // small2.step.total
    assert plan_allocations(one_big / 10, [BIG], [8], **kw) == []  # cannot afford one step



def test_allocations_take_step_plans_each_with_its_own_settings():
    """The plan form: each allocation is a StepPlan, so two of the same model and group can
    differ in their settings (LoRA, iterations), which the keyword form cannot say."""
    kw = dict(prompts_per_step=2, prompt_len=8, completion_len=6)
    plans = [StepPlan(SMALL, 4), StepPlan(SMALL, 4, lora=LoRA(2), num_iterations=2)]
    steps = [p.uniform(2, 8, 6) for p in plans]
    assert steps[0] != steps[1] and steps[0].old_logprobs == 0 < steps[1].old_logprobs  # 2 iterations: old pass
    budget = 5 * max(s.total for s in steps)
    got = allocations(budget, plans, **kw)
    want = sorted(((budget // s.total, s) for s in steps), key=lambda t: -t[0])
    assert [(a.steps, a.step) for a in got] == want and min(a.steps for a in got) == 5
    assert got[[a.step for a in got].index(steps[0])] == plan_allocations(budget, [SMALL], [4], **kw)[0]
    skipped: list = []
    assert allocations(steps[1].total / 2, plans[1:], unaffordable=skipped, **kw) == [] and skipped[0].steps == 0
