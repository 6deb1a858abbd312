"""Hostile completions: every rule verifier and every reward model answers in bounded
time, runs no code, and (rules) scores 0."""

from __future__ import annotations

import math
import time

import pytest

from race.rewards import make_reward
from race.tasks import TextProblem, make_problem


def payloads(tmp):
    pwn = tmp / "pwned"
    return {
        "import": "__import__('os').system('touch " + str(tmp / "pwned_os") + "')",
        "open": f"open('{pwn}','w').write('x')",
        "eval_answer": f"#__import__('os').system('touch {tmp / 'pwned_eval'}').",
        "exec_boxed": "\\boxed{exec(\"open('" + str(pwn) + "','w')\")}",
        "huge_number": "#" + "9" * 100_000 + ".",
        "huge_digits_step": "9" * 5000 + "+1=" + "9" * 5000 + ";#1.",
        "power_tower": "\\boxed{9^{9^{9^{9}}}}",
        "python_power": "#### 9**9**9**9",
        "factorial": "\\boxed{(10^{10})!}",
        "nested_parens": "(" * 50_000 + "1" + ")" * 50_000,
        "nested_braces": "\\boxed{" + "{" * 20_000 + "1" + "}" * 20_000 + "}",
        "nested_latex": "$" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "$",
        "megabyte": "1+1=2;" * 180_000,
        "megabyte_x": "x" * (1 << 20),
        "surrogates": "\ud800\udfff #41. \udc80",
        "nul_and_controls": "\x00\x01\x1b[2J#41.\x00",
        "unicode_digits": "#٤٢.",
        "many_markers": ";" * 200_000 + "." * 1000,
        "bytes": b"\xff\xfe#41.",
        "none": None,
    }


@pytest.fixture(scope="module")
def problems():
    arith = make_problem([20, 22], ["+"])
    text = TextProblem(id="t", prompt="Q:What is 6*7?\nA:", answer="42", question="What is 6*7?",
                       solution="6*7=42 #### 42")
    frac = TextProblem(id="f", prompt="Q:half?\nA:", answer="\\frac{1}{2}", question="half?", solution="\\boxed{1/2}")
    return [arith, text, frac]


RULES = [(spec, kind) for spec in ("rule", "rule:partial", "rule:outcome+format", "math") for kind in ("arith", "text")]


@pytest.mark.parametrize("spec, kind", RULES)
def test_rules_are_bounded_run_nothing_and_score_zero(spec, kind, problems, tmp_path):
    reward = make_reward(spec)
    for name, text in payloads(tmp_path).items():
        for p in (problems[:1] if kind == "arith" else problems[1:]):
            t0 = time.perf_counter()
            out = reward.score([p], [text])
            dt = time.perf_counter() - t0
            assert dt < 1.0, (spec, name, dt)
            assert out.rewards == [0.0] and out.verified == [0.0], (spec, name, type(p).__name__)
            assert out.flops == 0
    assert not list(tmp_path.iterdir()), "a payload created a file"


@pytest.mark.parametrize("spec", ["prm:prm-xs", "orm:orm-xs", "prm:prm-xs:min+outcome"])
def test_reward_models_are_bounded_and_run_nothing(spec, built_rms, problems, tmp_path):
    reward = make_reward(spec, device="cpu")
    texts = payloads(tmp_path)
    for name, text in texts.items():
        t0 = time.perf_counter()
        out = reward.score(problems, [text] * len(problems))
        dt = time.perf_counter() - t0
        assert dt < 1.0, (spec, name, dt)
        assert all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in out.rewards), (name, out.rewards)
        assert out.verified == [0.0] * len(problems)
        assert out.tokens <= len(problems) * 256  # the RM's window, whatever the input length
    # one batch of all of them at once: one padded forward, bounded
    t0 = time.perf_counter()
    out = reward.score(problems[:1] * len(texts), list(texts.values()))
    assert time.perf_counter() - t0 < 2.0 and len(out.rewards) == len(texts)
    assert not list(tmp_path.iterdir()), "a payload created a file"
