"""The reward-spec grammar: the one parser of the strings users write for a reward system.

::

    rule[:TERMS]         rule-based: TERMS joined by ``+`` with equal weights, from
                         outcome (0/1 final answer, the default), partial, format
    random               random-reward control (coin flips, 0 FLOPs)
    math                 math-verify final-answer check (0/1, 0 FLOPs)
    prm:NAME[:TERMS]     process RM: one score per step marker, aggregated
    orm:NAME[:TERMS]     outcome RM: one score per trajectory
    judge:NAME[:TERMS]   generative judge
    py:MODULE:FUNCTION   your Python reward function (TRL's ``reward_funcs`` signature),
                         imported by path: ``py:mypkg.rewards:correctness``
                         (``race.rewards.python``; never evaluated as code)

``NAME`` is a reward model RACE builds (``prm-xs``, ``prm-s``, ``prm-m``, ``orm-xs``, ``orm-s``), a
local HF directory or (for planning) a Qwen2.5 preset. A learned reward's ``TERMS`` is a
``+``-joined weighted sum, each term optionally prefixed by ``W*``; weights default to 1
and are normalised to sum to 1:

- the model's score (exactly one): for a PRM its aggregation of the step scores
  ``min`` (default), ``last``, ``mean`` or ``prod``; for an ORM or judge ``rm``;
- rule terms: ``outcome``, ``partial``, ``format``, ``math`` (math-verify final answer).

Examples: ``prm:prm-s`` (= ``prm:prm-s:min``), ``prm:prm-s:min+outcome`` (0.5 x min step
score + 0.5 x outcome), ``prm:prm-xs:prod+3*outcome`` (0.25 / 0.75), ``orm:orm-s:rm+partial``.

Parsing is all this module does (stdlib only): a run config holds the parsed
:class:`RewardSpec` (``RunConfig.reward``; it writes back as the string it was given, so
run ids and files are unchanged), ``race.rewards.systems`` resolves it once (its model, its
cost) and ``race.rewards`` builds the reward system from that. Which kinds and terms parse
is the reward-kind table's (``race.accounting.reward_kinds``): a new row parses here with
no edit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from race.accounting.reward_kinds import REWARD_KINDS, RULE_TERMS as _TERM_ROWS, model_kinds

# The table's words as tuples (a snapshot for importers; the parser reads the table itself).
KINDS = tuple(REWARD_KINDS)
LEARNED_KINDS = model_kinds()
AGGREGATIONS = REWARD_KINDS["prm"].terms
#: Terms a ``rule:`` reward combines (0 FLOPs each).
RULE_REWARD_TERMS = tuple(t for t, row in _TERM_ROWS.items() if row.in_rule)
#: Rule terms a learned reward may mix into its score.
RULE_TERMS = tuple(_TERM_ROWS)


#: What ``py:`` takes: a dotted module path, a colon, a function name (identifiers only).
_IMPORT_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
_ARG_FORMS = {"none": "", "terms": "", "model": ":NAME", "import": ":MODULE:FUNCTION"}


def _kinds_text() -> str:
    """How to write each kind, for messages: ``rule, random, math, orm:NAME, ... or py:MODULE:FUNCTION``."""
    forms = [k.name + _ARG_FORMS[k.argument] for k in REWARD_KINDS.values()]
    return ", ".join(forms[:-1]) + " or " + forms[-1]


def _model_terms(kind: str) -> tuple[str, ...]:
    """A model kind's own score terms (its row's; the first is the default)."""
    if kind not in REWARD_KINDS or not REWARD_KINDS[kind].model:
        raise ValueError(f"parse_learned handles {', '.join(model_kinds())}, got {kind!r}")
    return REWARD_KINDS[kind].terms


def _rule_terms(in_rule: bool = False) -> tuple[str, ...]:
    """The rule terms (those ``rule:`` may list, with ``in_rule``)."""
    return tuple(t for t, row in _TERM_ROWS.items() if row.in_rule or not in_rule)


@dataclass(frozen=True)
class RewardSpec:
    """A parsed reward spec. ``weights``: term -> weight (sum 1); for a learned reward the
    model's own score is the term ``rm``, aggregated by ``agg`` (PRM) ."""

    kind: str
    target: str = ""
    agg: str = ""
    weights: dict[str, float] = field(default_factory=dict)
    text: str = ""
    raw: str = field(default="", compare=False, repr=False)  # the string as written (what it serialises to)

    def __str__(self) -> str:
        """The spec as the user wrote it (run files, run ids, report cards)."""
        return self.raw or self.text or self.kind

    @property
    def learned(self) -> bool:
        """Whether a learned model scores (its kind's row: ``model``)."""
        return REWARD_KINDS[self.kind].model

    @property
    def rule_arg(self) -> str:
        """What follows ``rule:`` (empty for plain ``rule``)."""
        return self.text.partition(":")[2] if REWARD_KINDS[self.kind].argument == "terms" else ""


def _parse_terms(kind: str, text: str) -> tuple[str, dict[str, float]]:
    model_terms, rule_terms = _model_terms(kind), _rule_terms()
    agg, raw = "", {}
    for item in text.split("+"):
        w_txt, star, term = item.strip().rpartition("*")
        term = term.strip()
        try:
            w = float(w_txt) if star else 1.0
        except ValueError:
            raise ValueError(f"weight {w_txt!r} of term {term!r} is not a number") from None
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"weight of {term!r} must be a finite number >= 0, got {w_txt}")
        key = term
        if term in model_terms or term == "rm":
            if agg:
                raise ValueError(f"only one model term allowed, got {agg!r} and {term!r}")
            agg, key = (term if term != "rm" else model_terms[0]), "rm"
        elif term not in rule_terms:
            raise ValueError(f"unknown term {term!r}; {kind} terms: {', '.join(model_terms)}"
                             f"{', rm' if 'rm' not in model_terms else ''}; rule terms: {', '.join(rule_terms)}")
        raw[key] = raw.get(key, 0.0) + w
    if not agg:
        raise ValueError(f"{kind} reward needs its model term ({'/'.join(model_terms)}) in {text!r}")
    total = sum(raw.values())
    if total <= 0:
        raise ValueError(f"weights in {text!r} sum to 0")
    return agg, {k: v / total for k, v in raw.items()}


def parse_learned(kind: str, arg: str) -> RewardSpec:
    """``NAME[:TERMS]`` of a learned reward. A trailing ``:...`` that does not parse as
    terms is part of the name (a path may contain ``:``)."""
    model_terms = _model_terms(kind)
    arg = (arg or "").strip()
    text = f"{kind}:{arg}"
    if not arg:
        raise ValueError(f"{kind} reward needs a model name, e.g. {REWARD_KINDS[kind].example}")
    target, sep, tail = arg.rpartition(":")
    if sep and target:
        try:
            agg, weights = _parse_terms(kind, tail)
            return RewardSpec(kind, target, agg, weights, text)
        except ValueError:
            if not any(t.strip().rpartition("*")[2] in (*model_terms, "rm") for t in tail.split("+")):
                return RewardSpec(kind, arg, model_terms[0], {"rm": 1.0}, text)
            raise
    return RewardSpec(kind, arg, model_terms[0], {"rm": 1.0}, text)


def parse_import(kind: str, arg: str) -> RewardSpec:
    """``MODULE:FUNCTION`` of a reward named by import path (``py:``): checked for form only
    (dotted identifiers, a colon, an identifier); importing it is ``race.rewards.python``'s."""
    arg = (arg or "").strip()
    if not _IMPORT_PATH.fullmatch(arg):
        raise ValueError(f"reward={kind}:{arg}: write {kind}:package.module:function (an importable module, a "
                         f"colon, the name of a function in it), e.g. {REWARD_KINDS[kind].example}")
    return RewardSpec(kind, target=arg, text=f"{kind}:{arg}")


def parse_reward(text: "str | RewardSpec") -> RewardSpec:
    """Parse a reward spec string (see module docstring); ``ValueError`` says what to write.
    A spec parsed already is returned as it is."""
    if isinstance(text, RewardSpec):
        return text
    spec = _parse(text)
    return replace(spec, raw=text)


def _parse(text: str) -> RewardSpec:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"reward is empty: write {_kinds_text()}")
    text = text.strip()
    kind, sep, arg = text.partition(":")
    if kind not in REWARD_KINDS:
        raise ValueError(f"reward={text!r}: kind must be {_kinds_text()}")
    form = REWARD_KINDS[kind].argument
    if form == "model":
        return parse_learned(kind, arg)
    if form == "import":
        return parse_import(kind, arg)
    if form == "none":
        if sep:
            raise ValueError(f"reward={text!r}: {kind} takes no argument; write {kind}")
        return RewardSpec(kind, text=text)
    allowed = _rule_terms(in_rule=True)
    terms = [t for t in (arg or allowed[0]).split("+") if t]
    bad = sorted(set(terms) - set(allowed))
    if bad or not terms:
        raise ValueError(f"reward={text!r}: rule terms {bad or terms} unknown; use {', '.join(allowed)} "
                         "joined by '+', e.g. rule:partial or rule:outcome+format")
    return RewardSpec(kind, weights={t: 1.0 / len(terms) for t in terms}, text=text)


def reward_columns(text: "str | RewardSpec | None") -> dict[str, object]:
    """The typed columns of a reward spec, as a study's runs table holds them
    (``race.schema.REWARD_COLUMNS``; ``race.grid.tables`` derives them from the stored
    string when it builds the table, so stores written before the columns existed need no
    migration):

    - ``reward_system``: the kind (``"prm:prm-xs:min+partial"`` -> ``"prm"``);
    - ``reward_rule``: the rule as ``rule:TERMS`` (terms sorted): a rule reward's own
      (``rule`` -> ``rule:outcome``), or the rule terms a learned reward mixes into its
      score (``prm:prm-xs:min+partial`` -> ``rule:partial``); ``None`` when there is none;
    - ``reward_model``: the learned model's name or path (``prm-xs``), else ``None``;
    - ``reward_learned``: a learned kind (orm, prm, judge); ``reward_random``: the
      random-reward control.

    ``None`` or an empty string (a run without a reward) gives every column empty."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return {"reward_system": None, "reward_rule": None, "reward_model": None, "reward_learned": None,
                "reward_random": None}
    spec = parse_reward(text)
    terms = sorted(t for t in spec.weights if t != "rm")  # random, math: none
    return {"reward_system": spec.kind, "reward_rule": "rule:" + "+".join(terms) if terms else None,
            "reward_model": spec.target if spec.learned else None, "reward_learned": spec.learned,
            "reward_random": spec.kind == "random"}


__all__ = ["AGGREGATIONS", "KINDS", "LEARNED_KINDS", "RULE_TERMS", "RULE_REWARD_TERMS", "RewardSpec",
           "parse_import", "parse_learned", "parse_reward", "reward_columns"]
