"""The reward-kind table (``race.accounting.reward_kinds``) is the one statement of the reward
kinds: the grammar, the accounting, the registry, planning and the builds read it. A new
kind needs its row and its builder and nothing else (a fifth model kind added here at run
time parses, resolves, costs, plans and builds); a new rule term needs its row and its
scorer (``format`` is one)."""

from __future__ import annotations

import importlib
import sys

import pytest

from race.accounting.reward_kinds import REWARD_KINDS, RULE_TERMS, RewardKind, RewardSystem, entry_point, reward_kind
from race.tasks import make_problem, solution_text


def test_every_row_names_a_builder_or_scorer_that_exists():
    for row in REWARD_KINDS.values():
        module, func = entry_point(row.builder)
        assert callable(getattr(importlib.import_module(module), func)), row.name
    for term in RULE_TERMS.values():
        module, func = entry_point(term.scorer)
        assert callable(getattr(importlib.import_module(module), func)), term.name
    assert REWARD_KINDS["rule"].terms == ("outcome", "partial", "format")  # the terms rule: may list
    assert [k for k, r in REWARD_KINDS.items() if r.model] == ["orm", "prm", "judge"]
    assert {k: r.head for k, r in REWARD_KINDS.items() if r.model} == {"orm": "last", "prm": "markers",
                                                                         "judge": "decode"}
    assert {k: (r.classifier, r.labels) for k, r in REWARD_KINDS.items() if r.classifier} == {
        "orm": ("sequence", 1), "prm": ("token", 2)}
    with pytest.raises(Exception, match="reward kind must be one of rule, random, math, orm, prm, judge"):
        reward_kind("pairwise")


def test_the_table_is_the_standard_library_only():
    mod = sys.modules["race.accounting.reward_kinds"]
    src = open(mod.__file__).read()
    imports = [ln for ln in src.splitlines() if ln.startswith(("import ", "from "))]
    assert all(ln.startswith(("from __future__", "from dataclasses", "from typing", "from .")) for ln in imports), imports


def test_format_rewards_the_layout_whatever_the_values():
    """``rule:format`` (issue 36): 1 when the completion follows the answer format, right or
    wrong; 0 when it does not; a question/answer problem needs an explicit answer layout."""
    from race.rewards import make_reward
    from race.tasks import TextProblem

    p = make_problem([20, 22, 5], ["+", "-"])
    right = solution_text(p)  # "20+22=42;42-5=37;#37."
    wrong_values = right.replace("=42;42-5=37;#37.", "=43;43-5=38;#38.")
    assert wrong_values != right
    fmt, outcome = make_reward("rule:format"), make_reward("rule:outcome")
    texts = [right, wrong_values, right.replace(";#", ";"), right + " and more", "20+22=42;#42.", "#37."]
    assert fmt.score([p] * 6, texts).rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert outcome.score([p] * 6, texts).rewards == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]  # the answer, not the layout
    assert fmt.score([p] * 6, texts).verified == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]  # verified is always the outcome
    q = TextProblem(id="q", prompt="Q:6*7?\nA:", answer="42", question="6*7?", solution="6*7=42 #### 42")
    stated = ["so #### 41", "6*7 is 42. #### 42\n", "\\boxed{41}", "\\boxed{\\frac{1}{2}}", "#41."]
    bare = ["the answer is 42", "42", "####", "\\boxed{}", None]
    assert fmt.score([q] * 10, stated + bare).rewards == [1.0] * 5 + [0.0] * 5
    both = make_reward("rule:outcome+format")
    assert both.score([q, q, q], ["#### 42", "#### 41", "42"]).rewards == [1.0, 0.5, 0.5]  # "42": right, no layout


class _Pairwise:
    """A test kind's reward: a model scoring each completion at its last token, charged as
    its kind's head rule says."""

    def __init__(self, reward, conventions=None):
        from race.accounting import reward_model_flops
        from race.rewards.base import RewardOutput

        self.reward, self.kind, self.name = reward, reward.spec.kind, str(reward)
        self._flops, self._out, self.conventions = reward_model_flops, RewardOutput, conventions

    def score(self, problems, completions):
        n = len(completions)
        comps = self._flops(self.reward.system, [8] * n, head_positions="last", conventions=self.conventions)
        return self._out([0.5] * n, [0.0] * n, components=comps, tokens=8 * n)

    def step_bound(self, n_sequences, max_prompt_len, max_completion_len, *, problems=None):
        return sum(self._flops(self.reward.system, [max_prompt_len + max_completion_len] * n_sequences,
                               head_positions="last", conventions=self.conventions).values())


BUILT: list = []


def build_pairwise(reward, *, conventions=None, **_):
    """The test kind's builder (its row names it)."""
    BUILT.append(reward)
    return _Pairwise(reward, conventions)


@pytest.fixture
def fifth_kind(monkeypatch):
    row = RewardKind("pair", True, "last", ("rm",), f"{__name__}:build_pairwise", "model", "pair:tiny-xs",
                     labels=1, summary="a pairwise (Bradley-Terry) RM scoring each completion at its last token")
    monkeypatch.setitem(REWARD_KINDS, "pair", row)
    BUILT.clear()
    return row


def test_a_fifth_kind_needs_only_its_row_and_builder(fifth_kind, tmp_path):
    """With one row added (and its builder, above) the kind parses with terms, becomes a
    run's reward, resolves to a cost, is planned by ``race plan``'s allocations and by
    ``race flops``, builds through the registry, charges its head rule, and gets its typed
    columns; build on demand has nothing to build for it."""
    from race.accounting import StepPlan, allocations, reward_model_flops
    from race.models.refs import resolve_shape
    from race.builds.demand import ensure_reward
    from race.estimate import flops_report, run_step_flops
    from race.rewards import make_reward
    from race.rewards.systems import resolve_reward
    from race.spec.flops import flops_query
    from race.spec.reward import parse_reward, reward_columns
    from race.spec.run import run_config_from_dict

    spec = parse_reward("pair:tiny-xs:rm+outcome")
    assert (spec.kind, spec.target, spec.agg, spec.weights, spec.learned) == (
        "pair", "tiny-xs", "rm", {"rm": 0.5, "outcome": 0.5}, True)
    with pytest.raises(ValueError, match="pair reward needs a model name, e.g. pair:tiny-xs"):
        parse_reward("pair")
    assert reward_columns("pair:tiny-xs:rm+outcome") == {
        "reward_system": "pair", "reward_rule": "rule:outcome", "reward_model": "tiny-xs", "reward_learned": True,
        "reward_random": False}
    resolved = resolve_reward("pair:tiny-xs")
    lm = resolve_shape("tiny-xs")  # the causal LM the target names
    assert resolved.kind is fifth_kind and resolved.target.source == "hub"
    assert lm.head != ((lm.hidden, 1),)
    assert resolved.system.kind == "pair" and resolved.system.shape.head == ((lm.hidden, 1),)  # labels=1: a score head
    # the accounting charges its head rule (last token) by default
    plan = StepPlan(resolved.system.shape, 4, reward=resolved.system)
    step = plan.uniform(2, 10, 6)
    assert step.reward == sum(reward_model_flops(resolved.system, [16] * 8, head_positions="last").values()) > 0
    # race plan's allocations and race flops
    [alloc] = allocations(1e15, [plan], prompts_per_step=2, prompt_len=10, completion_len=6)
    assert alloc.reward == "pair:tiny-xs" and alloc.step.reward == step.reward
    rep = flops_report(flops_query({}, "test", dict(model="tiny-s", reward="pair:tiny-xs", prompts=2, group=4,
                                                    prompt_len=10, completion_len=6)))
    assert rep["step"]["reward"] > 0 and rep["reward"] == "pair:tiny-xs"
    # a run's reward: validates, plans, builds through the registry with the resolved value
    cfg = run_config_from_dict(dict(budget_flops=1e12, reward="pair:tiny-xs", model="tiny-s"))
    assert str(cfg.reward) == "pair:tiny-xs" and run_step_flops(cfg).reward > 0
    reward = make_reward(cfg.reward, conventions="race")
    assert BUILT and BUILT[-1].spec == cfg.reward and reward.kind == "pair"
    out = reward.score([None, None], ["a", "b"])
    assert out.rewards == [0.5, 0.5] and sum(out.components.values()) > 0
    assert ensure_reward(cfg.reward, cache_dir=tmp_path) is None  # nothing RACE builds
