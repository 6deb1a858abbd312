"""Reward functions for RACE written as TRL writes ``reward_funcs``: keyword arguments in
(``prompts``, ``completions`` and the dataset's columns, here the built-in task's ``answer``),
one float per completion out. Nothing here imports RACE, so the same functions go to
``GRPOTrainer(reward_funcs=[correct_answer])``.

A run or grid file names one by import path; the module must be importable where the run
runs (installed, or its folder on PYTHONPATH: every Ray node too)::

    reward: py:rewards_example:correct_answer
    PYTHONPATH=configs race train configs/tiny-pyreward.yaml

A function that runs a scoring model declares it, so RACE charges its FLOPs (docs/rewards.md)::

    my_reward.race_reward_model = "orm:path/to/reward-model"
"""

from __future__ import annotations

import re

FINAL = re.compile(r"#(-?\d+)\.")  # the built-in task's final answer: "...;#21."


def correct_answer(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's final answer is the problem's, 0.1 for a wrong answer in
    the right layout, else 0."""
    out = []
    for text, ans in zip(completions, answer):
        found = FINAL.search(text)
        out.append(0.0 if found is None else 1.0 if int(found.group(1)) == int(ans) else 0.1)
    return out


def shorter_is_better(completions, **kwargs) -> list[float]:
    """A shaping term: 1 for an empty completion down to 0 at 64 characters or more."""
    return [max(0.0, 1.0 - len(text) / 64) for text in completions]
