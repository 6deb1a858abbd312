"""The keyword forms of the step formulas, kept for users (README, ``race``'s exports) and
tests; nothing in ``src`` calls them. Standard library only.

Each builds a :class:`race.accounting.grpo.StepPlan` from its keywords and calls the plan's
formula, so the settings are named, defaulted and validated in one place: the plan's
fields (``lora``, ``num_iterations``, ``beta``, ``needs_old_logprobs``, ``recompute``,
``recompute_early_stop``, ``inputs_require_grad``, ``train_logits``, ``share_prompt``,
``reward``, ``conventions``, ...). An unknown keyword is refused by the plan (TypeError).

=========================  ==================================================================
keyword form               plan form
=========================  ==================================================================
``grpo_step_flops``        ``step_flops(StepPlan(shape, G, **settings), P, T, prompt_groups)``
``uniform_step_flops``     ``StepPlan(shape, G, **settings).uniform(prompts, P, T)``
``learning_components``    ``learning_flops(StepPlan(shape, 1, **settings), S, T, prompt_groups)``
=========================  ==================================================================
"""

from __future__ import annotations

from typing import Any, Sequence

from .grpo import HeadPositions, PhaseFlops, StepPlan, uniform_count, learning_flops, step_flops
from .shapes import ModelShape


def grpo_step_flops(shape: ModelShape, prompt_lens: Sequence[int], completion_lens: Sequence[int], *,
                    num_generations: int, prompt_groups: Sequence[int] | None = None,
                    reward_seq_lens: Sequence[int] | None = None, reward_head_positions: HeadPositions = None,
                    judge_completion_lens: Sequence[int] | None = None, **settings: Any) -> PhaseFlops:
    """:func:`race.accounting.grpo.step_flops` with the plan's settings as keywords.
    ``prompt_groups``: the training passes share prompts (see ``learning_flops``)."""
    plan = StepPlan(shape, num_generations, **settings)
    return step_flops(plan, prompt_lens, completion_lens, prompt_groups, reward_seq_lens=reward_seq_lens,
                      reward_head_positions=reward_head_positions, judge_completion_lens=judge_completion_lens)


def uniform_step_flops(shape: ModelShape, *, prompts: int, num_generations: int, prompt_len: int,
                       completion_len: int, **kwargs: Any) -> PhaseFlops:
    """``grpo_step_flops`` with every prompt at ``prompt_len`` and every completion at
    ``completion_len`` (a step's upper bound when those are the maxima)."""
    n = uniform_count(prompts, num_generations, prompt_len, completion_len)
    return grpo_step_flops(shape, [prompt_len] * n, [completion_len] * n, num_generations=num_generations, **kwargs)


def learning_components(shape: ModelShape, seq_lens: Sequence[int], completion_lens: Sequence[int], *,
                        prompt_groups: Sequence[int] | None = None, **settings: Any) -> dict[str, int]:
    """:func:`race.accounting.grpo.learning_flops` with the plan's settings as keywords
    (the group size is not read: the passes see rows)."""
    return learning_flops(StepPlan(shape, 1, **settings), seq_lens, completion_lens, prompt_groups)


__all__ = ["grpo_step_flops", "learning_components", "uniform_step_flops"]
