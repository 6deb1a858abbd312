"""GSM8K/MATH-style problems from local data, and their answer check.

Each row needs a question and an answer column (``question``/``answer``, or the columns a
``columns`` mapping names, e.g. MATH's ``problem``/``solution``). GSM8K answers carry the
worked solution followed by ``#### 42``; MATH solutions mark the result with
``\\boxed{...}``; anything else is taken as the final answer itself. Data is read with
``datasets`` from local files or directories (:mod:`race.tasks.data`), nothing is
downloaded; prompts are rendered by :class:`race.tasks.prompts.PromptFormat` (a format
string, optionally the tokenizer's chat template).

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

from race.tasks.data import load_table, resolve_columns
from race.tasks.prompts import DEFAULT_TEMPLATE, PromptFormat
from race.tasks.verify import MAX_CHARS, Verification

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
                       limit: int | None = None, split: str = "", columns: dict[str, str] | None = None,
                       prompt: PromptFormat | None = None, role: str = "train") -> list[TextProblem]:
    """Read question/answer rows from local data (:func:`race.tasks.data.load_table`: a
    ``.jsonl``/``.json``/``.parquet`` file, a directory of them, or a ``save_to_disk``
    directory; ``role`` picks a ``DatasetDict``'s split).

    Args:
        fmt: ``"json"`` or ``"parquet"``; inferred from the suffix when omitted.
        template: prompt format with a ``{question}`` slot (ignored when ``prompt`` is given).
        limit: keep only the first ``limit`` rows.
        columns: problem field -> column (``{"question": "problem", "answer": "solution"}``).
        prompt: how prompts are rendered (:class:`race.tasks.prompts.PromptFormat`: template,
            chat template); default ``PromptFormat(template)``.

    Raises ``FileNotFoundError`` for a missing path and ``ValueError`` naming the missing
    column (with the columns found), the first row (0-based) whose question or answer is
    missing or empty, or a template field that is not a column.
    """
    fmt_prompt = prompt if prompt is not None else PromptFormat(template)
    p = Path(path).expanduser()
    ds = load_table(p, fmt=fmt, role=role)
    cols = resolve_columns(list(ds.column_names), columns, p)
    fmt_prompt.check_columns(list(ds.column_names), cols["answer"], p)
    out: list[TextProblem] = []
    n = len(ds) if limit is None else min(limit, len(ds))
    for i in range(n):
        row = ds[i]
        for key in ("question", "answer"):
            value = row.get(cols[key])
            if value is None or str(value).strip() == "":
                raise ValueError(f"{p}: row {i} has no {cols[key]!r} field (or it is empty); each row needs a "
                                 f"{key} (column {cols[key]!r})")
        q, a = str(row[cols["question"]]), str(row[cols["answer"]])
        pid = "file-" + hashlib.sha256(f"{q}\x00{a}".encode()).hexdigest()[:12]
        out.append(TextProblem(id=pid, prompt=fmt_prompt.render(q, row), answer=extract_final_answer(a),
                               question=q, solution=a, split=split))
    return out


class FileTask:
    """Question/answer data seen through the task interface of
    :class:`~race.tasks.arith.ArithTask`: ``problems(split, n, seed)``.

    One source (``path``): rows are split by the same SHA-256 bucket rule as the
    arithmetic task, on the problem id (hash of question + answer): ``test`` owns buckets
    0-9, ``hard`` 10-19 and ``train`` 20-99, so the splits are disjoint and stable when
    rows are added. A file has no difficulty label, so ``hard`` is simply a second
    held-out slice.

    Separate sources (``test_path``, optionally ``hard_path``): ``train`` is the whole of
    ``path`` less any problem (same question and answer) that the evaluation data holds,
    ``test`` is ``test_path`` and ``hard`` is ``hard_path`` -- or nothing, so the ``hard``
    target is skipped.

    A request for more problems than a split holds returns the whole split (shuffled by
    ``seed``); an empty split is an error. The data is read once, on first use.
    """

    _BUCKETS = {"test": range(0, 10), "hard": range(10, 20), "train": range(20, 100)}

    def __init__(self, path: str | os.PathLike[str], *, fmt: str | None = None, template: str | None = None,
                 test_path: str | os.PathLike[str] | None = None, hard_path: str | os.PathLike[str] | None = None,
                 columns: dict[str, str] | None = None, chat_template: bool = False,
                 system_prompt: str | None = None, tokenizer: Any = None) -> None:
        self.path, self.fmt = Path(path).expanduser(), fmt
        self.test_path = Path(test_path).expanduser() if test_path else None
        self.hard_path = Path(hard_path).expanduser() if hard_path else None
        if self.hard_path is not None and self.test_path is None:
            raise ValueError("hard_path needs test_path")
        self.columns = dict(columns or {})
        self.prompt = PromptFormat(template, chat=chat_template, system_prompt=system_prompt, tokenizer=tokenizer)
        self.template = self.prompt.template
        self._splits: dict[str, list[TextProblem]] | None = None

    @classmethod
    def from_settings(cls, settings: Any, tokenizer: Any = None) -> "FileTask":
        """Build from a :class:`race.spec.task.TaskSettings` naming data (``tokenizer``
        renders chat templates)."""
        fmt = {"jsonl": "json", "parquet": "parquet", "dataset": None}.get(getattr(settings, "name", ""), "")
        source = getattr(settings, "train_source", None) or getattr(settings, "path", None)
        if fmt == "" or not source:
            raise ValueError(f"task.name={getattr(settings, 'name', None)!r}: FileTask needs name jsonl, parquet or "
                             "dataset and task.path or task.train_path (local data with question/answer columns)")
        return cls(source, fmt=fmt, template=settings.prompt_template, test_path=settings.test_path,
                   hard_path=settings.hard_path, columns=settings.columns, chat_template=settings.chat_template,
                   system_prompt=settings.system_prompt, tokenizer=tokenizer)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(task="file", path=str(self.path), fmt=self.fmt, template=self.template)
        extra = dict(test_path=str(self.test_path) if self.test_path else None,
                     hard_path=str(self.hard_path) if self.hard_path else None, columns=self.columns or None,
                     chat_template=self.prompt.describe().get("chat_template"), system_prompt=self.prompt.system_prompt)
        d.update({k: v for k, v in extra.items() if v is not None})
        return d

    def split_sizes(self) -> dict[str, int]:
        return {k: len(v) for k, v in self._load().items()}

    def _read(self, path: Path, role: str) -> list[TextProblem]:
        return load_problems_file(path, fmt=self.fmt, columns=self.columns, prompt=self.prompt, role=role, split=role)

    def _load(self) -> dict[str, list[TextProblem]]:
        if self._splits is not None:
            return self._splits
        if self.test_path is not None:
            test = self._read(self.test_path, "test")
            hard = self._read(self.hard_path, "hard") if self.hard_path is not None else []
            held_out = {p.id for p in test} | {p.id for p in hard}
            train = [p for p in self._read(self.path, "train") if p.id not in held_out]
            self._splits = {"train": train, "test": test, "hard": hard}
            return self._splits
        splits: dict[str, list[TextProblem]] = {k: [] for k in self._BUCKETS}
        for p in self._read(self.path, "train"):
            b = int(hashlib.sha256(p.id.encode()).hexdigest()[:8], 16) % 100
            name = next(k for k, r in self._BUCKETS.items() if b in r)
            splits[name].append(TextProblem(p.id, p.prompt, p.answer, p.question, p.solution, name))
        self._splits = splits
        return self._splits

    def problems(self, split: str, n: int, seed: int = 0) -> list[TextProblem]:
        """Up to ``n`` problems of ``split`` in a ``seed``-determined order (``hard`` is
        empty when evaluation data is given without ``hard_path``)."""
        import random

        if split not in self._BUCKETS:
            raise ValueError(f"unknown split {split!r}; choose one of {tuple(self._BUCKETS)}")
        pool = self._load()[split]
        if not pool and split == "hard" and self.test_path is not None and self.hard_path is None:
            return []
        if not pool:
            where = {"train": self.path, "test": self.test_path, "hard": self.hard_path}[split] or self.path
            hint = ("rows are assigned by hash: about 80% train, 10% test, 10% hard; add rows to the file"
                    if self.test_path is None else "it holds no problems (train drops those the test data holds)")
            raise ValueError(f"{where}: the {split!r} split is empty ({hint})")
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
