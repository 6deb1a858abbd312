"""Verifier: parses (never evaluates), scores steps, survives hostile input in bounded time."""

from __future__ import annotations

import pytest

from race.tasks import make_problem, outcome_reward, partial_credit, verify
from race.tasks.verify import MAX_CHARS

P = make_problem([23, 5, 7], ["+", "-"])  # 23+5=28;28-7=21;#21.
P4 = make_problem([40, 9, 30, 2, 11], ["+", "-", "+", "-"])  # 40+9=49;49-30=19;19+2=21;21-11=10;#10.


def test_correct_solution():
    v = verify(P, "23+5=28;28-7=21;#21.")
    assert (v.correct, v.answer, v.step_correct, v.format_ok, v.n_steps_expected) == (True, 21, [True, True], True, 2)
    assert partial_credit(v) == 1.0 and outcome_reward(v) == 1.0
    assert verify(P, "23+5=28;28-7=21;#21.\n  ").format_ok  # trailing whitespace is fine


def test_wrong_step_error_carried_forward():
    # slip in step 1; step 2 correctly continues from the slipped value; answer wrong
    v = verify(P4, "40+9=48;48-30=18;18+2=20;20-11=9;#9.")
    assert v.step_correct == [False, True, True, True] and not v.correct and v.format_ok
    assert partial_credit(v) == pytest.approx(3 / 5)
    # a step that does not chain from the previous written result is invalid
    v = verify(P4, "40+9=49;48-30=18;18+2=20;20-11=9;#9.")
    assert v.step_correct == [True, False, True, True]
    # wrong operand or operator (locally valid arithmetic is not enough)
    v = verify(P, "23+6=29;29-7=22;#22.")
    assert v.step_correct == [False, True]
    v = verify(P, "23+5=28;28+7=35;#35.")
    assert v.step_correct == [True, False] and partial_credit(v) == pytest.approx(1 / 3)


def test_wrong_answer_with_right_steps():
    v = verify(P, "23+5=28;28-7=21;#22.")
    assert v.step_correct == [True, True] and not v.correct and v.answer == 22 and v.format_ok
    assert partial_credit(v) == pytest.approx(2 / 3) and outcome_reward(v) == 0.0


def test_right_answer_alone_earns_one_share():
    v = verify(P, "#21.")
    assert v.correct and not v.format_ok and v.step_correct == []
    assert partial_credit(v) == pytest.approx(1 / 3)


@pytest.mark.parametrize("text, fmt_ok, correct", [
    ("23+5=28;28-7=21;#21", False, False),        # no end mark: answer unreadable
    ("23+5=28;28-7=21;21.", False, False),        # no final mark
    ("23+5=28;28-7=21#21.", False, True),         # last step without separator
    ("23+5=28;28-7=21;#21.#22.", False, True),    # trailing junk after the answer
    ("23+5=28;28-7=21;21-0=21;#21.", False, True),  # extra step
    ("23 + 5 = 28;28-7=21;#21.", False, True),    # spaces inside a step
    ("", False, False),
    ("#.", False, False),
])
def test_malformed(text, fmt_ok, correct):
    v = verify(P, text)
    assert v.format_ok is fmt_ok and v.correct is correct
    assert 0.0 <= partial_credit(v) <= 1.0


def test_extra_steps_are_invalid_and_do_not_add_credit():
    v = verify(P, "23+5=28;28-7=21;21-0=21;#21.")
    assert v.step_correct == [True, True, False] and partial_credit(v) == 1.0


HOSTILE = [
    "1" * 1_000_000,
    ";" * 1_000_000,
    "23+5=28;" * 200_000,
    "#" + "9" * 100_000 + ".",
    "9" * 5000 + "+5=" + "9" * 5000 + ";#21",
    "123456789012345+1=123456789012346;#123456789012346.",
    "__import__('os').system('rm -rf /')",
    "eval('2+2')#__import__('os').getcwd().",
    "\ud800\udfff\udc00#21\ud800.",
    "(" * 100_000 + ")" * 100_000,
    "[[[[{{{{((((" * 50_000,
    "٢٣+٥=٢٨;#٢١.",  # Arabic-Indic digits are not ASCII digits
    "\x00\x01\x02" * 1000,
    b"\xff\xfe\x00garbage",
    None,
    12345,
    ["23+5=28;28-7=21;#21."],
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_inputs_score_zero_and_read_only_the_head(text):
    """The verifier's work is bounded by what it reads: only the first MAX_CHARS characters
    (of a string), so a longer payload gets the verdict of its head (format aside: a cut
    completion is never well-formed). No timing here."""
    v = verify(P, text)
    if isinstance(text, str) and len(text) > MAX_CHARS:
        head = verify(P, text[:MAX_CHARS])
        assert (v.correct, v.answer, v.step_correct) == (head.correct, head.answer, head.step_correct)
    assert not v.correct and not v.format_ok
    assert partial_credit(v) <= 1 / 3  # at most the first step can be valid (repeated "23+5=28;")


def test_hostile_with_true_answer_digits_capped():
    # 13-digit numbers are refused, not parsed
    big = make_problem([999_999_999_999, 1], ["+"])
    v = verify(big, "999999999999+1=1000000000000;#1000000000000.")
    assert v.answer is None and not v.correct and v.step_correct == [False]


def test_verify_refuses_non_arith_problem():
    from race.tasks import TextProblem

    with pytest.raises(TypeError, match="verify_final_answer"):
        verify(TextProblem("x", "Q", "1", "Q", "1"), "#1.")
