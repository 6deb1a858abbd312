"""Quality of a reward model on what the policies write: step AUC and bad-step recall on
held-out policy samples, with the recall threshold chosen on a validation set first.

The protocol (:func:`heldout_quality`), the same for every RM:

1. validation set: policy samples (:mod:`race.builds.rm_samples`, kind ``val``) on
   ``train``-split problems outside the RM's training pool; the threshold ``t`` is the
   one that maximises Youden's J (recall of bad steps + recall of good steps - 1) there
   (:func:`youden_threshold`), fixed before the held-out set is scored;
2. held-out set: policy samples (kind ``heldout``) on ``test``-split problems (disjoint
   from ``train`` by the task's construction) under their own sampling seed;
3. reported there: ``step_auc`` (ranking of good over bad steps by p(step ok)),
   ``bad_step_recall`` (bad steps with p(ok) < t), ``good_step_recall``, the recall at 0.5
   for reference, ``outcome_auc`` (trajectory score vs final-answer correctness: PRM min
   over its markers, 0 when unfinished, as ``race.rewards.learned`` aggregates; ORM its
   score) and ``wrong_outcome_recall`` (ORM: wrong answers flagged at its own threshold).

Steps are the ``;`` markers before the final mark (``race.tasks.verify``'s
``step_correct``, error carried forward). Inference cost: ``flops_per_token`` is what
``race.accounting.reward_model_flops`` charges (one forward over each padded batch, the
head at the scored positions, as the RM reward charges a GRPO step) divided by the
tokens of those padded batches.
"""

from __future__ import annotations

from race.accounting.reward_kinds import reward_kind

import bisect
from collections.abc import Sequence
from typing import Any

from race.builds.rm_data import marker_labels
from race.tasks.arith import END_MARK, FINAL_MARK, STEP_SEP, Problem
from race.tasks.verify import verify

#: The shared held-out protocol: which warm starts are sampled, how many problems each.
EVAL_POLICIES = ("tiny-s", "tiny-m", "tiny-l")
N_HELDOUT_PROBLEMS = 400
N_VAL_PROBLEMS = 300


def auc(pairs: Sequence[tuple[float, int]]) -> float:
    """Area under the ROC curve of (score, 0/1 label) pairs: the chance that a random
    positive outscores a random negative (ties count half); 0.5 when one class is absent.
    What matters for GRPO, which only compares rewards within a group."""
    pos = sorted(s for s, y in pairs if y)
    neg = sorted(s for s, y in pairs if not y)
    if not pos or not neg:
        return 0.5
    wins = sum(bisect.bisect_left(neg, s) + 0.5 * (bisect.bisect_right(neg, s) - bisect.bisect_left(neg, s))
               for s in pos)
    return wins / (len(pos) * len(neg))


def recall_below(pairs: Sequence[tuple[float, int]], threshold: float) -> tuple[float, float]:
    """(recall of label 0: score < threshold, recall of label 1: score >= threshold);
    a class that is absent has recall 0."""
    bad = [s for s, y in pairs if not y]
    good = [s for s, y in pairs if y]
    r_bad = sum(s < threshold for s in bad) / len(bad) if bad else 0.0
    r_good = sum(s >= threshold for s in good) / len(good) if good else 0.0
    return r_bad, r_good


def youden_threshold(pairs: Sequence[tuple[float, int]]) -> float:
    """The threshold ``t`` (flag a step bad when its score < t) that maximises Youden's J
    = bad recall + good recall - 1 over ``pairs``; candidates are the midpoints between
    consecutive distinct scores (and 0.5 when there are none); the smallest best ``t``."""
    scores = sorted({s for s, _ in pairs})
    candidates = [(a + b) / 2 for a, b in zip(scores, scores[1:])] or [0.5]
    best_t, best_j = candidates[0], -2.0
    for t in candidates:
        r_bad, r_good = recall_below(pairs, t)
        if r_bad + r_good - 1 > best_j + 1e-12:
            best_t, best_j = t, r_bad + r_good - 1
    return best_t


def score_rows(scorer: Any, kind: str, pairs: Sequence[tuple[Problem, str]], batch_size: int = 128
               ) -> tuple[list[list[float]], int, int]:
    """p(ok) at each head position of each completion (``race.rewards.learned`` reads the
    same), the FLOPs ``reward_model_flops`` charges for the padded batches and their tokens."""
    import torch

    from race.accounting import RewardSystem, reward_model_flops
    from race.rewards.rm_encoding import encode, head_logits, positive_prob

    system = RewardSystem(kind, scorer.shape, "rm")  # type: ignore[arg-type]
    rows: list[list[float]] = []
    flops = tokens = 0
    with torch.no_grad():
        for i in range(0, len(pairs), batch_size):
            chunk = pairs[i: i + batch_size]
            batch = encode(scorer.tokenizer, [p.prompt for p, _ in chunk], [c for _, c in chunk], kind,
                           max_length=scorer.max_length, markers=scorer.markers)
            probs = positive_prob(head_logits(scorer.model, batch)).tolist()
            B, L = batch["input_ids"].shape
            head = getattr(scorer, "head_positions", None) or (
                list(batch["counts"]) if reward_kind(kind).per_step else "last")
            flops += sum(reward_model_flops(system, [L] * B, head_positions=head).values())
            tokens += B * L
            at = 0
            for k in batch["counts"]:
                rows.append(probs[at: at + k])
                at += k
    return rows, flops, tokens


def labelled(kind: str, pairs: Sequence[tuple[Problem, str]], rows: Sequence[Sequence[float]]
             ) -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
    """(step pairs, outcome pairs): (p(step ok), step valid) at each ``;`` before the
    final mark (PRM; empty for an ORM) and (trajectory score, final answer correct)."""
    steps: list[tuple[float, int]] = []
    outcomes: list[tuple[float, int]] = []
    for (p, c), row in zip(pairs, rows):
        correct = int(verify(p, c).correct)
        if reward_kind(kind).per_step:
            hash_at = c.find(FINAL_MARK)
            n_steps = sum(1 for j, ch in enumerate(c) if ch == STEP_SEP and (hash_at < 0 or j < hash_at))
            labs = marker_labels(p, c)[: len(row)]
            steps.extend((s, int(y)) for s, y in list(zip(row, labs))[:n_steps])
            finished = hash_at >= 0 and END_MARK in c[hash_at:]
            score = min(list(row) + ([] if finished else [0.0])) if row else 0.0
        else:
            score = row[0] if row else 0.0
        outcomes.append((score, correct))
    return steps, outcomes


def quality(scorer: Any, kind: str, val: Sequence[tuple[Problem, str]], heldout: Sequence[tuple[Problem, str]],
            groups: Sequence[str] | None = None) -> dict[str, Any]:
    """The module docstring's protocol on given validation and held-out pairs; with
    ``groups`` (one label per held-out pair, e.g. the policy that wrote it) also
    ``by_group``: step AUC and bad-step recall at the same threshold per group (PRM)."""
    rows, flops, tokens = score_rows(scorer, kind, heldout)
    res = quality_of_rows(kind, val, score_rows(scorer, kind, val)[0], heldout, rows, groups)
    return dict(res, flops_per_token=flops / max(1, tokens))


def quality_of_rows(kind: str, val: Sequence[tuple[Problem, str]], val_rows: Sequence[Sequence[float]],
                    heldout: Sequence[tuple[Problem, str]], rows: Sequence[Sequence[float]],
                    groups: Sequence[str] | None = None) -> dict[str, Any]:
    """:func:`quality` from the scores themselves (``rows``: p(ok) per head position of
    each pair, as :func:`score_rows` returns them)."""
    v_steps, v_out = labelled(kind, val, val_rows)
    steps, outcomes = labelled(kind, heldout, rows)
    by_group: dict[str, Any] = {}
    if groups is not None and reward_kind(kind).per_step:
        t = youden_threshold(v_steps)
        for g in dict.fromkeys(groups):
            idx = [i for i, x in enumerate(groups) if x == g]
            g_steps, _ = labelled(kind, [heldout[i] for i in idx], [rows[i] for i in idx])
            by_group[g] = dict(step_auc=auc(g_steps), bad_step_recall=recall_below(g_steps, t)[0],
                               n_steps=len(g_steps), n_bad_steps=sum(1 for _, y in g_steps if not y))
    res: dict[str, Any] = dict(n_samples=len(heldout), outcome_auc=auc(outcomes),
                               n_correct=sum(y for _, y in outcomes))
    if reward_kind(kind).per_step:
        t = youden_threshold(v_steps)
        r_bad, r_good = recall_below(steps, t)
        res.update(step_auc=auc(steps), threshold=t, bad_step_recall=r_bad, good_step_recall=r_good,
                   bad_step_recall_at_half=recall_below(steps, 0.5)[0], n_steps=len(steps),
                   n_bad_steps=sum(1 for _, y in steps if not y))
        if by_group:
            res["by_group"] = by_group
    else:
        t = youden_threshold(v_out)
        r_bad, r_good = recall_below(outcomes, t)
        res.update(threshold=t, wrong_outcome_recall=r_bad, right_outcome_recall=r_good)
    return res


def heldout_for(recipe: Any, scorer: Any, pool: Sequence[tuple[Problem, str]] | None, *,
                cache_dir: Any = None) -> dict[str, Any]:
    """:func:`quality` of ``scorer`` under the shared protocol: the
    validation set avoids the problems of ``pool`` (the RM's training pool)."""
    from race.builds.rm_samples import SampleSet, load_samples

    task = recipe.make_task()
    exclude = {p.expression for p, _ in pool or ()}
    n_val = recipe.n_val_problems or N_VAL_PROBLEMS
    val = load_samples(task, SampleSet("val", EVAL_POLICIES, n_val, recipe.temperature), exclude=exclude,
                       cache_dir=cache_dir)
    held = load_samples(task, SampleSet("heldout", EVAL_POLICIES, N_HELDOUT_PROBLEMS, recipe.temperature),
                        cache_dir=cache_dir)  # the module's globals, read at call time (tests shrink them)
    res = quality(scorer, recipe.kind, [(p, c) for p, c, _ in val["pairs"]], [(p, c) for p, c, _ in held["pairs"]],
                  groups=[name for _, _, name in held["pairs"]])
    return dict(res, policies=list(EVAL_POLICIES), heldout_problems=f"test split, {N_HELDOUT_PROBLEMS}",
                val_problems=f"train split outside the pool, {n_val}")

