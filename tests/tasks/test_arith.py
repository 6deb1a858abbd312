"""Arithmetic generator: determinism, disjoint splits, difficulty knobs, text format."""

from __future__ import annotations

import pytest

from race.spec.run import TaskSettings
from race.tasks import (
    FINAL_MARK,
    STEP_SEP,
    ArithTask,
    make_problem,
    solution_text,
    split_of,
    verify,
)


def test_same_arguments_same_problems_other_seed_other_problems():
    a = ArithTask(seed=3).problems("train", 50, seed=1)
    b = ArithTask(seed=3).problems("train", 50, seed=1)
    assert a == b
    assert [p.id for p in a] != [p.id for p in ArithTask(seed=3).problems("train", 50, seed=2)]
    assert [p.id for p in a] != [p.id for p in ArithTask(seed=4).problems("train", 50, seed=1)]


def test_splits_are_disjoint_and_owned_by_hash():
    task = ArithTask()
    sets = {s: {p.expression for p in task.problems(s, n)} for s, n in (("train", 3000), ("test", 800), ("hard", 300))}
    assert not sets["train"] & sets["test"]
    assert not sets["train"] & sets["hard"]
    assert not sets["test"] & sets["hard"]
    for split, exprs in sets.items():
        assert all(split_of(e) == split for e in exprs)


def test_disjoint_even_when_hard_overlaps_train_difficulty():
    task = ArithTask(1, 2, 9, hard_min_ops=1, hard_max_ops=2)
    train = {p.expression for p in task.problems("train", 500)}
    hard = {p.expression for p in task.problems("hard", 60)}
    assert train and hard and not train & hard


def test_difficulty_knobs_and_chain_semantics():
    task = ArithTask(min_ops=2, max_ops=3, max_operand=20, hard_min_ops=5, hard_max_ops=5)
    probs = task.problems("test", 200)
    assert {p.n_ops for p in probs} == {2, 3}
    assert {p.n_ops for p in task.problems("hard", 30)} == {5}
    for p in probs:
        assert len(p.steps) == p.n_ops and len(p.operands) == p.n_ops + 1
        assert all(0 <= x <= 20 for x in p.operands)
        cur = p.operands[0]
        for a, op, b, c in p.steps:
            assert a == cur and c == (a + b if op == "+" else a - b) and c >= 0
            cur = c
        assert p.answer == cur
        assert p.prompt == f"Q:{p.expression}\nA:"


def test_solution_text_format_and_it_verifies():
    p = make_problem([23, 5, 7], ["+", "-"])
    assert p.prompt == "Q:23+5-7\nA:"
    assert solution_text(p) == "23+5=28;28-7=21;#21."
    assert STEP_SEP == ";" and FINAL_MARK == "#"
    assert p.answer == 21 and p.steps == ((23, "+", 5, 28), (28, "-", 7, 21))
    for q in ArithTask().problems("train", 100):
        v = verify(q, solution_text(q))
        assert v.correct and v.format_ok and all(v.step_correct) and len(v.step_correct) == q.n_ops


def test_negative_option():
    probs = ArithTask(3, 4, 9, allow_negative=True).problems("train", 300)
    assert any(s[3] < 0 for p in probs for s in p.steps)
    v = verify(probs[0], solution_text(probs[0]))
    assert v.correct and v.format_ok


def test_from_settings_and_bad_arguments():
    t = ArithTask.from_settings(TaskSettings(min_ops=1, max_ops=3, max_operand=9), seed=5)
    assert (t.min_ops, t.max_ops, t.max_operand, t.seed, t.hard_min_ops) == (1, 3, 9, 5, 5)
    with pytest.raises(ValueError, match="not the built-in arith task"):
        ArithTask.from_settings(TaskSettings(name="jsonl", path="x.jsonl"))
    with pytest.raises(ValueError, match="min_ops <= max_ops"):
        ArithTask(3, 2)
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        ArithTask().problems("valid", 3)
    with pytest.raises(ValueError, match="could only find .* distinct 'test' problems"):
        ArithTask(1, 1, max_operand=2).problems("test", 50)
    with pytest.raises(ValueError, match="operator"):
        make_problem([1, 2], ["*"])
