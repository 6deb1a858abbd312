"""The step bound of the drop-in ledger: an upper bound of the counted FLOPs of TRL's next
optimizer step, from the maximum lengths (see ``RaceFlopCallback.step_bound``). Whether the
bound fits the budget is ``race.accounting.guard``'s decision."""

from __future__ import annotations

from typing import Any, Callable

from race.accounting import LoRA, ModelShape, counted
from race.engines.trl.flops import TrlStepPlan, generation_components, round_up, update_components


def step_bound(plan: TrlStepPlan, shape: ModelShape, micro_step: int, *, prompt_len: int, completion_len: int,
               lora: LoRA | None, conventions: Any, reference_lora: bool,
               last_generation: tuple[int, int, int] | None, reward_bound: Callable[[int, int, int], int],
               reward_models: Any, buffered: bool | None = None) -> int:
    """Upper bound of the counted FLOPs of the optimizer step whose first micro-step is
    ``micro_step``: completions at ``completion_len`` (``max_completion_length``), prompts
    at ``prompt_len`` (the longest prompt), every old/reference pass TRL would run, the
    reward functions' bound ``reward_bound(sequences, prompt_len, completion_len)`` and
    the reward models' (``reward_models.bound``). A micro-step generates when TRL's counter
    says so or when no generated batch is buffered (``buffered``; default: whether a
    generation was seen, ``last_generation``: the tracker's last (rows, prompt width,
    completion width))."""
    P, T = prompt_len, completion_len
    pad = plan.pad_to_multiple_of
    total = 0
    last = last_generation
    if buffered is None:
        buffered = last is not None
    width = None if last is None or not buffered else (
        round_up(last[1], pad) + round_up(last[2], pad), round_up(last[2], pad))
    for i in range(plan.gradient_accumulation_steps):
        m = micro_step + i
        if plan.generates(m) or width is None:
            gen = generation_components(shape, plan, n_seqs=plan.generation_batch_size, prompt_len=P,
                                        completion_len=T, lora=lora, conventions=conventions,
                                        reference_lora=reference_lora)
            total += counted(gen)
            total += int(reward_bound(plan.generation_batch_size, P, T))
            total += reward_models.bound(plan.generation_batch_size, P + T)
            width = (round_up(P, pad) + round_up(T, pad), round_up(T, pad))
        total += counted(update_components(shape, plan, n_seqs=plan.per_device_train_batch_size,
                                           seq_len=width[0], completion_len=width[1], lora=lora,
                                           inputs_require_grad=True, conventions=conventions))
    return total


__all__ = ["step_bound"]
