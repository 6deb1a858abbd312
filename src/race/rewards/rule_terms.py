"""The rule terms' scorers (``race.accounting.reward_kinds.RULE_TERMS`` names each one):
``(problem, completion) -> float`` in [0, 1], 0 FLOPs, parsed and never evaluated.

Every scorer reads a bounded prefix of the completion (``race.tasks.verify.MAX_CHARS``
characters: the verifiers cut there), takes any object (a non-string scores 0), and never
raises on what a policy writes: the hostile-input rules of ``tests/rewards/test_hostile.py``.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Sequence

from race.accounting.reward_kinds import RULE_TERMS, entry_point
from race.tasks import partial_credit, verify, verify_final_answer
from race.tasks.files import TextProblem
from race.tasks.verify import MAX_CHARS

Scorer = Callable[[Any, Any], float]

#: A question/answer completion's explicit answer layouts: ``#### ANSWER`` (GSM8K: the answer
#: on the marker's line, at most 64 characters), ``#ANSWER.`` (RACE's own: a number) and
#: ``\boxed{ANSWER}`` (MATH: at most 64 pieces, a piece a character or one ``{...}`` group of
#: at most 32, so ``\boxed{\frac{1}{2}}`` states an answer). Linear-time patterns on a
#: bounded prefix.
_STATED = re.compile(r"####[ \t]*[^\s#][^\n]{0,63}(?:\n|$)|#-?[0-9][0-9,]{0,30}(?:\.[0-9]{1,12})?\.|"
                     r"\\boxed\{(?:[^{}\n]|\{[^{}\n]{0,32}\}){1,64}\}")


def outcome(problem: Any, completion: Any) -> float:
    """1 when the final answer is right (``race.tasks.verify`` for the built-in task,
    ``verify_final_answer`` for question/answer problems), else 0."""
    v = verify_final_answer(problem, completion) if isinstance(problem, TextProblem) else verify(problem, completion)
    return 1.0 if v.correct else 0.0


def partial(problem: Any, completion: Any) -> float:
    """(valid steps + correct answer) / (operations + 1) for the built-in task; for a
    question/answer problem (no steps) the outcome."""
    if isinstance(problem, TextProblem):
        return outcome(problem, completion)
    return partial_credit(verify(problem, completion))


def answer_format(problem: Any, completion: Any) -> float:
    """1 when the completion follows the task's answer format, whatever its values.

    The built-in task: exactly ``a<op>b=c;`` per operation, then ``#answer.`` and nothing
    after (``Verification.format_ok``: every step and the answer parse, the step count is
    the problem's; the arithmetic may be wrong). A question/answer problem: the completion
    states its answer in an explicit layout (:data:`_STATED`: ``#### 72``, ``#72.`` or
    ``\\boxed{72}``); a bare number at the end is no layout."""
    if isinstance(problem, TextProblem):
        return 1.0 if isinstance(completion, str) and _STATED.search(completion[:MAX_CHARS]) else 0.0
    return 1.0 if verify(problem, completion).format_ok else 0.0


_SCORERS: dict[str, Scorer] = {}


def scorer(term: str) -> Scorer:
    """The scorer of rule term ``term``, from its row (imported on first use)."""
    if term not in _SCORERS:
        if term not in RULE_TERMS:
            raise ValueError(f"unknown rule term {term!r}; terms: {', '.join(RULE_TERMS)}")
        module, func = entry_point(RULE_TERMS[term].scorer)
        _SCORERS[term] = getattr(importlib.import_module(module), func)
    return _SCORERS[term]


def rule_terms(problem: Any, completion: Any, needed: Sequence[str]) -> dict[str, float]:
    """The terms ``needed`` of one completion, and always ``outcome`` (what a reward
    reports as verified)."""
    out = {t: scorer(t)(problem, completion) for t in needed}
    if "outcome" not in out:
        out["outcome"] = outcome(problem, completion)
    return out


__all__ = ["answer_format", "outcome", "partial", "rule_terms", "scorer"]
