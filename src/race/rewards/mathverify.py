"""``math``: final answers checked with math-verify (LaTeX/expression equivalence), rule-based
(0 FLOPs), bounded in input size and time, never evaluating the text."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from race.rewards.base import RewardOutput
from race.rewards.rule_terms import outcome
from race.rewards.text import sanitize
from race.tasks.files import TextProblem


class _Deadline(BaseException):
    """Raised by the timer inside math-verify; a BaseException so that the library's
    ``except Exception`` blocks cannot swallow it."""


MATH_MAX_CHARS = 4096
MATH_TIMEOUT_S = 0.5


def _risky(text: str) -> bool:
    """Inputs math-verify is not given (the fast check still runs): a number over 40
    digits, or a power whose exponent has 4+ digits or is itself a power."""
    import re

    return bool(re.search(r"[0-9]{41}", text) or re.search(r"(\^|\*\*)\s*[{(]?\s*-?[0-9]{4}", text)
                or re.search(r"(\^|\*\*)[^$\n]{0,12}(\^|\*\*)", text))


_WARM = False


def _warm_up(parse: Any, verify: Any) -> None:
    """First parses pay sympy's and the LaTeX grammar's lazy set-up (~1 s); pay it once,
    on fixed benign inputs, outside the per-answer timer."""
    global _WARM
    if not _WARM:
        _WARM = True
        for gold, pred in (("\\frac{1}{2}", "$0.5$"), ("x^2+1", "$1+x^2$"), ("2\\sqrt{2}", "$\\sqrt{8}$")):
            try:
                verify(parse("\\boxed{" + gold + "}", parsing_timeout=None), parse(pred, parsing_timeout=None),
                       timeout_seconds=None)
            except Exception:  # pragma: no cover - warm-up only
                pass


def _math_verify(gold: str, text: str, timeout_s: float) -> bool:
    import logging
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False  # math-verify's only interrupt is a signal timer: main thread only
    try:
        from math_verify import parse, verify
    except ImportError:
        return False
    for name in ("math_verify.parser", "math_verify.grader"):  # "timeout disabled": we run our own timer
        logging.getLogger(name).setLevel(logging.ERROR)
    _warm_up(parse, verify)

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Deadline()

    old_timer = signal.getitimer(signal.ITIMER_REAL)  # someone else's alarm (e.g. pytest-timeout)
    old = signal.signal(signal.SIGALRM, on_alarm)
    t0 = time.monotonic()
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            g = parse("\\boxed{" + gold + "}", parsing_timeout=None)  # type: ignore[arg-type]
            p = parse(text, parsing_timeout=None)  # type: ignore[arg-type]
            return bool(g and p and verify(g, p, timeout_seconds=None))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)  # an alarm firing in here is caught below
    except (_Deadline, Exception):
        return False
    finally:
        signal.signal(signal.SIGALRM, old)
        if old_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, old_timer[0] - (time.monotonic() - t0)), old_timer[1])


def math_correct(problem: Any, completion: Any, *, max_chars: int = MATH_MAX_CHARS,
                 timeout_s: float = MATH_TIMEOUT_S) -> bool:
    """Final-answer correctness with math-verify (LaTeX/expression equivalence, e.g.
    ``\\frac{1}{2}`` == ``0.5``) for question/answer problems, after the exact rule check
    (which alone decides for the built-in task). Bounded: only the first
    ``max_chars`` characters are read, numbers over 40 digits and power towers are not
    parsed, and parsing + comparison stop after ``timeout_s`` (a signal timer, so only
    in the main thread; elsewhere the rule check alone decides). Never evaluates text."""
    if not isinstance(completion, str):
        return False
    text = sanitize(completion, max_chars)
    if outcome(problem, text) == 1.0:
        return True
    if not isinstance(problem, TextProblem):
        return False  # the built-in task: the exact parse decides (math-verify would read a step)
    gold = str(getattr(problem, "answer", ""))[:200]
    if not gold or _risky(text) or _risky(gold):
        return False
    return _math_verify(gold, text, timeout_s)


@dataclass
class MathReward:
    """0/1 reward from :func:`math_correct` (0 FLOPs). ``verified`` stays the rule check,
    the same one every reward system reports, so runs compare."""

    name: str = "math"
    kind: str = "rule"

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput:
        t0 = time.perf_counter()
        rewards = [1.0 if math_correct(p, c) else 0.0 for p, c in zip(problems, completions, strict=True)]
        verified = [outcome(p, sanitize(c)) for p, c in zip(problems, completions)]
        return RewardOutput(rewards, verified, seconds=time.perf_counter() - t0)

    def step_bound(self, n_sequences: int, max_prompt_len: int, max_completion_len: int, *,
                   problems: Sequence[Any] | None = None) -> int:
        return 0


def math_score(problem: Any, completion: Any) -> float:
    """The ``math`` rule term (``race.accounting.reward_kinds.RULE_TERMS``): 1 when
    :func:`math_correct`, else 0."""
    return 1.0 if math_correct(problem, completion) else 0.0


def build_math(reward: Any, **_: Any) -> MathReward:
    """The builder of kind ``math`` (its row in ``race.accounting.reward_kinds``; the
    grammar refuses an argument)."""
    return MathReward()
