"""A reward model reads the FULL prompt (plus its template), not the policy's prompt cut
to ``max_prompt_length``: the step bound must count what the RM reads. An over-long
prompt with a PRM is where a bound from the cut prompt fell short."""

from __future__ import annotations

import dataclasses

from race.rewards import make_reward
from race.tasks import solution_text


def _long(problems, extra: int):
    """The same problems with ``extra`` more characters of prompt (a long preamble)."""
    return [dataclasses.replace(p, prompt="Solve carefully. " * (extra // 17) + p.prompt) for p in problems]


def test_an_over_long_prompt_is_bounded_by_what_the_prm_reads(built_rms, arith, char_tokenizer):
    problems = _long(arith.problems("test", 8, seed=5), 150)
    P = 20  # the policy's prompt, cut to max_prompt_length=20 (char tokens)
    T = 40
    texts = [(solution_text(p) * 3)[:T] for p in problems]
    for spec in ("prm:prm-xs", "orm:orm-xs"):
        r = make_reward(spec, device="cpu", tokenizer=char_tokenizer)
        assert r.k == 1
        used = r.score(problems, texts).flops
        assert r.step_bound(8, P, T) < used  # from the cut prompt: too low (what the engines used to pass)
        assert used <= r.step_bound(8, P, T, problems=problems)
        assert r.step_bound(8, P, T, problems=problems) <= make_reward(spec, device="cpu").step_bound(8, P, T)

