"""Built-in task: chained addition/subtraction with worked steps.

A problem is a left-to-right chain such as ``23+5-7``; the model writes one step per
operation, each step starting from the previous result, then the final answer::

    prompt:      "Q:23+5-7\\nA:"
    completion:  "23+5=28;28-7=21;#21."

``;`` (:data:`STEP_SEP`) ends every step, so a process reward model can score at each
separator; ``#`` (:data:`FINAL_MARK`) introduces the final answer and ``.``
(:data:`END_MARK`) closes it. All characters are in the character tokenizer's alphabet.

Why this task: it is verifiable by parsing (no ``eval``), has step structure for process
rewards, and its difficulty is a dial (number of operations, operand range). The first
experiments (docs/design.md section 4) trained operands 0-49 with 2-4 operations; the
default here is the easier 0-19 with 2-4 operations, because with one fixed-step SFT
recipe shared by the tiny family (a few minutes on 2 CPU cores) that is where the sizes
land at partial greedy accuracy (see ``race.builds.warmstart``). By default intermediate
results never go below zero (a subtraction draws its operand from ``0..running value``),
which keeps every number sign-free.

Splits are DISJOINT by construction: each expression is hashed (SHA-256) into one of 100
buckets; ``test`` owns buckets 0-9, ``hard`` buckets 10-19 and ``train`` buckets 20-99,
and a generator only keeps expressions from its own buckets. ``hard`` also uses more
operations (``hard_min_ops..hard_max_ops``, default 5) than the training range.
Generation is deterministic: the random stream is seeded by (task seed, split, call seed).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

PROMPT_PREFIX = "Q:"
ANSWER_PREFIX = "\nA:"
STEP_SEP = ";"
FINAL_MARK = "#"
END_MARK = "."
OPS = ("+", "-")
SPLITS = ("train", "test", "hard")
#: The per-step seed streams (name -> stride): a run's seed times the stride plus the step.
#: Runs whose seeds differ draw apart for ``stride`` steps; the streams draw apart from each
#: other. ``problems``: the step's training problems; ``sampling``: the rollout's draws
#: (``race.engines.sampling.sampling_generator``); ``torch``: torch's global generator at
#: the start of a built-in step (LoRA dropout); ``selection``: which rollouts the update
#: trains on under ``update_selection: random`` (``race.engines.selection.selection_rng``).
SEED_STREAMS = {"problems": 1_000_003, "sampling": 7_919, "torch": 1_000_033, "selection": 104_729}
STEP_SEED_STRIDE = SEED_STREAMS["problems"]  # different problems for the first million steps


def step_seed(seed: int, step: int, stream: str = "problems") -> int:
    """The one per-step seed: what a run (or a warm-start / reward-model recipe) with seed
    ``seed`` seeds ``stream`` with at step ``step`` (:data:`SEED_STREAMS`); for the
    problems ``seed * 1_000_003 + step``. Every trainer draws its step's problems with it
    (the built-in engine's step b and the TRL engine's batch b are the same problems)."""
    if stream not in SEED_STREAMS:
        raise ValueError(f"unknown seed stream {stream!r}; choose one of {', '.join(SEED_STREAMS)}")
    return seed * SEED_STREAMS[stream] + step

_BUCKETS = {"test": range(0, 10), "hard": range(10, 20), "train": range(20, 100)}


@dataclass(frozen=True)
class Problem:
    """One chained-arithmetic problem.

    ``steps`` holds ``(a, op, b, result)`` per operation in order; ``a`` of step 0 is the
    first operand and ``a`` of every later step is the previous ``result``.
    """

    id: str
    prompt: str
    answer: int
    steps: tuple[tuple[int, str, int, int], ...]
    n_ops: int
    split: str = field(default="", compare=False)

    @property
    def expression(self) -> str:
        """The chain as written in the prompt, e.g. ``"23+5-7"``."""
        return expression_of(self.steps)

    @property
    def operands(self) -> list[int]:
        return [self.steps[0][0]] + [s[2] for s in self.steps]


def expression_of(steps: Any) -> str:
    first = str(steps[0][0])
    return first + "".join(f"{op}{b}" for _, op, b, _ in steps)


def bucket_of(expression: str) -> int:
    """Split bucket (0..99) of an expression: the first 8 hex digits of its SHA-256."""
    return int(hashlib.sha256(expression.encode()).hexdigest()[:8], 16) % 100


def split_of(expression: str) -> str:
    """Which split owns ``expression`` (``train``, ``test`` or ``hard``) by its hash."""
    b = bucket_of(expression)
    for name, rng in _BUCKETS.items():
        if b in rng:
            return name
    raise AssertionError(b)  # pragma: no cover


def make_problem(operands: list[int], ops: list[str], split: str = "") -> Problem:
    """Build a :class:`Problem` from explicit operands and operators (``len(ops) ==
    len(operands) - 1``), computing each step's result."""
    if len(ops) != len(operands) - 1 or not ops:
        raise ValueError(f"need at least one operator and len(ops) == len(operands) - 1, got {operands} / {ops}")
    steps = []
    cur = operands[0]
    for op, b in zip(ops, operands[1:]):
        if op not in OPS:
            raise ValueError(f"operator {op!r} not supported; use one of {OPS}")
        res = cur + b if op == "+" else cur - b
        steps.append((cur, op, b, res))
        cur = res
    expr = expression_of(steps)
    pid = "arith-" + hashlib.sha256(expr.encode()).hexdigest()[:12]
    return Problem(id=pid, prompt=f"{PROMPT_PREFIX}{expr}{ANSWER_PREFIX}", answer=cur,
                   steps=tuple(steps), n_ops=len(steps), split=split)


def solution_text(problem: Problem) -> str:
    """The reference worked solution (the completion the model should write), e.g.
    ``"23+5=28;28-7=21;#21."``. No end-of-sequence token: the trainer appends it."""
    body = "".join(f"{a}{op}{b}={c}{STEP_SEP}" for a, op, b, c in problem.steps)
    return f"{body}{FINAL_MARK}{problem.answer}{END_MARK}"


class ArithTask:
    """Deterministic generator of chained +/- problems with disjoint train/test/hard splits.

    Args:
        min_ops, max_ops: operations per problem for ``train``/``test`` (uniform).
        max_operand: operands are drawn from ``0..max_operand``.
        seed: task seed; with the split name and the call seed it fixes every problem.
        hard_min_ops, hard_max_ops: operations per problem in the ``hard`` split.
        allow_negative: when False (default) a subtraction never takes the running value
            below zero.
    """

    def __init__(self, min_ops: int = 2, max_ops: int = 4, max_operand: int = 19, seed: int = 0, *,
                 hard_min_ops: int = 5, hard_max_ops: int = 5, allow_negative: bool = False) -> None:
        if min_ops < 1 or max_ops < min_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got min_ops={min_ops}, max_ops={max_ops}")
        if hard_min_ops < 1 or hard_max_ops < hard_min_ops:
            raise ValueError(f"need 1 <= hard_min_ops <= hard_max_ops, got {hard_min_ops}, {hard_max_ops}")
        if max_operand < 1:
            raise ValueError(f"max_operand must be >= 1, got {max_operand}")
        if max_operand >= 10**6 or max(max_ops, hard_max_ops) > 64:
            raise ValueError("max_operand must be < 1e6 and ops <= 64 (the verifier caps numbers at 12 digits "
                             "and completions at a few kB)")
        self.min_ops, self.max_ops, self.max_operand, self.seed = min_ops, max_ops, max_operand, seed
        self.hard_min_ops, self.hard_max_ops = hard_min_ops, hard_max_ops
        self.allow_negative = allow_negative

    @classmethod
    def from_settings(cls, settings: Any, seed: int = 0) -> "ArithTask":
        """Build from a :class:`race.spec.run.TaskSettings` (``name`` must be ``arith``)."""
        if getattr(settings, "name", "arith") != "arith":
            raise ValueError(f"task.name={settings.name!r} is not the built-in arith task; use race.tasks.load_problems_file")
        return cls(settings.min_ops, settings.max_ops, settings.max_operand, seed,
                   hard_min_ops=settings.hard_min_ops, hard_max_ops=settings.hard_max_ops)

    @classmethod
    def from_description(cls, desc: dict[str, Any]) -> "ArithTask":
        """The task a :meth:`describe` dict describes (its inverse)."""
        d = dict(desc)
        name = d.pop("task", "arith")
        if name != "arith":
            raise ValueError(f"task {name!r} is not the built-in arith task")
        return cls(d.pop("min_ops"), d.pop("max_ops"), d.pop("max_operand"), d.pop("seed"), **d)

    def describe(self) -> dict[str, Any]:
        """Plain-data description (used in recipe hashes and reports)."""
        return dict(task="arith", min_ops=self.min_ops, max_ops=self.max_ops, max_operand=self.max_operand,
                    seed=self.seed, hard_min_ops=self.hard_min_ops, hard_max_ops=self.hard_max_ops,
                    allow_negative=self.allow_negative)

    def ops_range(self, split: str) -> tuple[int, int]:
        self._check_split(split)
        return (self.hard_min_ops, self.hard_max_ops) if split == "hard" else (self.min_ops, self.max_ops)

    def _check_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")

    def _draw(self, rng: random.Random, n_ops: int) -> Problem:
        cur = rng.randint(0, self.max_operand)
        operands, ops = [cur], []
        for _ in range(n_ops):
            op = rng.choice(OPS)
            hi = self.max_operand if (op == "+" or self.allow_negative) else min(self.max_operand, cur)
            b = rng.randint(0, hi)
            cur = cur + b if op == "+" else cur - b
            operands.append(b)
            ops.append(op)
        return make_problem(operands, ops)

    def problems(self, split: str, n: int, seed: int = 0) -> list[Problem]:
        """``n`` distinct problems of ``split``, the same list for the same arguments.

        Raises ``ValueError`` when the split cannot hold ``n`` distinct problems (the
        operand/operation space is too small for the request).
        """
        self._check_split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        lo, hi = self.ops_range(split)
        rng = random.Random(f"race-arith:{self.seed}:{split}:{seed}")
        owned = _BUCKETS[split]
        out: list[Problem] = []
        seen: set[str] = set()
        attempts, max_attempts = 0, 200 * n + 10_000
        while len(out) < n:
            attempts += 1
            if attempts > max_attempts:
                raise ValueError(
                    f"could only find {len(out)} distinct {split!r} problems of {n} requested with "
                    f"max_operand={self.max_operand}, ops {lo}-{hi}: ask for fewer or widen the task")
            p = self._draw(rng, rng.randint(lo, hi))
            expr = p.expression
            if expr in seen or bucket_of(expr) not in owned:
                continue
            seen.add(expr)
            out.append(Problem(p.id, p.prompt, p.answer, p.steps, p.n_ops, split))
        return out
