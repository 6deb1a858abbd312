"""Hostile completions: every rule verifier and every reward model reads a bounded amount
of input under the limits the code enforces, runs no code, and (rules) scores 0.

No test here times anything: the bounds are properties of the code (input caps, the RM's
token window, math-verify's signal timer), and each is checked as such; how long the
verifiers take on these payloads is printed by ``benchmarks/hostile_inputs.py``."""

from __future__ import annotations

import math

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


RULES = [(spec, kind) for spec in ("rule", "rule:partial", "rule:format", "rule:outcome+format", "math")
         for kind in ("arith", "text")]
#: The weight of the ``format`` term in each rule spec above.
FORMAT_WEIGHT = {"rule:format": 1.0, "rule:outcome+format": 0.5}


def states_an_answer(name: str, text) -> bool:
    """Whether payload ``name`` states an answer in a question/answer layout (``#### X`` on
    its line, ``#N.``, ``\\boxed{X}`` with at most one level of braces): ``format`` credits
    the layout whatever the value. ``exec_boxed`` holds the test's own path, so its length
    (and whether it fits the 64-character box) is computed from it."""
    if name == "exec_boxed":
        return len(text[len("\\boxed{"):-1]) <= 64
    return name in ("python_power", "factorial", "surrogates", "nul_and_controls")


@pytest.mark.parametrize("spec, kind", RULES)
def test_rules_are_bounded_run_nothing_and_score_zero(spec, kind, problems, tmp_path, monkeypatch):
    """Whatever the payload, math-verify only ever sees at most MATH_MAX_CHARS characters and
    runs under its timer (MATH_TIMEOUT_S); the rule parser reads at most MAX_CHARS. Every
    rule scores 0 and verifies nothing, except ``format`` on question/answer problems, which
    credits a payload that states an answer in the answer layout (its value is wrong)."""
    from race.rewards import mathverify
    from race.tasks.verify import MAX_CHARS, verify

    seen: list[tuple[int, float]] = []
    real = mathverify._math_verify

    def spy(gold, text, timeout_s):
        seen.append((len(text), timeout_s))
        return real(gold, text, timeout_s)

    monkeypatch.setattr(mathverify, "_math_verify", spy)
    reward = make_reward(spec)
    for name, text in payloads(tmp_path).items():
        for p in (problems[:1] if kind == "arith" else problems[1:]):
            out = reward.score([p], [text])
            fmt = FORMAT_WEIGHT.get(spec, 0.0) if kind == "text" and states_an_answer(name, text) else 0.0
            assert out.rewards == [fmt] and out.verified == [0.0], (spec, name, type(p).__name__)
            assert out.flops == 0
            if kind == "arith" and isinstance(text, str) and len(text) > MAX_CHARS:  # only the head is read
                a, b = verify(p, text), verify(p, text[:MAX_CHARS])
                assert (a.correct, a.answer, a.step_correct) == (b.correct, b.answer, b.step_correct)
            if isinstance(text, str) and len(text) > MAX_CHARS:  # format reads the head only too
                assert reward.score([p], [text[:MAX_CHARS]]).rewards == out.rewards, (spec, name)
    assert all(n <= mathverify.MATH_MAX_CHARS and t == mathverify.MATH_TIMEOUT_S for n, t in seen), seen
    assert not list(tmp_path.iterdir()), "a payload created a file"


def test_math_verify_stops_at_its_timer(monkeypatch):
    """The time limit is enforced, not hoped for: a parse that needs far more work than the
    limit allows is interrupted (it returns False, with most of its work undone), while the
    same parse given time enough completes and is believed."""
    import math_verify

    from race.rewards import mathverify

    work = 30_000_000
    done = [0]

    def slow_parse(text, parsing_timeout=None):
        for i in range(work):  # seconds of pure-Python work: far more than the limit below
            done[0] = i
        return [text]

    monkeypatch.setattr(math_verify, "parse", slow_parse)
    monkeypatch.setattr(math_verify, "verify", lambda g, p, timeout_seconds=None: True)
    monkeypatch.setattr(mathverify, "_WARM", True)
    assert mathverify._math_verify("1", "1", timeout_s=0.01) is False
    assert done[0] < work - 1  # interrupted part way
    work, done[0] = 1000, 0
    assert mathverify._math_verify("1", "1", timeout_s=60.0) is True and done[0] == work - 1


@pytest.mark.parametrize("spec", ["prm:prm-xs", "orm:orm-xs", "prm:prm-xs:min+outcome"])
def test_reward_models_are_bounded_and_run_nothing(spec, built_rms, problems, tmp_path):
    reward = make_reward(spec, device="cpu")
    texts = payloads(tmp_path)
    for name, text in texts.items():
        out = reward.score(problems, [text] * len(problems))
        assert all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in out.rewards), (name, out.rewards)
        assert out.verified == [0.0] * len(problems)
        assert out.tokens <= len(problems) * 256  # the RM's window, whatever the input length
    # one batch of all of them at once: one padded forward within the window
    out = reward.score(problems[:1] * len(texts), list(texts.values()))
    assert len(out.rewards) == len(texts) and out.tokens <= len(texts) * 256
    assert not list(tmp_path.iterdir()), "a payload created a file"
