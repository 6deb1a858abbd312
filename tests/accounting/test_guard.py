"""race.accounting.guard: what counts, a budget, the steps it buys, the StepPlan, and the
stop decisions of a BudgetGuard over a real ledger file."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from race.accounting import (
    AccountingError,
    BudgetGuard,
    FlopLedger,
    LoRA,
    ModelShape,
    PolicyCost,
    StepPlan,
    grpo_step_flops,
    learning_components,
    prompt_groups,
    rollout_components,
    uniform_step_flops,
)
from race.accounting.grpo import RewardSystem
from race.accounting.guard import (
    UNCOUNTED_PHASES,
    check_budget,
    counted,
    fits,
    is_budget,
    is_counted,
    steps_bought,
    steps_in_budget,
)

SHAPE = ModelShape.from_preset("qwen2.5-0.5b")


def test_counted_leaves_out_every_uncounted_phase_and_is_the_ledgers_rule(tmp_path):
    comps = {"rollout/decode": 5, "update/forward": 7, **{f"{p}/x": 1000 for p in UNCOUNTED_PHASES}}
    assert counted(comps) == 12
    assert not any(is_counted(p) for p in UNCOUNTED_PHASES) and is_counted("reward/forward")
    led = FlopLedger(tmp_path / "l.jsonl")
    led.add_components(1, comps)
    assert led.total == counted(comps)
    assert {r.phase for r in led if not r.counted} == set(UNCOUNTED_PHASES)


def test_the_trl_accounting_uses_the_same_counted_rule():
    pytest.importorskip("transformers")
    from race.accounting.trl_step import counted as trl_counted

    assert trl_counted is counted


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, -math.inf, math.nan, "many", None])
def test_a_budget_must_be_a_finite_positive_flop_count(bad):
    with pytest.raises(AccountingError, match="budget_flops must be > 0 and finite"):
        check_budget(bad, "budget_flops")


def test_one_budget_check_everywhere():
    assert check_budget(2e9) == 2e9 and isinstance(check_budget(3), float)
    assert is_budget(1) and is_budget("1e12") and not is_budget(math.inf) and not is_budget("x")
    for make in (lambda: FlopLedger(budget=math.inf), lambda: steps_in_budget(0, 3)):
        with pytest.raises(AccountingError, match="budget must be > 0 and finite"):
            make()


def test_run_and_grid_specs_refuse_budgets_with_the_guards_check():
    pytest.importorskip("pydantic")
    from race.spec import ConfigError, GridSpecError, grid_spec_from_dict, run_config_from_dict

    with pytest.raises(ConfigError, match="budget_flops: budget must be > 0 and finite"):
        run_config_from_dict({"budget_flops": math.inf})
    with pytest.raises(GridSpecError, match="budgets must be positive FLOP counts"):
        grid_spec_from_dict({"study": "s", "budgets": [1e12, -1.0], "base": {}, "axes": {"num_generations": [4]}})


def test_fits_at_the_boundary():
    assert fits(60, 40, 100) and not fits(60, 41, 100)
    assert fits(1e30, 1e30, None)


def test_the_steps_a_budget_buys():
    assert steps_bought(10, 3) == 3 and steps_bought(2, 3) == 0 and steps_bought(100, 3, max_steps=5) == 5
    assert steps_in_budget(9, 3) == 3
    with pytest.raises(AccountingError, match="smaller than one step"):
        steps_in_budget(2, 3)
    with pytest.raises(AccountingError, match="step must cost > 0"):
        steps_bought(10, 0)
    assert steps_in_budget(100, 7, max_steps=4) == 4 and steps_in_budget(100, 7) == 14
    with pytest.raises(AccountingError, match="^run 'tiny': budget 5 FLOPs is smaller than one step"):
        steps_in_budget(5, 7, run="tiny")


# -- StepPlan --------------------------------------------------------------------------------------
PLANS = [
    dict(),
    dict(lora=LoRA(16), num_iterations=2, beta=0.04, share_prompt=True, micro_batch=6),
    dict(lora=LoRA(8), recompute=True, recompute_early_stop=False, inputs_require_grad=True, beta=0.1,
         conventions="torch"),
    dict(reward=RewardSystem("orm", ModelShape.from_preset("qwen2.5-0.5b"), "rm"), train_logits="completion+1",
         needs_old_logprobs=True, conventions="verl"),
]


@pytest.mark.parametrize("kw", PLANS)
def test_a_step_plan_gives_what_the_formulas_give_with_its_settings(kw):
    plan = StepPlan(SHAPE, 4, **kw)
    P, T = [30, 30, 30, 30, 12, 12, 12, 12], [5, 9, 2, 9, 4, 4, 1, 8]
    groups = prompt_groups(8, 4, kw["micro_batch"]) if kw.get("micro_batch") else None
    settings = {k: v for k, v in kw.items() if k != "micro_batch"}
    assert plan.step(P, T) == grpo_step_flops(SHAPE, P, T, num_generations=4, prompt_groups=groups, **settings)
    assert plan.uniform(3, 40, 20) == uniform_step_flops(
        SHAPE, prompts=3, num_generations=4, prompt_len=40, completion_len=20,
        prompt_groups=prompt_groups(12, 4, kw["micro_batch"]) if kw.get("micro_batch") else None, **settings)
    seqs = [p + t for p, t in zip(P, T)]
    learn = {k: v for k, v in settings.items() if k not in ("reward", "share_prompt")}
    assert plan.learning(seqs, T) == learning_components(SHAPE, seqs, T, prompt_groups=groups, **learn)
    plens = P[::4] if kw.get("share_prompt") else P
    assert plan.rollout(plens, T) == rollout_components(PolicyCost(SHAPE, kw.get("lora"), kw.get("conventions")),
                                                        plens, T, share_prompt=kw.get("share_prompt", False))


def test_a_step_plan_accepts_iterators_and_shares_prompts_for_less():
    plan = StepPlan(SHAPE, 4, lora=LoRA(16), share_prompt=True, micro_batch=8)
    P, T = [30] * 8, [10] * 8
    assert plan.step(iter(P), iter(T)) == plan.step(P, T)
    unshared = StepPlan(SHAPE, 4, lora=LoRA(16))
    assert plan.step(P, T).total < unshared.step(P, T).total


# -- BudgetGuard over a real ledger ------------------------------------------------------------------
def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_guard_starts_a_step_only_when_its_bound_fits(tmp_path):
    guard = BudgetGuard(FlopLedger(tmp_path / "l.jsonl", budget=100))
    assert guard.charge(1, {"rollout/decode": 60, "recompute/forward": 500}) == 0
    assert guard.may_start(40) and guard.stop_reason is None
    assert not guard.may_start(41) and guard.stop_reason == "budget"
    assert guard.steps_bought(30, run="r") == 3 and guard.steps_bought(30, max_steps=2) == 2


def test_a_step_whose_exact_cost_does_not_fit_is_recorded_as_overrun(tmp_path):
    led = FlopLedger(tmp_path / "l.jsonl", budget=100)
    guard = BudgetGuard(led)
    guard.charge(1, {"rollout/decode": 50})
    assert guard.may_continue(2, {"rollout/decode": 20}, {"update/forward": 30})
    assert not guard.may_continue(2, {"rollout/decode": 20, "reward/forward": 5}, {"update/forward": 26},
                                  seconds={"rollout/decode": 0.5})
    assert guard.stop_reason == "budget" and led.total == 50
    over = [r for r in _lines(tmp_path / "l.jsonl") if r["phase"] == "overrun"]
    assert [(r["step"], r["component"], r["flops"], r["counted"]) for r in over] == [
        (2, "rollout_decode", 20, False), (2, "reward_forward", 5, False)]  # what ran, not the update
    assert over[0]["seconds"] == 0.5


def test_a_charge_the_budget_cannot_take_becomes_overrun_and_stops(tmp_path):
    led = FlopLedger(tmp_path / "l.jsonl", budget=100)
    guard = BudgetGuard(led)
    assert guard.charge(1, {"rollout/decode": 90}) == 0
    assert guard.charge(2, {"rollout/decode": 8, "update/forward": 5, "recompute/forward": 4}) == 17
    assert led.total == 90 <= led.budget and guard.stop_reason == "budget"
    assert {r.phase for r in led if r.step == 2} == {"overrun"}


def test_the_ledgers_own_refusal_behind_a_blinded_guard_is_still_an_overrun(tmp_path):
    class Blind(BudgetGuard):
        def fits(self, flops: float) -> bool:
            return True

    led = FlopLedger(tmp_path / "l.jsonl", budget=10)
    guard = Blind(led)
    assert guard.charge(1, {"update/forward": 11}) == 11
    assert led.total == 0 and guard.stop_reason == "budget"


def test_stop_after_sets_the_trainers_flag_and_asks_for_the_bound_only_when_needed(tmp_path):
    guard = BudgetGuard(FlopLedger(budget=100))
    guard.charge(1, {"update/forward": 70})
    control = SimpleNamespace(should_training_stop=False)

    def never() -> float:
        raise AssertionError("the next bound is not needed after an overrun")

    assert not guard.stop_after(0, lambda: 30, control) and not control.should_training_stop
    assert guard.stop_reason is None
    assert guard.stop_after(0, lambda: 31, control) and control.should_training_stop
    control.should_training_stop = False
    assert guard.stop_after(5, never, control) and control.should_training_stop and guard.stop_reason == "budget"
    assert BudgetGuard(FlopLedger()).may_start(1e30)  # no budget: nothing stops


@pytest.mark.parametrize("share", [True, False])
def test_a_step_plans_bound_is_its_counted_rollout_and_learning_at_full_length(share):
    plan = StepPlan(SHAPE, 4, lora=LoRA(8), beta=0.04, num_iterations=2, share_prompt=share,
                    micro_batch=8 if share else None, recompute=not share)
    n = 3 * 4
    comps = plan.rollout([50] * (3 if share else n), [20] * n)
    comps.update(plan.learning([70] * n, [20] * n))
    assert plan.bound(3, 50, 20) == counted(comps) == plan.uniform(3, 50, 20).total
    assert plan.bound(3, 50, 20) < plan.bound(3, 50, 21)


# -- s4-23s: the first-step refusal, the step bound and the prefix stop are the guard's ---------------
def test_the_first_step_refusal_is_the_guards_and_says_what_to_change(tmp_path):
    led = FlopLedger(tmp_path / "l.jsonl", budget=1000)
    led.add(1, "rollout", "decode", 600)
    led.add(1, "recompute", "forward", 10_000)  # uncounted: leaves 400
    guard = BudgetGuard(led)
    guard.check_first_step(400)  # fits exactly: no refusal
    with pytest.raises(AccountingError) as err:
        guard.check_first_step(401, step="one TRL step", shrink="batch, num_generations")
    assert str(err.value) == ("budget 1000 FLOPs (400 left) is smaller than one TRL step (401 FLOPs at the maximum "
                              "lengths); raise the budget or shrink the step (batch, num_generations)")
    assert guard.stop_reason is None and led.total == 600  # a refusal before training, not a stop
    BudgetGuard(FlopLedger()).check_first_step(1e30)  # no budget: nothing refused


def test_a_step_bound_is_the_policys_plus_the_rewards_at_the_same_lengths():
    from race.accounting.guard import plan_step_bound, step_bound

    seen = []

    def reward(n, p, t):
        seen.append((n, p, t))
        return 1000 * n + 10 * p + t

    assert step_bound(100, reward, 8, 3, 2) == 100 + 8032 and seen == [(8, 3, 2)]
    assert step_bound(100, None, 8, 3, 2) == 100  # a reward that spends nothing
    plan = StepPlan(SHAPE, 4, lora=LoRA(8), share_prompt=True, micro_batch=8)
    assert plan_step_bound(plan, 3, 50, 20, reward) == plan.bound(3, 50, 20) + 12 * 1000 + 500 + 20
    assert seen[-1] == (12, 50, 20)  # the reward bounds every sequence of the step: prompts x group


def test_where_a_smaller_budget_stops_is_the_guards_own_rule(tmp_path):
    from race.accounting.guard import stops_before

    led = FlopLedger(tmp_path / "l.jsonl", budget=1000)
    led.add(1, "rollout", "decode", 600)
    for bound in (399, 400, 401):
        assert stops_before(1000, led.total, bound) is (not BudgetGuard(led).may_start(bound))
    assert not stops_before(1000, 600, 400) and stops_before(1000, 600, 400.5)
