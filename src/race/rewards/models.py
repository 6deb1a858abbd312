"""Learned reward systems as ``RewardFunction``s, registered by kind: ``prm``, ``orm``,
``judge``; and ``math`` (math-verify final answers, rule-based: 0 FLOPs).

Spec grammar (``make_reward(spec)``; the part after the model is optional)::

    prm:NAME[:TERMS]     process RM: one score per step marker, aggregated
    orm:NAME[:TERMS]     outcome RM: one score per trajectory
    judge:NAME[:TERMS]   generative judge (see ``race.rewards.hf.JudgeReward``)
    math                 math-verify final-answer check (0/1)

``NAME`` is a reward model RACE builds (``prm-xs``, ``prm-s``, ``orm-xs``, ``orm-s``:
cached under ``<cache>/rm/``, built on first use like ``load_policy(build_missing=True)``,
or ahead of time with ``race rm build``) or a local HF directory (``prm:/models/my-prm``,
see ``race.rewards.hf``). ``TERMS`` is a ``+``-joined weighted sum, each term optionally
prefixed by ``W*``; weights default to 1 and are normalised to sum to 1:

- the model's score (exactly one): for a PRM its aggregation of the step scores
  ``min`` (default), ``last``, ``mean`` or ``prod``; for an ORM or judge ``rm``;
- rule terms: ``outcome`` (0/1 final answer), ``partial`` (valid steps + answer, over
  n_ops + 1), ``format`` (exact layout), ``math`` (math-verify final answer).

Examples: ``prm:prm-s`` (= ``prm:prm-s:min``), ``prm:prm-s:mean``,
``prm:prm-s:min+outcome`` (0.5 x min step score + 0.5 x outcome),
``prm:prm-xs:prod+3*outcome`` (0.25 / 0.75), ``orm:orm-s:rm+partial``.

A PRM's step scores are p(step ok) at each marker of the completion: for RACE's PRMs the
``;`` ending each step and the ``.`` closing the final answer; a trajectory that never
closes its final answer gets a final score of 0 (an unfinished trajectory earns no process
reward). An ORM scores p(correct) at the last token.

FLOPs: ``score()`` runs ONE batched forward over the padded batch (every row padded to the
longest, which is what executes) with the head only at the scored positions, and charges
``reward_model_flops`` for exactly that (``reward/forward`` + ``reward/head``).
``step_bound(n, P, T)`` bounds a step by ``n`` sequences of ``min(max_length, k * (P +
T))`` RM tokens, ``k`` the most RM tokens one policy token can decode to (known when the
builder gets the policy's ``tokenizer``; without it ``max_length``, conservatively).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from race.rewards.base import RewardOutput
from race.rewards.registry import register

AGGREGATIONS = ("min", "last", "mean", "prod")
RULE_TERMS = ("outcome", "partial", "format", "math")
_MODEL_TERMS = {"prm": AGGREGATIONS, "orm": ("rm",), "judge": ("rm",)}
#: Characters of a completion a reward model reads at most (before tokenising).
MAX_TEXT_CHARS = 16_384


# -- spec parsing ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardSpec:
    kind: str
    target: str
    agg: str
    weights: dict[str, float] = field(default_factory=dict)  # "rm" and rule terms -> weight (sum 1)


def _parse_terms(kind: str, text: str) -> tuple[str, dict[str, float]]:
    model_terms = _MODEL_TERMS[kind]
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
        elif term not in RULE_TERMS:
            raise ValueError(f"unknown term {term!r}; {kind} terms: {', '.join(model_terms)}"
                             f"{', rm' if kind == 'prm' else ''}; rule terms: {', '.join(RULE_TERMS)}")
        raw[key] = raw.get(key, 0.0) + w
    if not agg:
        raise ValueError(f"{kind} reward needs its model term ({'/'.join(model_terms)}) in {text!r}")
    total = sum(raw.values())
    if total <= 0:
        raise ValueError(f"weights in {text!r} sum to 0")
    return agg, {k: v / total for k, v in raw.items()}


def parse_spec(kind: str, arg: str) -> RewardSpec:
    """Split ``NAME[:TERMS]`` (see module docstring). A trailing ``:...`` that does not
    parse as terms is part of the name (a path may contain ``:``)."""
    if kind not in _MODEL_TERMS:
        raise ValueError(f"parse_spec handles prm, orm and judge, got {kind!r}")
    arg = (arg or "").strip()
    if not arg:
        raise ValueError(f"{kind} reward needs a model, e.g. {kind}:{'prm-s' if kind == 'prm' else 'orm-s'}")
    target, sep, tail = arg.rpartition(":")
    if sep and target:
        try:
            agg, weights = _parse_terms(kind, tail)
            return RewardSpec(kind, target, agg, weights)
        except ValueError:
            if not any(t.strip().rpartition("*")[2] in (*_MODEL_TERMS[kind], "rm") for t in tail.split("+")):
                return RewardSpec(kind, arg, _MODEL_TERMS[kind][0], {"rm": 1.0})
            raise
    return RewardSpec(kind, arg, _MODEL_TERMS[kind][0], {"rm": 1.0})


def aggregate(scores: Sequence[float], how: str) -> float:
    """Step scores -> one reward: ``min``, ``last``, ``mean`` or ``prod`` (0 when empty)."""
    if not scores:
        return 0.0
    if how == "min":
        return float(min(scores))
    if how == "last":
        return float(scores[-1])
    if how == "mean":
        return float(sum(scores) / len(scores))
    if how == "prod":
        return float(math.prod(scores))
    raise ValueError(f"unknown aggregation {how!r}; choose one of {', '.join(AGGREGATIONS)}")


def verify_terms(problem: Any, completion: Any) -> tuple[float, float, float]:
    """(outcome 0/1, partial credit, format 0/1) of one completion: ``race.tasks.verify``
    for the built-in task, ``verify_final_answer`` for question/answer problems."""
    from race.tasks import partial_credit, verify, verify_final_answer
    from race.tasks.files import TextProblem

    if isinstance(problem, TextProblem):
        ok = 1.0 if verify_final_answer(problem, completion).correct else 0.0
        return ok, ok, ok
    v = verify(problem, completion)
    return (1.0 if v.correct else 0.0), partial_credit(v), (1.0 if v.format_ok else 0.0)


def rule_terms(problem: Any, completion: str, needed: Sequence[str]) -> dict[str, float]:
    """The rule-based terms ``needed`` for one completion (0 FLOPs)."""
    outcome, partial, fmt = verify_terms(problem, completion)
    out = {"outcome": outcome, "partial": partial, "format": fmt}
    if "math" in needed:
        out["math"] = 1.0 if math_correct(problem, completion) else 0.0
    return out


def sanitize(text: Any, max_chars: int = MAX_TEXT_CHARS) -> str:
    """A str any tokenizer accepts: non-strings -> "", cut to ``max_chars``, lone
    surrogates and other unencodable code points -> ``?``."""
    if not isinstance(text, str):
        return ""
    text = text[:max_chars]
    return text.encode("utf-8", "replace").decode("utf-8")


# -- learned reward models (ORM / PRM) ---------------------------------------------------------
@dataclass
class Scorer:
    """What a reward model needs to score: the model (``base_model`` + ``score`` head), its
    tokenizer, its ``ModelShape``, how texts are rendered and which token ids it reads."""

    model: Any
    tokenizer: Any
    shape: Any
    render: Any  # (problem, completion) -> (prefix text, body text)
    markers: frozenset[int] | None  # PRM: token ids read in the body; ORM: None (last token)
    max_length: int
    final_marker: int | None = None  # PRM: an unfinished trajectory (no final marker) scores 0 at the end


class LearnedReward:
    """An ORM or PRM as a ``RewardFunction`` (see module docstring)."""

    def __init__(self, name: str, kind: str, scorer: Scorer, spec: RewardSpec, *,
                 conventions: Any = None, tokens_per_policy_token: int | None = None) -> None:
        from race.accounting import RewardSystem

        self.name, self.kind, self.scorer, self.spec = name, kind, scorer, spec
        self.conventions = conventions
        self.system = RewardSystem(kind, scorer.shape, name)  # type: ignore[arg-type]
        self.k = tokens_per_policy_token

    def _scores(self, problems: Sequence[Any], completions: Sequence[str]) -> tuple[list[list[float]], dict[str, Any]]:
        import torch

        from race.rewards.training import encode, head_logits, positive_prob

        sc = self.scorer
        rendered = [sc.render(p, sanitize(c)) for p, c in zip(problems, completions, strict=True)]
        batch = encode(sc.tokenizer, [r[0] for r in rendered], [r[1] for r in rendered], self.kind,
                       max_length=sc.max_length, markers=sc.markers)
        device = next(sc.model.parameters()).device
        tb = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}
        with torch.no_grad():
            probs = positive_prob(head_logits(sc.model, tb)).tolist()
        out, at = [], 0
        ids = batch["input_ids"].tolist()
        for i, k in enumerate(batch["counts"]):
            row = probs[at: at + k]
            if self.kind == "prm" and sc.final_marker is not None:
                cols = batch["cols"][at: at + k].tolist()
                if not any(ids[i][c] == sc.final_marker for c in cols):
                    row = row + [0.0]
            at += k
            out.append(row)
        return out, batch

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput:
        from race.accounting import reward_model_flops

        t0 = time.perf_counter()
        if not completions:
            return RewardOutput([], [])
        steps, batch = self._scores(problems, completions)
        B, L = batch["input_ids"].shape
        head = list(batch["counts"]) if self.kind == "prm" else "last"
        comps = reward_model_flops(self.system, [L] * B, head_positions=head, conventions=self.conventions)
        needed = [t for t in self.spec.weights if t != "rm"]
        rewards, verified, rm_scores = [], [], []
        for p, c, s in zip(problems, completions, steps):
            rm = aggregate(s, self.spec.agg) if self.kind == "prm" else (s[0] if s else 0.0)
            terms = rule_terms(p, sanitize(c), needed)
            terms["rm"] = rm
            rewards.append(sum(w * terms[t] for t, w in self.spec.weights.items()))
            verified.append(terms["outcome"])
            rm_scores.append(rm)
        extra = {"rm_score_mean": sum(rm_scores) / len(rm_scores)}
        return RewardOutput(rewards, verified, components=comps, tokens=B * L, seconds=time.perf_counter() - t0,
                            extra=extra)

    def step_bound(self, n_sequences: int, max_prompt_len: int, max_completion_len: int) -> int:
        from race.accounting import reward_model_flops

        L = self.scorer.max_length
        if self.k is not None:
            L = min(L, self.k * (max_prompt_len + max_completion_len))
        L = max(1, L)
        head = [min(L, _max_markers())] * n_sequences if self.kind == "prm" else "last"
        return sum(reward_model_flops(self.system, [L] * n_sequences, head_positions=head,
                                      conventions=self.conventions).values())


def _max_markers() -> int:
    from race.rewards.training import MAX_MARKERS

    return MAX_MARKERS


def tokens_per_policy_token(policy_tokenizer: Any, rm_tokenizer: Any, limit: int = 4096) -> int | None:
    """Most RM tokens one policy token decodes to (``None`` when the policy vocabulary is
    too large to check cheaply: the bound then falls back to the RM's ``max_length``)."""
    if policy_tokenizer is None:
        return None
    n = len(policy_tokenizer)
    if n > limit:
        return None
    worst = 1
    for i in range(n):
        text = policy_tokenizer.decode([i], skip_special_tokens=True)
        if text:
            worst = max(worst, len(rm_tokenizer(sanitize(text), add_special_tokens=False)["input_ids"]))
    return worst


# -- RACE's own reward models -------------------------------------------------------------------
def _is_path(target: str) -> bool:
    return target.startswith((".", "/", "~")) or os.sep in target or Path(target).expanduser().exists()


def _prompt_of(problem: Any) -> str:
    return str(getattr(problem, "prompt", "") or "")


def load_race_rm(name: str, *, device: Any = "auto", cache_dir: Any = None, build_missing: bool = True) -> Scorer:
    """Load RACE-built RM ``name`` (building it first when missing and ``build_missing``);
    its ``race_rm.json`` says how it reads texts (see ``race.rewards.hf``)."""
    from race.rewards.hf import load_hf_scorer
    from race.rewards.training import recipe_for, resolve_rm

    path = resolve_rm(name, cache_dir=cache_dir, build_missing=build_missing)
    return load_hf_scorer(path, recipe_for(name).kind, device=device, name=name)


def _build_learned(kind: str, arg: str, *, device: Any = "auto", conventions: Any = None, cache_dir: Any = None,
                   tokenizer: Any = None, build_missing: bool = True, **_: Any) -> LearnedReward:
    spec = parse_spec(kind, arg)
    if _is_path(spec.target):
        from race.rewards.hf import load_hf_scorer

        scorer = load_hf_scorer(spec.target, kind, device=device)
        name = Path(spec.target).expanduser().name
    else:
        from race.rewards.training import known_rms, recipe_for

        try:
            recipe = recipe_for(spec.target)
        except KeyError:
            raise ValueError(f"unknown reward model {spec.target!r} for {kind}; RACE builds: "
                             f"{', '.join(n for n in known_rms() if n.startswith(kind))} "
                             f"(or give a local HF directory: {kind}:/path/to/model)") from None
        if recipe.kind != kind:
            from race.rewards.hf import article

            raise ValueError(f"{spec.target!r} is {article(recipe.kind)}, not {article(kind)}: "
                             f"use {recipe.kind}:{spec.target}")
        scorer = load_race_rm(spec.target, device=device, cache_dir=cache_dir, build_missing=build_missing)
        name = spec.target
    k = tokens_per_policy_token(tokenizer, scorer.tokenizer)
    return LearnedReward(name, kind, scorer, spec, conventions=conventions, tokens_per_policy_token=k)


@register("prm")
def _prm(arg: str, **kwargs: Any) -> LearnedReward:
    return _build_learned("prm", arg, **kwargs)


@register("orm")
def _orm(arg: str, **kwargs: Any) -> LearnedReward:
    return _build_learned("orm", arg, **kwargs)


@register("judge")
def _judge(arg: str, *, device: Any = "auto", conventions: Any = None, cache_dir: Any = None,
           **_: Any) -> Any:
    from race.rewards.hf import JudgeReward

    spec = parse_spec("judge", arg)
    return JudgeReward.load(spec, device=device, conventions=conventions, cache_dir=cache_dir)


# -- math-verify final answers (rule-based) --------------------------------------------------------
class _Deadline(BaseException):
    """Raised by the timer inside math-verify; a BaseException so that the library's
    ``except Exception`` blocks cannot swallow it."""


MATH_MAX_CHARS = 4096
MATH_TIMEOUT_S = 0.5


def _risky(text: str) -> bool:
    """Inputs math-verify is not given (the fast check still runs): a number over 40
    digits, or a power whose exponent has 4+ digits or is itself a power."""
    import re

    return bool(re.search(r"[0-9]{41}", text) or re.search(r"(\^|\*\*)\s*[{(]?\s*-?[0-9]{4}", text)
                or re.search(r"(\^|\*\*)[^$\n]{0,12}(\^|\*\*)", text))


_WARM = False


def _warm_up(parse: Any, verify: Any) -> None:
    """First parses pay sympy's and the LaTeX grammar's lazy set-up (~1 s); pay it once,
    on fixed benign inputs, outside the per-answer timer."""
    global _WARM
    if not _WARM:
        _WARM = True
        for gold, pred in (("\\frac{1}{2}", "$0.5$"), ("x^2+1", "$1+x^2$"), ("2\\sqrt{2}", "$\\sqrt{8}$")):
            try:
                verify(parse("\\boxed{" + gold + "}", parsing_timeout=None), parse(pred, parsing_timeout=None),
                       timeout_seconds=None)
            except Exception:  # pragma: no cover - warm-up only
                pass


def _math_verify(gold: str, text: str, timeout_s: float) -> bool:
    import logging
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False  # math-verify's only interrupt is a signal timer: main thread only
    try:
        from math_verify import parse, verify
    except ImportError:
        return False
    for name in ("math_verify.parser", "math_verify.grader"):  # "timeout disabled": we run our own timer
        logging.getLogger(name).setLevel(logging.ERROR)
    _warm_up(parse, verify)

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Deadline()

    old_timer = signal.getitimer(signal.ITIMER_REAL)  # someone else's alarm (e.g. pytest-timeout)
    old = signal.signal(signal.SIGALRM, on_alarm)
    t0 = time.monotonic()
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            g = parse("\\boxed{" + gold + "}", parsing_timeout=None)  # type: ignore[arg-type]
            p = parse(text, parsing_timeout=None)  # type: ignore[arg-type]
            return bool(g and p and verify(g, p, timeout_seconds=None))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)  # an alarm firing in here is caught below
    except (_Deadline, Exception):
        return False
    finally:
        signal.signal(signal.SIGALRM, old)
        if old_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, old_timer[0] - (time.monotonic() - t0)), old_timer[1])


def math_correct(problem: Any, completion: Any, *, max_chars: int = MATH_MAX_CHARS,
                 timeout_s: float = MATH_TIMEOUT_S) -> bool:
    """Final-answer correctness with math-verify (LaTeX/expression equivalence, e.g.
    ``\\frac{1}{2}`` == ``0.5``) for question/answer problems, after the exact rule check
    (which alone decides for the built-in task). Bounded: only the first
    ``max_chars`` characters are read, numbers over 40 digits and power towers are not
    parsed, and parsing + comparison stop after ``timeout_s`` (a signal timer, so only
    in the main thread; elsewhere the rule check alone decides). Never evaluates text."""
    from race.tasks.files import TextProblem

    if not isinstance(completion, str):
        return False
    text = sanitize(completion, max_chars)
    if verify_terms(problem, text)[0] == 1.0:
        return True
    if not isinstance(problem, TextProblem):
        return False  # the built-in task: the exact parse decides (math-verify would read a step)
    gold = str(getattr(problem, "answer", ""))[:200]
    if not gold or _risky(text) or _risky(gold):
        return False
    return _math_verify(gold, text, timeout_s)


@dataclass
class MathReward:
    """0/1 reward from :func:`math_correct` (0 FLOPs). ``verified`` stays the rule check,
    the same one every reward system reports, so runs compare."""

    name: str = "math"
    kind: str = "rule"

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput:
        t0 = time.perf_counter()
        rewards = [1.0 if math_correct(p, c) else 0.0 for p, c in zip(problems, completions, strict=True)]
        verified = [verify_terms(p, sanitize(c))[0] for p, c in zip(problems, completions)]
        return RewardOutput(rewards, verified, seconds=time.perf_counter() - t0)

    def step_bound(self, n_sequences: int, max_prompt_len: int, max_completion_len: int) -> int:
        return 0


@register("math")
def _math(arg: str, **_: Any) -> MathReward:
    if arg:
        raise ValueError(f"math takes no argument, got {arg!r}")
    return MathReward()
