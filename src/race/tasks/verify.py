"""Verifier for the chained-arithmetic task: parse, never evaluate.

The completion is read with bounded string operations and fixed, linear-time regular
expressions; nothing is passed to ``eval``/``exec``/``sympify``. Hostile input (megabyte
strings, 10,000-digit numbers, lone surrogates, ``__import__('os')``) costs bounded time
and scores zero:

- only the first :data:`MAX_CHARS` characters are read (a real solution is < 200);
- numbers are ASCII digit runs of at most :data:`MAX_DIGITS` digits (``[0-9]``, not
  ``\\d``, so Unicode digits such as ``"٣"`` never reach ``int``);
- at most :data:`MAX_STEPS` steps are split off.

Step correctness (for process rewards): written step ``i`` is valid when it reads
``a<op>b=c`` with ``op``/``b`` equal to the problem's ``i``-th operator/operand,
``a op b == c``, and ``a`` chains from the previous step's WRITTEN result (the first
operand for step 0). An arithmetic slip therefore costs the step where it happens, and
later steps that correctly continue from the slipped value still count (error carried
forward); if the previous step could not be parsed at all, ``a`` must equal the true
running value. Steps beyond the problem's operation count are invalid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from race.tasks.arith import END_MARK, FINAL_MARK, STEP_SEP

MAX_CHARS = 4096
MAX_DIGITS = 12
MAX_STEPS = 64

_NUM = rf"-?[0-9]{{1,{MAX_DIGITS}}}"
_STEP_RE = re.compile(rf"({_NUM})([+\-])([0-9]{{1,{MAX_DIGITS}}})=({_NUM})")
_ANSWER_RE = re.compile(rf"({_NUM}){re.escape(END_MARK)}")


@dataclass(frozen=True)
class Verification:
    """What the verifier read from one completion.

    ``step_correct`` has one entry per step the completion wrote (up to ``MAX_STEPS``);
    ``n_steps_expected`` is the problem's number of operations. ``format_ok`` means the
    completion is exactly ``step;...;#answer.`` with the expected number of steps (trailing
    whitespace allowed).
    """

    correct: bool
    answer: int | None
    step_correct: list[bool] = field(default_factory=list)
    format_ok: bool = False
    n_steps_expected: int = 0


def _failed(n_expected: int) -> Verification:
    return Verification(False, None, [], False, n_expected)


def _as_text(completion: Any) -> str | None:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (bytes, bytearray)):
        return bytes(completion[: 4 * MAX_CHARS]).decode("utf-8", errors="replace")
    return None


def verify(problem: Any, completion: Any) -> Verification:
    """Check a completion for an arithmetic :class:`~race.tasks.arith.Problem`.

    Never raises on bad completions (non-strings score zero); raises ``TypeError`` only
    when ``problem`` is not an arithmetic problem (use
    :func:`race.tasks.files.verify_final_answer` for GSM8K-style problems).
    """
    steps = getattr(problem, "steps", None)
    if steps is None:
        raise TypeError(f"verify() needs an arithmetic Problem with .steps, got {type(problem).__name__}; "
                        "use race.tasks.verify_final_answer for question/answer files")
    n_ops = len(steps)
    text = _as_text(completion)
    if text is None:
        return _failed(n_ops)
    try:
        return _verify_text(steps, problem.answer, text)
    except Exception:  # pragma: no cover - defensive: a verifier bug must not crash a run
        return _failed(n_ops)


def _verify_text(steps: Any, true_answer: int, completion: str) -> Verification:
    n_ops = len(steps)
    truncated = len(completion) > MAX_CHARS
    text = completion[:MAX_CHARS]

    hash_at = text.find(FINAL_MARK)
    body = text if hash_at < 0 else text[:hash_at]
    pieces = body.split(STEP_SEP, MAX_STEPS) if body else []
    body_closed = bool(pieces) and pieces[-1] == ""
    if body_closed:
        pieces.pop()

    step_ok: list[bool] = []
    all_parsed = True
    prev_written: int | None = None
    for i, piece in enumerate(pieces[:MAX_STEPS]):
        m = _STEP_RE.fullmatch(piece)
        if m is None:
            all_parsed = False
            step_ok.append(False)
            prev_written = None
            continue
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        ok = False
        if i < n_ops:
            _, want_op, want_b, _ = steps[i]
            want_a = steps[0][0] if i == 0 else (prev_written if prev_written is not None else steps[i - 1][3])
            local = (a + b) if op == "+" else (a - b)
            ok = a == want_a and op == want_op and b == want_b and local == c
        step_ok.append(ok)
        prev_written = c

    answer: int | None = None
    rest = ""
    if hash_at >= 0:
        m = _ANSWER_RE.match(text, hash_at + len(FINAL_MARK))
        if m is not None:
            answer = int(m.group(1))
            rest = text[m.end():]
    correct = answer is not None and answer == true_answer
    format_ok = (not truncated and answer is not None and all_parsed and len(pieces) == n_ops
                 and (body_closed or n_ops == 0) and rest.strip() == "")
    return Verification(correct, answer, step_ok, format_ok, n_ops)


def partial_credit(v: Verification) -> float:
    """Dense reward in [0, 1]: (valid steps among the first ``n_ops`` + correct answer)
    divided by (``n_ops`` + 1). Extra steps earn nothing; a correct answer alone is worth
    ``1 / (n_ops + 1)``."""
    n = v.n_steps_expected
    valid = sum(1 for ok in v.step_correct[:n] if ok)
    return (valid + (1 if v.correct else 0)) / (n + 1)


def outcome_reward(v: Verification) -> float:
    """0/1 final-answer reward."""
    return 1.0 if v.correct else 0.0
