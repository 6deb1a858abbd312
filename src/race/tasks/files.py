"""GSM8K/MATH-style problems from local JSONL or Parquet files, and their answer check.

Each row needs a ``question`` and an ``answer`` field. GSM8K answers carry the worked
solution followed by ``#### 42``; MATH solutions mark the result with ``\\boxed{...}``;
anything else is taken as the final answer itself. Files are read with ``datasets``
(``load_dataset("json"|"parquet", data_files=...)``), nothing is downloaded.

The answers are kept as normalised STRINGS (``"1234"``, ``"\\frac{1}{2}"``), and
:func:`verify_final_answer` compares a completion's final answer to them: numerically
when both sides are plain numbers, as normalised text otherwise. That is a rule-based
check, not a symbolic one; plug in ``math-verify`` for MATH-grade equivalence.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from race.tasks.verify import MAX_CHARS, Verification

DEFAULT_TEMPLATE = "Q:{question}\nA:"
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_NUMBER_RE = re.compile(r"-?[0-9][0-9,]{0,30}(?:\.[0-9]{1,12})?")
_PLAIN_NUMBER_RE = re.compile(r"-?[0-9]{1,30}(?:\.[0-9]{1,12})?|-?[0-9]{1,15}/[0-9]{1,15}")


@dataclass(frozen=True)
class TextProblem:
    """A question/answer problem: ``answer`` is the normalised final answer (a string);
    ``solution`` the file's full answer text (worked solution when the file has one)."""

    id: str
    prompt: str
    answer: str
    question: str
    solution: str
    split: str = ""


def _boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces (bounded scan)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, min(len(text), i + 1000)):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1: j]
    return None


def normalize_answer(ans: str) -> str:
    """Strip whitespace, ``$``, trailing periods and thousands separators in numbers."""
    a = ans.strip().strip("$").strip()
    a = a.rstrip(".").strip()
    if re.fullmatch(r"-?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]+)?", a):
        a = a.replace(",", "")
    return a


def extract_final_answer(text: str) -> str:
    """The final answer written in a GSM8K/MATH answer field (``#### x``, ``\\boxed{x}``,
    or the whole field)."""
    if "####" in text:
        return normalize_answer(text.rsplit("####", 1)[1])
    boxed = _boxed(text)
    if boxed is not None:
        return normalize_answer(boxed)
    return normalize_answer(text)


def load_problems_file(path: str | os.PathLike[str], *, fmt: str | None = None, template: str = DEFAULT_TEMPLATE,
                       limit: int | None = None, split: str = "") -> list[TextProblem]:
    """Read ``question``/``answer`` rows from a local ``.jsonl``/``.json``/``.parquet`` file.

    Args:
        fmt: ``"json"`` or ``"parquet"``; inferred from the suffix when omitted.
        template: prompt format with a ``{question}`` slot.
        limit: keep only the first ``limit`` rows.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the first
    row (0-based) whose ``question`` or ``answer`` is missing or empty.
    """
    from datasets import load_dataset

    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"problem file not found: {p}")
    fmt = fmt or _FORMATS.get(p.suffix.lower())
    if fmt not in ("json", "parquet"):
        raise ValueError(f"cannot tell the format of {p}: use a .jsonl or .parquet file, or pass fmt='json'|'parquet'")
    if "{question}" not in template:
        raise ValueError(f"template {template!r} has no {{question}} slot")
    ds = load_dataset(fmt, data_files=str(p), split="train")
    missing_cols = [c for c in ("question", "answer") if c not in ds.column_names]
    if missing_cols:
        raise ValueError(f"{p}: row 0 has no {missing_cols[0]!r} field (columns: {ds.column_names}); "
                         "each row needs 'question' and 'answer'")
    out: list[TextProblem] = []
    n = len(ds) if limit is None else min(limit, len(ds))
    for i in range(n):
        row = ds[i]
        for key in ("question", "answer"):
            if row.get(key) is None or str(row[key]).strip() == "":
                raise ValueError(f"{p}: row {i} has no {key!r} field (or it is empty); each row needs "
                                 "'question' and 'answer'")
        q, a = str(row["question"]), str(row["answer"])
        pid = "file-" + hashlib.sha256(f"{q}\x00{a}".encode()).hexdigest()[:12]
        out.append(TextProblem(id=pid, prompt=template.format(question=q), answer=extract_final_answer(a),
                               question=q, solution=a, split=split))
    return out


def completion_answer(completion: str) -> str | None:
    """The final answer a completion states: after the last ``####``, else after ``#`` up
    to ``.``, else the last ``\\boxed{}``, else the last number. Bounded work."""
    text = completion[:MAX_CHARS]
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip().splitlines()
        return normalize_answer(tail[0]) if tail else None
    m = re.search(r"#(-?[0-9][0-9,]{0,30}(?:\.[0-9]{1,12})?)\.", text)
    if m is not None:
        return normalize_answer(m.group(1))
    boxed = _boxed(text)
    if boxed is not None:
        return normalize_answer(boxed)
    nums = _NUMBER_RE.findall(text)
    return normalize_answer(nums[-1]) if nums else None


def answers_match(given: str, expected: str) -> bool:
    """Numeric equality for plain numbers/fractions, else exact normalised text."""
    g, e = normalize_answer(given), normalize_answer(expected)
    if _PLAIN_NUMBER_RE.fullmatch(g) and _PLAIN_NUMBER_RE.fullmatch(e):
        try:
            return Fraction(g) == Fraction(e)
        except (ValueError, ZeroDivisionError):
            return False
    return g == e and g != ""


def verify_final_answer(problem: Any, completion: Any) -> Verification:
    """Final-answer check for :class:`TextProblem` (``answer`` in the result is a string;
    no step structure, so ``step_correct`` is empty and ``n_steps_expected`` 0)."""
    if not isinstance(completion, str):
        return Verification(False, None, [], False, 0)
    try:
        ans = completion_answer(completion)
    except Exception:  # pragma: no cover - defensive
        ans = None
    if ans is None:
        return Verification(False, None, [], False, 0)
    return Verification(answers_match(ans, str(problem.answer)), ans, [], True, 0)  # type: ignore[arg-type]
