"""math-verify final answers (rule-based, 0 FLOPs) and the random-reward control."""

from __future__ import annotations

import threading

import pytest

from race.rewards import RandomReward, make_reward
from race.rewards.mathverify import math_correct
from race.tasks import TextProblem, make_problem, solution_text


def tp(answer: str) -> TextProblem:
    return TextProblem(id="x", prompt="Q:?\nA:", answer=answer, question="?", solution=answer)


@pytest.mark.parametrize("answer, completion, ok", [
    ("\\frac{1}{2}", "so the answer is \\boxed{0.5}", True),
    ("\\frac{1}{2}", "the answer is $\\frac{2}{4}$", True),
    ("0.5", "\\boxed{\\frac{1}{2}}", True),
    ("\\frac{1}{2}", "\\boxed{0.6}", False),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", True),
    ("x^2+1", "\\boxed{1+x^2}", True),
    ("1234", "... #### 1,234", True),
    ("1234", "... #### 1235", False),
    ("42", "no answer here", False),
])
def test_math_verify_equivalence(answer, completion, ok):
    assert math_correct(tp(answer), completion) is ok


def test_math_reward_on_the_builtin_task_and_its_cost():
    p = make_problem([23, 5], ["+"])
    r = make_reward("math")
    out = r.score([p, p, p], [solution_text(p), "23+5=28;#29.", "\\boxed{28}"])
    # the built-in task's exact parse decides: math-verify would read a worked step as the answer
    assert out.rewards == [1.0, 0.0, 0.0] and out.verified == [1.0, 0.0, 0.0]
    assert out.flops == 0 and r.step_bound(64, 100, 100) == 0
    with pytest.raises(ValueError, match="no argument"):
        make_reward("math:x")


def test_math_outside_the_main_thread_falls_back_to_the_rule_check():
    got = {}

    def run():
        got["a"] = math_correct(tp("\\frac{1}{2}"), "\\boxed{0.5}")
        got["b"] = math_correct(tp("1234"), "#### 1,234")

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert got == {"a": False, "b": True}


def test_math_term_mixes_into_a_learned_reward_spec():
    from race.spec.reward import parse_learned

    assert parse_learned("prm", "prm-s:min+math").weights == {"rm": 0.5, "math": 0.5}


def test_random_reward_ignores_the_text_and_costs_nothing():
    p = make_problem([23, 5], ["+"])
    n = 64
    right, wrong = [solution_text(p)] * n, ["garbage"] * n
    a = RandomReward(seed=7).score([p] * n, right)
    b = RandomReward(seed=7).score([p] * n, wrong)
    assert a.rewards == b.rewards  # same stream whatever the completions say
    assert 0 < sum(a.rewards) < n and set(a.rewards) <= {0.0, 1.0}
    assert a.verified == [1.0] * n and b.verified == [0.0] * n  # verification still reported
    assert a.flops == 0 and a.components == {} and a.tokens == 0
    r = make_reward("random", seed=7)
    assert r.step_bound(n, 100, 100) == 0
    assert r.score([p] * n, wrong).rewards == a.rewards
    assert r.score([p] * n, wrong).rewards != a.rewards  # the next call draws new coins
    # reward carries no information about correctness: mixed texts, same coins
    mixed = [right[i] if i % 2 else wrong[i] for i in range(n)]
    assert RandomReward(seed=7).score([p] * n, mixed).rewards == a.rewards


def test_random_reward_call_index_is_what_a_resume_continues_from():
    p = make_problem([23, 5], ["+"])
    r = RandomReward(seed=3)
    assert r.call_index == 0
    first = r.score([p] * 16, ["x"] * 16).rewards
    second = r.score([p] * 16, ["x"] * 16).rewards
    assert r.call_index == 2 and first != second
    resumed = RandomReward(seed=3)
    resumed.set_call_index(1)  # what a checkpoint taken after one call restores
    assert resumed.call_index == 1 and resumed.score([p] * 16, ["x"] * 16).rewards == second
