"""The reward kinds, one row each: what a reward spec may name, stated once. Standard library only.

Every reader of a reward kind reads this table: the spec grammar (``race.spec.reward``:
which heads and terms parse, the examples its errors give), the accounting (which kinds
run a model, where its scoring head runs: :class:`RewardSystem`,
``race.accounting.reward_model_flops``), the registry (``race.rewards.registry``: where
each kind's builder lives), planning (``race.rewards.systems``: a causal LM's scoring head
when it serves as an RM), the builds (``race.builds``: which kinds RACE trains, as
token or sequence classifiers) and the house rules (``tests/test_layers.py``).

:data:`REWARD_KINDS` (what a spec starts with, ``KIND[:ARG]``):

======  =====  ========  ======================  ====================================
kind    model  head      terms                   builder
======  =====  ========  ======================  ====================================
rule    no     none      the rule terms below    ``race.rewards.rule:build_rule``
random  no     none      -                       ``race.rewards.rule:build_random``
math    no     none      -                       ``race.rewards.mathverify:build_math``
orm     yes    last      ``rm``                  ``race.rewards.learned:build_learned``
prm     yes    markers   ``min last mean prod``  ``race.rewards.learned:build_learned``
judge   yes    decode    ``rm``                  ``race.rewards.learned:build_judge``
py      no     none      -                       ``race.rewards.python:build_python``
======  =====  ========  ======================  ====================================

``py:MODULE:FUNCTION`` is your own Python reward function with TRL's ``reward_funcs``
signature, imported by path (``race.rewards.python``); it costs what a rule costs unless the
function declares the scoring model it runs (``race_reward_model = "orm:NAME"``), whose
row then prices it.

Head rules (:data:`HEADS`): ``none`` (no model: 0 FLOPs); ``last`` (one forward, the
scoring head at each sequence's last token: a sequence classifier); ``markers`` (one
forward, the head at the step markers: a token classifier; planned at every position,
its bound); ``all`` (one forward, the head at every position); ``decode`` (a generative
judge: prefill, then decode its verdict with its own shape).

:data:`RULE_TERMS` (what ``rule:TERMS`` joins with ``+``, and what a learned reward may
mix into its model's score; 0 FLOPs each), each with its scorer ``(problem, completion)
-> float``: ``outcome`` (0/1 final answer), ``partial`` (valid steps and the answer over
operations + 1), ``format`` (1 when the completion follows the task's answer format,
whatever its values), ``math`` (math-verify's final-answer check; a learned reward's mix
only).

Adding a kind is one row here and one builder where its row says; adding a rule term is
one row and one scorer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import AccountingError
from .shapes import ModelShape

#: Where a kind's scoring head runs (module docstring).
HEADS = ("none", "last", "markers", "all", "decode")
#: What follows ``KIND:`` in a spec: nothing, rule terms, a model name (then its terms), or an
#: import path ``package.module:function``.
ARGUMENTS = ("none", "terms", "model", "import")


@dataclass(frozen=True)
class RewardKind:
    """One kind of reward system: ``model`` (a learned model scores, and costs FLOPs) or a
    rule; its head rule (:data:`HEADS`); ``terms``: for a model kind its own score terms
    (the first is the default), for ``rule`` the rule terms it may list; ``builder``:
    ``"module:function"`` building it from a resolved spec; ``argument``
    (:data:`ARGUMENTS`); ``example``: a spec to show in messages; ``labels``: outputs of
    the scoring head when a causal LM serves as this kind's RM (0: not a classifier)."""

    name: str
    model: bool
    head: str
    terms: tuple[str, ...]
    builder: str
    argument: str
    example: str
    labels: int = 0
    summary: str = ""

    def __post_init__(self) -> None:
        if self.head not in HEADS or self.argument not in ARGUMENTS or ":" not in self.builder:
            raise AccountingError(f"reward kind {self.name!r}: head must be one of {HEADS}, argument one of "
                                  f"{ARGUMENTS}, builder 'module:function'; got {self}")
        if self.model != (self.head != "none"):
            raise AccountingError(f"reward kind {self.name!r}: a model kind has a head, a rule kind none")

    @property
    def planned_head(self) -> "str | None":
        """Where the head runs when only the lengths are known (planning, bounds): ``last``,
        ``all`` (step markers at most at every position), or None (no head, or a judge)."""
        return {"last": "last", "markers": "all", "all": "all"}.get(self.head)

    @property
    def per_step(self) -> bool:
        """Whether the model scores each step (its head at the step markers)."""
        return self.head == "markers"

    @property
    def classifier(self) -> "Literal['sequence', 'token'] | None":
        """The classifier a trained RM of this kind is: one score per sequence (head at the
        last token) or per token (at the step markers); None for other kinds."""
        return {"last": "sequence", "markers": "token"}.get(self.head)  # type: ignore[return-value]


@dataclass(frozen=True)
class RuleTerm:
    """One rule term: its name, its scorer ``"module:function"`` (``(problem, completion)
    -> float`` in [0, 1], never raising on hostile input), whether ``rule:`` may list it
    (``math`` is a learned reward's mix only) and what it rewards."""

    name: str
    scorer: str
    in_rule: bool
    summary: str


RULE_TERMS: dict[str, RuleTerm] = {t.name: t for t in (
    RuleTerm("outcome", "race.rewards.rule_terms:outcome", True, "0/1 final answer"),
    RuleTerm("partial", "race.rewards.rule_terms:partial", True,
             "(valid steps + correct answer) / (operations + 1)"),
    RuleTerm("format", "race.rewards.rule_terms:answer_format", True,
             "1 when the completion follows the task's answer format, whatever its values"),
    RuleTerm("math", "race.rewards.mathverify:math_score", False, "math-verify final answer (0/1)"),
)}

REWARD_KINDS: dict[str, RewardKind] = {k.name: k for k in (
    RewardKind("rule", False, "none", tuple(t.name for t in RULE_TERMS.values() if t.in_rule),
               "race.rewards.rule:build_rule", "terms",
               "rule:partial", summary="rule terms joined by '+', equal weights (default outcome)"),
    RewardKind("random", False, "none", (), "race.rewards.rule:build_random", "none", "random",
               summary="random-reward control: coin flips"),
    RewardKind("math", False, "none", (), "race.rewards.mathverify:build_math", "none", "math",
               summary="math-verify final-answer check (0/1)"),
    RewardKind("orm", True, "last", ("rm",), "race.rewards.learned:build_learned", "model", "orm:orm-s", labels=1,
               summary="outcome RM: one score per trajectory"),
    RewardKind("prm", True, "markers", ("min", "last", "mean", "prod"), "race.rewards.learned:build_learned",
               "model", "prm:prm-s", labels=2, summary="process RM: one score per step marker, aggregated"),
    RewardKind("judge", True, "decode", ("rm",), "race.rewards.learned:build_judge", "model", "judge:tiny-s",
               summary="generative judge: decodes a verdict"),
    RewardKind("py", False, "none", (), "race.rewards.python:build_python", "import", "py:mypkg.rewards:correctness",
               summary="your Python function with TRL's reward_funcs signature, by import path"),
)}



def entry_point(ref: str) -> tuple[str, str]:
    """``(module, function)`` of a row's ``"module:function"`` (a builder or a scorer)."""
    module, _, func = ref.partition(":")
    return module, func


def reward_kind(name: str) -> RewardKind:
    """The row of kind ``name``; ``AccountingError`` names the kinds."""
    if name not in REWARD_KINDS:
        raise AccountingError(f"reward kind must be one of {', '.join(REWARD_KINDS)}, got {name!r}")
    return REWARD_KINDS[name]


def model_kinds() -> tuple[str, ...]:
    """The kinds a learned model scores (orm, prm, judge, ...), in table order."""
    return tuple(k.name for k in REWARD_KINDS.values() if k.model)


def classifier_kinds() -> tuple[str, ...]:
    """The model kinds whose RM is a classifier RACE can train and score (orm, prm)."""
    return tuple(k.name for k in REWARD_KINDS.values() if k.classifier)


@dataclass(frozen=True)
class RewardSystem:
    """How rewards are computed, and with which model (a model kind's): the accounting's
    view of a resolved reward spec. ``kind`` is a row of :data:`REWARD_KINDS` (``math``
    costs what ``rule`` costs: its label is ``rule``)."""

    kind: str = "rule"
    shape: ModelShape | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.row.model and self.shape is None:
            raise AccountingError(f"reward kind {self.kind!r} needs the reward model's shape")

    @property
    def row(self) -> RewardKind:
        return reward_kind(self.kind)

    @property
    def is_model(self) -> bool:
        return self.row.model

    def label(self) -> str:
        return self.kind if not self.is_model else f"{self.kind}:{self.name or (self.shape.name if self.shape else '')}"


RULE = RewardSystem("rule")

__all__ = ["ARGUMENTS", "HEADS", "REWARD_KINDS", "RULE", "RULE_TERMS", "RewardKind", "RewardSystem", "RuleTerm",
           "classifier_kinds", "entry_point", "model_kinds", "reward_kind"]
