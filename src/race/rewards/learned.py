"""Learned reward systems as ``RewardFunction``s: ORMs and PRMs (RACE's own, loaded from
the cache, or a local HF directory) and the generative judge, built from a resolved
spec (:class:`race.rewards.systems.ResolvedReward`). Loading never trains: a RACE RM that is not built
raises :class:`~race.artefacts.cache.NotBuiltError` naming ``race rm build``; a run builds
the RM it names before it constructs its reward (``race.builds.demand``).

A PRM's step scores are p(step ok) at each marker of the completion: for RACE's PRMs the
``;`` ending each step and the ``.`` closing the final answer; a trajectory that never
closes its final answer gets a final score of 0 (an unfinished trajectory earns no process
reward). An ORM scores p(correct) at the last token.

FLOPs: ``score()`` runs ONE batched forward over the padded batch (every row padded to the
longest, which is what executes) with the head only at the scored positions, and charges
``reward_model_flops`` for exactly that (``reward/forward`` + ``reward/head``).
``step_bound(n, P, T, problems=...)`` bounds a step by ``n`` sequences of ``min(max_length,
prompt + k * T + tail)`` RM tokens: ``prompt`` the longest of the step's problems as the RM
reads it (the FULL prompt, rendered through the RM's template and tokenised by the RM; the
policy's prompt may have been cut to ``max_prompt_length``, the RM's is not), ``k`` the most
RM tokens one policy token can decode to (known when the builder gets the policy's
``tokenizer``), ``tail`` the template tokens after the completion, plus one separator per
policy token where the RM writes step separators itself. Without ``k`` the bound is the
RM's whole window (``max_length``); without ``problems`` the prompt is taken as ``k * P``.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from race.accounting import RewardSystem, reward_model_flops
from race.accounting.reward_kinds import reward_kind
from race.rewards.base import RewardOutput
from race.rewards.hf import JudgeReward, load_hf_scorer
from race.rewards.rm_encoding import MAX_MARKERS, Scorer, encode, head_logits, positive_prob
from race.rewards.rm_recipes import known_rms, recipe_for, rm_path
from race.rewards.rule_terms import rule_terms
from race.rewards.terms import aggregate, weighted
from race.rewards.text import sanitize
from race.spec.reward import RewardSpec


class LearnedReward:
    """An ORM or PRM as a ``RewardFunction`` (see module docstring). Its head rule is its
    kind's row (``race.accounting.reward_kinds``): the head at the step markers (a PRM's
    ``markers``: one score per marker, aggregated by the spec's ``agg``) or at the last
    token (an ORM's ``last``: one score)."""

    def __init__(self, name: str, kind: str, scorer: Scorer, spec: RewardSpec, *,
                 conventions: Any = None, tokens_per_policy_token: int | None = None) -> None:
        self.name, self.kind, self.scorer, self.spec = name, kind, scorer, spec
        self.per_step = reward_kind(kind).head == "markers"
        self.conventions = conventions
        self.system = RewardSystem(kind, scorer.shape, name)  # the executed model's shape: what the ledger charges
        self.k = tokens_per_policy_token
        self._read_cache: tuple[Any, int, int, int] | None = None  # (problems, len, T, RM tokens), the last call

    def _scores(self, problems: Sequence[Any], completions: Sequence[str]) -> tuple[list[list[float]], dict[str, Any]]:
        import torch

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
            if self.per_step and sc.final_marker is not None:
                cols = batch["cols"][at: at + k].tolist()
                if not any(ids[i][c] == sc.final_marker for c in cols):
                    row = row + [0.0]
            at += k
            out.append(row)
        return out, batch

    def score(self, problems: Sequence[Any], completions: Sequence[str]) -> RewardOutput:
        t0 = time.perf_counter()
        if not completions:
            return RewardOutput([], [])
        steps, batch = self._scores(problems, completions)
        B, L = batch["input_ids"].shape
        head = getattr(self.scorer, "head_positions", None) or (list(batch["counts"]) if self.per_step else "last")
        comps = reward_model_flops(self.system, [L] * B, head_positions=head, conventions=self.conventions)
        needed = [t for t in self.spec.weights if t != "rm"]
        rewards, verified, rm_scores = [], [], []
        for p, c, s in zip(problems, completions, steps):
            rm = aggregate(s, self.spec.agg) if self.per_step else (s[0] if s else 0.0)
            terms = rule_terms(p, sanitize(c), needed)
            terms["rm"] = rm
            rewards.append(weighted(self.spec.weights, terms))
            verified.append(terms["outcome"])
            rm_scores.append(rm)
        extra = {"rm_score_mean": sum(rm_scores) / len(rm_scores)}
        return RewardOutput(rewards, verified, components=comps, tokens=B * L, seconds=time.perf_counter() - t0,
                            extra=extra)

    def rm_tokens_bound(self, problems: Sequence[Any], max_completion_len: int) -> int:
        """Most tokens the RM reads for one of ``problems`` with a completion of at most
        ``max_completion_len`` policy tokens (before the cut to ``max_length``); needs ``k``.
        Remembered for the last ``problems`` list (the TRL engine passes its whole dataset)."""
        assert self.k is not None
        c = self._read_cache  # the list itself is kept, so a new list can never pass for it
        if c is not None and c[0] is problems and c[1:3] == (len(problems), max_completion_len):
            return c[3]
        sc = self.scorer
        per_token = self.k + (1 if sc.inserts_markers else 0)
        worst = 0
        for p in problems:
            prefix, tail = sc.render(p, "")  # the RM's prompt and the template tokens after a completion
            n = sum(len(sc.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in (prefix, tail) if t)
            worst = max(worst, n + per_token * max_completion_len)
        self._read_cache = (problems, len(problems), max_completion_len, worst)
        return worst

    def step_bound(self, n_sequences: int, max_prompt_len: int, max_completion_len: int, *,
                   problems: Sequence[Any] | None = None) -> int:
        L = self.scorer.max_length
        if self.k is not None:
            if problems:
                L = min(L, self.rm_tokens_bound(problems, max_completion_len))
            else:
                L = min(L, self.k * (max_prompt_len + max_completion_len))
        L = max(1, L)
        head = getattr(self.scorer, "head_positions", None) or (
            [min(L, MAX_MARKERS)] * n_sequences if self.per_step else "last")
        return sum(reward_model_flops(self.system, [L] * n_sequences, head_positions=head,
                                      conventions=self.conventions).values())


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


# -- loading from a spec --------------------------------------------------------------------------
def load_race_rm(name: str, *, device: Any = "auto", cache_dir: Any = None) -> Scorer:
    """Load RACE-built RM ``name`` from the cache (``NotBuiltError`` when it is not built);
    its ``race_rm.json`` says how it reads texts (see ``race.rewards.hf``)."""
    path = rm_path(name, cache_dir=cache_dir)
    if recipe_for(name).scoring == "likelihood":
        import json

        from race.models.loading import resolve_device
        from race.rewards.rm_likelihood import load_likelihood_scorer

        settings = json.loads((path / "race_rm.json").read_text())
        return load_likelihood_scorer(path, settings, device=resolve_device(device), name=name)
    return load_hf_scorer(path, recipe_for(name).kind, device=device, name=name)


def build_learned(reward: Any, *, device: Any = "auto", conventions: Any = None, cache_dir: Any = None,
                  tokenizer: Any = None, **_: Any) -> LearnedReward:
    """An ORM or PRM from its resolved spec (``race.rewards.systems.ResolvedReward``: which
    model its target names was decided there, once): a local HF directory or one RACE built."""
    spec, named = reward.spec, reward.target
    kind = spec.kind
    if named.source == "path":
        scorer = load_hf_scorer(spec.target, kind, device=device)
    elif named.source == "recipe":
        scorer = load_race_rm(spec.target, device=device, cache_dir=cache_dir)
    else:
        raise ValueError(f"unknown reward model {spec.target!r} for {kind}; RACE builds: "
                         f"{', '.join(n for n in known_rms() if n.startswith(kind))} "
                         f"(or give a local HF directory: {kind}:/path/to/model)")
    k = tokens_per_policy_token(tokenizer, scorer.tokenizer)
    return LearnedReward(named.name, kind, scorer, spec, conventions=conventions, tokens_per_policy_token=k)


def build_judge(reward: Any, *, device: Any = "auto", conventions: Any = None, cache_dir: Any = None,
                **_: Any) -> Any:
    """A generative judge (``race.rewards.hf.JudgeReward``) from its resolved spec."""
    return JudgeReward.load(reward.spec, device=device, conventions=conventions, cache_dir=cache_dir)
