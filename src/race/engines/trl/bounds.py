"""The step bound of the drop-in ledger: an upper bound of the counted FLOPs of TRL's next
optimizer step, from the maximum lengths (see ``RaceFlopCallback.step_bound``)."""

from __future__ import annotations

from typing import Any

from race.engines.trl.flops import _round_up, counted, generation_components, update_components


def step_bound(cb: Any, micro_step: int, *, buffered: bool | None = None) -> int:
    """Upper bound of the counted FLOPs of the optimizer step of ``cb`` (a
    ``RaceFlopCallback``) whose first micro-step is ``micro_step``: completions at
    ``max_completion_length``, prompts at the longest prompt, every old/reference pass TRL
    would run, the reward models' and reward functions' bounds. A micro-step generates when
    TRL's counter says so or when no generated batch is buffered (``buffered``; default:
    whether a generation was seen)."""
    assert cb.plan is not None and cb.shape is not None and cb.max_prompt_length is not None
    plan, P, T = cb.plan, cb.max_prompt_length, cb._max_completion
    pad = plan.pad_to_multiple_of
    total = 0
    last = cb.tracker.last_generation
    if buffered is None:
        buffered = last is not None
    width = None if last is None or not buffered else (
        _round_up(last[1], pad) + _round_up(last[2], pad), _round_up(last[2], pad))
    for i in range(plan.gradient_accumulation_steps):
        m = micro_step + i
        if plan.generates(m) or width is None:
            gen = generation_components(cb.shape, plan, n_seqs=plan.generation_batch_size, prompt_len=P,
                                        completion_len=T, lora=cb.lora, conventions=cb.conventions,
                                        reference_lora=cb.reference_lora)
            total += counted(gen)
            if cb.reward_step_bound is not None:
                total += int(cb.reward_step_bound(plan.generation_batch_size, P, T))
            else:
                total += cb._reward_seen
            total += cb.reward_models.bound(plan.generation_batch_size, P + T)
            width = (_round_up(P, pad) + _round_up(T, pad), _round_up(T, pad))
        total += counted(update_components(cb.shape, plan, n_seqs=plan.per_device_train_batch_size,
                                           seq_len=width[0], completion_len=width[1], lora=cb.lora,
                                           inputs_require_grad=True, conventions=cb.conventions))
    return total


__all__ = ["step_bound"]
