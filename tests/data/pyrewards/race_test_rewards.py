"""Reward functions the tests name by import path (``reward: py:race_test_rewards:NAME``).

They are written as a TRL user writes ``reward_funcs``: keyword arguments in (``prompts``,
``completions`` and the dataset's columns), one float per completion out; nothing here
imports RACE. The tests put this folder on ``sys.path`` (local workers inherit it) and on
``PYTHONPATH`` (Ray workers), as a user does with their own module.
"""

from __future__ import annotations

import re

CALLS: list[dict] = []  # what each call received (the local-process tests read it)


def final_answer(completions, answer, **kwargs):
    """1.0 when the completion states the problem's answer as ``#ANSWER.``, plus a small
    shaping term: the share of the completion written in the task's alphabet of steps."""
    CALLS.append({"keys": sorted(["completions", "answer", *kwargs]), "n": len(completions)})
    out = []
    for text, ans in zip(completions, answer):
        stated = re.search(r"#(-?\d+)\.", text)
        right = 1.0 if stated and int(stated.group(1)) == int(ans) else 0.0
        shaped = sum(ch.isdigit() or ch in "+-=;" for ch in text) / max(1, len(text))
        out.append(right + 0.1 * shaped)
    return out


def digits_by_model(prompts, completions, **kwargs):
    """The share of digits, charged as if a scoring model read every completion."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


digits_by_model.race_reward_model = "orm:tiny-xs"


def one_short(completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def a_none(completions, **kwargs):
    return [None] + [1.0] * (len(completions) - 1)


def a_string(completions, **kwargs):
    return "1.0"


def not_finite(completions, **kwargs):
    return [float("nan")] * len(completions)


def positional(prompts, completions, completion_ids, **kwargs):
    """Requires TRL's ``completion_ids``, which RACE does not pass."""
    return [0.0] * len(completions)


def judged(completions, **kwargs):
    return [0.0] * len(completions)


judged.race_reward_model = "judge:tiny-xs"  # a judge decodes: not a scoring model RACE can price here

NOT_A_FUNCTION = 3
