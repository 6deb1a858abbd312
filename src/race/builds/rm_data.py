"""Training data of RACE's reward models: worked solutions and plausible corruptions of
them, labelled by the task's verifier (see :mod:`race.builds.rm_training`)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from race.rewards.rm_encoding import MARKERS, MAX_MARKERS
from race.tasks.arith import END_MARK, FINAL_MARK, STEP_SEP, ArithTask, Problem, solution_text
from race.tasks.verify import verify


def _render(steps: Sequence[tuple[int, str, int, int]], final: int | None) -> str:
    body = "".join(f"{a}{op}{b}={c}{STEP_SEP}" for a, op, b, c in steps)
    return body + ("" if final is None else f"{FINAL_MARK}{final}{END_MARK}")


def _delta(rng: random.Random) -> int:
    d = rng.choice([1, 2, 10, rng.randint(1, 20)])
    return d if rng.random() < 0.5 else -d


def _chain(problem: Problem, k: int, a_k: int, op_k: str, b_k: int, c_k: int,
           carry: bool) -> list[tuple[int, str, int, int]]:
    """Steps with step ``k`` replaced; later steps continue from the written value
    (``carry``) or from the true running value (then their first operand is wrong)."""
    steps = [tuple(s) for s in problem.steps]
    steps[k] = (a_k, op_k, b_k, c_k)
    cur = c_k
    for i in range(k + 1, len(steps)):
        a, op, b, c = steps[i]
        a = cur if carry else a
        c = a + b if op == "+" else a - b
        steps[i] = (a, op, b, c)
        cur = c
    return steps  # type: ignore[return-value]


CORRUPTIONS = ("wrong_result", "wrong_operand", "wrong_operator", "skip_step", "extra_step", "wrong_final",
               "no_final", "truncated", "noise")


def corrupt(problem: Problem, rng: random.Random, kind: str | None = None) -> str:
    """A plausible wrong completion for ``problem`` (see module docstring)."""
    kind = kind or rng.choice(CORRUPTIONS)
    steps, n = list(problem.steps), len(problem.steps)
    k = rng.randrange(n)
    a, op, b, c = steps[k]
    if kind == "wrong_result":
        new = _chain(problem, k, a, op, b, c + _delta(rng), carry=rng.random() < 0.6)
        final = new[-1][3] if rng.random() < 0.7 else problem.answer
        return _render(new, final)
    if kind == "wrong_operand":
        d = _delta(rng)
        b2 = b + d if b + d >= 0 else b - d
        new = _chain(problem, k, a, op, b2, a + b2 if op == "+" else a - b2, carry=True)
        return _render(new, new[-1][3])
    if kind == "wrong_operator":
        op2 = "-" if op == "+" else "+"
        new = _chain(problem, k, a, op2, b, a + b if op2 == "+" else a - b, carry=True)
        return _render(new, new[-1][3])
    if kind == "skip_step" and n > 1:
        del steps[k]  # a later step then fails to chain; a skipped last step leaves the answer wrong
        return _render(steps, steps[-1][3] if k == n - 1 or rng.random() < 0.5 else problem.answer)
    if kind == "extra_step":
        last = steps[-1][3]
        x = rng.randint(0, 20)
        steps.insert(rng.randint(0, n), (last, "+", x, last + x))
        return _render(steps, problem.answer if rng.random() < 0.5 else last + x)
    if kind == "wrong_final":
        return _render(steps, problem.answer + _delta(rng))
    if kind == "no_final":
        return _render(steps, None) + rng.choice(["", "#", f"#{problem.answer}", "."])
    if kind == "truncated":
        text = solution_text(problem) if rng.random() < 0.5 else corrupt(problem, rng, "wrong_result")
        return text[: rng.randint(1, len(text) - 1)]
    alphabet = "0123456789+-=;#."
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))


def marker_labels(problem: Problem, completion: str) -> list[int]:
    """0/1 label per marker (``;`` or ``.``) of ``completion``, in order (capped at
    :data:`MAX_MARKERS`): step validity for ``;`` before the final mark, final-answer
    correctness for the ``.`` that closes the answer, 0 for any other marker."""
    v = verify(problem, completion)
    hash_at = completion.find(FINAL_MARK)
    answer_end = -1
    if hash_at >= 0 and v.answer is not None:
        answer_end = completion.find(END_MARK, hash_at)
    labels: list[int] = []
    step = 0
    for j, ch in enumerate(completion):
        if ch not in MARKERS:
            continue
        if ch == STEP_SEP and (hash_at < 0 or j < hash_at):
            labels.append(int(step < len(v.step_correct) and v.step_correct[step]))
            step += 1
        elif ch == END_MARK and j == answer_end:
            labels.append(int(v.correct))
        else:
            labels.append(0)
        if len(labels) >= MAX_MARKERS:
            break
    return labels


def make_example(problem: Problem, rng: random.Random, correct_frac: float) -> str:
    return solution_text(problem) if rng.random() < correct_frac else corrupt(problem, rng)


def make_dataset(task: ArithTask, split: str, n: int, seed: int, correct_frac: float) -> list[tuple[Problem, str]]:
    rng = random.Random(f"race-rm:{split}:{seed}")
    return [(p, make_example(p, rng, correct_frac)) for p in task.problems(split, n, seed=seed)]
