"""TRL's bounds in race.accounting.trl_step (stdlib only): the per-batch bound the TRL
engine's lr schedule reads, the dataset's floor, and how they relate to the step bound the
callback's stop reads."""

from __future__ import annotations

import pytest

from race.accounting import LoRA, ModelShape
from race.accounting.trl_step import TrlStepPlan, trl_batch_bound, trl_batch_floor, trl_step_bound

SHAPE = ModelShape.from_preset("qwen2.5-0.5b")


def _step(plan: TrlStepPlan, lora: LoRA | None, P: int, T: int) -> int:
    return trl_step_bound(plan, SHAPE, 0, prompt_len=P, completion_len=T, lora=lora, conventions=None,
                          reference_lora=False, last_generation=None, reward_bound=lambda n, p, t: 0,
                          reward_models=type("NoRM", (), {"bound": staticmethod(lambda rows, s: 0)})())


@pytest.mark.parametrize("lora", [None, LoRA(8)])
@pytest.mark.parametrize("mu", [1, 2, 3])
def test_a_batch_bound_is_the_step_bound_plus_the_batchs_other_updates(lora, mu):
    """One generation per optimizer step: the step bound holds the generation and one update;
    the batch bound the generation and its mu updates (the reward's bound apart in both)."""
    plan = TrlStepPlan(per_device_train_batch_size=8, num_generations=4, num_iterations=mu)
    P, T = 37, 64
    batch = trl_batch_bound(SHAPE, plan, prompt_len=P, completion_len=T, num_iterations=mu, lora=lora,
                            conventions=None)
    one = trl_batch_bound(SHAPE, plan, prompt_len=P, completion_len=T, num_iterations=1, lora=lora, conventions=None)
    assert one == _step(plan, lora, P, T)
    assert batch - one == (mu - 1) * (trl_batch_bound(SHAPE, plan, prompt_len=P, completion_len=T, num_iterations=2,
                                                      lora=lora, conventions=None) - one)


def test_a_batch_costs_at_least_its_floor_and_the_floor_grows_with_the_prompt():
    plan = TrlStepPlan(per_device_train_batch_size=8, num_generations=4)
    floor = trl_batch_floor(SHAPE, plan, n_seqs=8, prompt_width=37, num_iterations=1, lora=None, conventions=None)
    assert 0 < floor < trl_batch_bound(SHAPE, plan, prompt_len=37, completion_len=1, num_iterations=1, lora=None,
                                       conventions=None)
    assert trl_batch_floor(SHAPE, plan, n_seqs=8, prompt_width=38, num_iterations=2, lora=None,
                           conventions=None) > 2 * floor
