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


class FileTask:
    """A question/answer file seen through the task interface of
    :class:`~race.tasks.arith.ArithTask`: ``problems(split, n, seed)``.

    Rows are split by the same SHA-256 bucket rule as the arithmetic task, on the problem
    id (hash of question + answer): ``test`` owns buckets 0-9, ``hard`` 10-19 and
    ``train`` 20-99, so the splits are disjoint and stable when rows are added. A file has
    no difficulty label, so ``hard`` is simply a second held-out slice. A request for more
    problems than a split holds returns the whole split (shuffled by ``seed``); an empty
    split is an error. The file is read once, on first use.
    """

    _BUCKETS = {"test": range(0, 10), "hard": range(10, 20), "train": range(20, 100)}

    def __init__(self, path: str | os.PathLike[str], *, fmt: str | None = None,
                 template: str = DEFAULT_TEMPLATE) -> None:
        self.path, self.fmt, self.template = Path(path).expanduser(), fmt, template
        self._splits: dict[str, list[TextProblem]] | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> "FileTask":
        """Build from a :class:`race.spec.run.TaskSettings` with ``name`` jsonl or parquet."""
        fmt = {"jsonl": "json", "parquet": "parquet"}.get(getattr(settings, "name", ""))
        if fmt is None or not getattr(settings, "path", None):
            raise ValueError(f"task.name={getattr(settings, 'name', None)!r}: FileTask needs name jsonl or parquet "
                             "and task.path (a local file with question/answer fields)")
        return cls(settings.path, fmt=fmt)

    def describe(self) -> dict[str, Any]:
        return dict(task="file", path=str(self.path), fmt=self.fmt, template=self.template)

    def split_sizes(self) -> dict[str, int]:
        return {k: len(v) for k, v in self._load().items()}

    def _load(self) -> dict[str, list[TextProblem]]:
        if self._splits is None:
            rows = load_problems_file(self.path, fmt=self.fmt, template=self.template)
            splits: dict[str, list[TextProblem]] = {k: [] for k in self._BUCKETS}
            for p in rows:
                b = int(hashlib.sha256(p.id.encode()).hexdigest()[:8], 16) % 100
                name = next(k for k, r in self._BUCKETS.items() if b in r)
                splits[name].append(TextProblem(p.id, p.prompt, p.answer, p.question, p.solution, name))
            self._splits = splits
        return self._splits

    def problems(self, split: str, n: int, seed: int = 0) -> list[TextProblem]:
        """Up to ``n`` problems of ``split`` in a ``seed``-determined order."""
        import random

        if split not in self._BUCKETS:
            raise ValueError(f"unknown split {split!r}; choose one of {tuple(self._BUCKETS)}")
        pool = self._load()[split]
        if not pool:
            raise ValueError(f"{self.path}: the {split!r} split is empty (rows are assigned by hash: about 80% "
                             "train, 10% test, 10% hard); add rows to the file")
        order = list(pool)
        random.Random(f"race-file:{split}:{seed}").shuffle(order)
        return order[: max(0, n)]


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
