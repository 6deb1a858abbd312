"""TRL's bounds in race.accounting.trl_step (stdlib only): the per-batch bound the TRL
engine's lr schedule reads, the dataset's floor, and how they relate to the step bound the
callback's stop reads."""

from __future__ import annotations

from dataclasses import replace

import pytest

from race.accounting import LoRA, ModelShape, PolicyCost, counted
from race.accounting.trl_step import TrlStepPlan, trl_batch_bound, trl_batch_floor, trl_step_bound, update_components

SHAPE = ModelShape.from_preset("qwen2.5-0.5b")


def _step(plan: TrlStepPlan, lora: LoRA | None, P: int, T: int) -> int:
    return trl_step_bound(plan, PolicyCost(SHAPE, lora), 0, prompt_len=P, completion_len=T, reference_lora=False, last_generation=None, reward_bound=lambda n, p, t: 0,
                          reward_models=type("NoRM", (), {"bound": staticmethod(lambda rows, s: 0)})())


@pytest.mark.parametrize("lora", [None, LoRA(8)])
@pytest.mark.parametrize("mu", [1, 2, 3])
def test_a_batch_bound_is_the_step_bound_plus_the_batchs_other_updates(lora, mu):
    """One generation per optimizer step: the step bound holds the generation and one update;
    the batch bound the generation and its mu updates (the reward's bound apart in both)."""
    plan = TrlStepPlan(per_device_train_batch_size=8, num_generations=4, num_iterations=mu)
    P, T = 37, 64
    cost = PolicyCost(SHAPE, lora)
    batch = trl_batch_bound(plan, cost, prompt_len=P, completion_len=T)  # mu from the plan
    update = counted(update_components(plan, cost, n_seqs=8, seq_len=P + T, completion_len=T))
    assert update > 0 and batch - _step(plan, lora, P, T) == (mu - 1) * update


def test_a_batch_costs_at_least_its_floor_and_the_floor_grows_with_the_prompt():
    plan = TrlStepPlan(per_device_train_batch_size=8, num_generations=4)
    cost = PolicyCost(SHAPE)
    floor = trl_batch_floor(plan, cost, n_seqs=8, prompt_width=37)
    assert 0 < floor < trl_batch_bound(plan, cost, prompt_len=37, completion_len=1)
    assert trl_batch_floor(replace(plan, num_iterations=2), cost, n_seqs=8, prompt_width=38) > 2 * floor
