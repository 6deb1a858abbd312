"""Learned reward models for the built-in task, trained by RACE itself and cached by recipe.

Two kinds, each on a tiny Qwen2-architecture backbone (``race.models.family`` dims, the
character tokenizer) with a small scoring head on top of the backbone's last hidden state:

- process RM (``prm-*``): ``Qwen2ForTokenClassification`` layout, head ``Linear(hidden, 2)``
  read at the STEP MARKERS of the completion -- every ``;`` (end of a step) and every
  ``.`` (end of the final answer) -- in ONE forward pass; ``p(step ok) = softmax[..., 1]``.
- outcome RM (``orm-*``): ``Qwen2ForSequenceClassification`` layout, head
  ``Linear(hidden, 1)`` read at the last token; ``p(correct) = sigmoid``.

The head runs only at the positions it is read at (the hidden states are gathered first),
so training and inference FLOPs are ``train_flops``/``reward_model_flops`` with the head
at exactly those positions.

Training data (:func:`make_example`): problems from the task's ``train`` split, each
with the reference worked solution (``solution_text``, about half the time) or a
programmatically corrupted one: a wrong intermediate result (later steps carry the error
forward or ignore it), a wrong operand or operator, a skipped or extra step, a wrong or
missing final answer, a truncation, or noise. Labels come from ``race.tasks.verify``:
a ``;`` marker gets the step's ``step_correct`` (local validity, error carried forward,
so a single slip is charged where it happens), the ``.`` closing the final answer gets
``correct`` (final answer == true answer), any other marker 0. The ORM label is
``correct``. Held-out evaluation uses the ``test`` split.

Backbones start from random init (``init="scratch"``, the default) or from the size's
warm start (``init="base"``: the warm start's recipe hash then enters the RM's hash).

Likelihood PRMs (``scoring="likelihood"``: ``prm-s``, ``prm-m``) are not trained here but
calibrated (:mod:`race.builds.rm_calibration`) on policy samples (:mod:`race.builds.rm_samples`);
a recipe with ``policies`` also gets its held-out quality on policy samples
(:func:`heldout_for`, :mod:`race.builds.rm_eval`) in ``info.json["data"]["heldout"]``.
A classifier recipe with ``policies`` and ``synthetic_frac < 1`` trains on a mix of
corruptions and the policy pool (:func:`batch_pairs`), ``balance`` weighting labels equally.

What the classifier RMs learn in ~30-50 s of CPU (measured, see ``race rm build``): structure, not
arithmetic. They reliably catch a final answer that differs from the last step's result
(AUC ~0.98), an unfinished trajectory, noise, and often a wrong operand/operator or an
extra step (AUC ~0.7-0.8), but NOT an arithmetic slip inside a step (AUC ~0.52): checking
``a+b=c`` takes a tiny model thousands of steps (longer training, base init, reversed
digits and dense per-digit labels were tried and moved that AUC by at most 0.07). Step
accuracy at threshold 0.5 is close to the majority rate. Treat them as weak, exploitable
feedback -- the setting where over-optimisation (``race.records.overoptimisation``) shows.

Cache: ``<cache>/rm/<name>-<recipe hash>/`` (safetensors, config.json, tokenizer,
``info.json``), written under a temporary name and renamed into place, reused when
present, rebuilt when the recipe (or ``race.rewards.rm_recipes.RM_VERSION``) changes -- the
same scheme as ``race.builds.warmstart``; where an RM lives and its ``info.json``
(:class:`~race.rewards.rm_recipes.RMInfo`) are :mod:`race.rewards.rm_recipes`. ``info.json`` records the RM's TRAINING FLOPs
(``race.accounting.train_flops`` per optimizer step over the padded batch: full
fine-tuning, head at the scored positions, ``race`` conventions), kept apart from any
run's budget, and its held-out step-level and outcome accuracy.
"""

from __future__ import annotations

from race.accounting.reward_kinds import reward_kind

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from race.accounting import train_flops
from race.builds.rm_data import make_dataset, marker_labels
from race.builds.rm_eval import auc, heldout_for
from race.builds.rm_samples import training_pool
from race.builds.store import build_or_reuse, publish
from race.builds.train import optimise
from race.builds.warmstart import build_base
from race.models.family import count_params, tiny_config_kwargs
from race.models.tokenizer import build_char_tokenizer
from race.rewards.hf import scorer_shape
from race.rewards.rm_encoding import MAX_LENGTH, encode, head_logits, positive_prob
from race.rewards.rm_recipes import RMInfo, RMRecipe, read_info, recipe_for, recipe_hash, rm_dir, rm_settings
from race.tasks.arith import END_MARK, FINAL_MARK, STEP_SEP, Problem, step_seed
from race.tasks.verify import verify


# -- the model ----------------------------------------------------------------------------------
def rm_config(recipe: RMRecipe, attn_implementation: str = "eager") -> Any:
    from transformers import Qwen2Config

    cfg = Qwen2Config(**tiny_config_kwargs(recipe.backbone), num_labels=recipe.num_labels)
    token = reward_kind(recipe.kind).classifier == "token"
    cfg.architectures = ["Qwen2ForTokenClassification" if token else "Qwen2ForSequenceClassification"]
    cfg.classifier_dropout = 0.0
    cfg._attn_implementation = attn_implementation
    return cfg


def build_rm_model(recipe: RMRecipe, attn_implementation: str = "eager", *,
                   cache_dir: str | os.PathLike[str] | None = None) -> tuple[Any, dict[str, Any]]:
    """A new RM and where its backbone came from. ``init="base"`` copies the backbone of
    the tiny size's warm start (built first when missing, see ``race.builds.warmstart``);
    the head is freshly initialised. Deterministic under ``recipe.seed`` (the global RNG
    is restored afterwards)."""
    import torch
    from transformers import Qwen2ForSequenceClassification, Qwen2ForTokenClassification

    token = reward_kind(recipe.kind).classifier == "token"
    cls = Qwen2ForTokenClassification if token else Qwen2ForSequenceClassification
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(recipe.seed)
        model = cls(rm_config(recipe, attn_implementation))
    finally:
        torch.random.set_rng_state(state)
    origin: dict[str, Any] = {"init": recipe.init}
    if recipe.init == "base":
        from safetensors.torch import load_file

        base = build_base(recipe.backbone, cache_dir=cache_dir)
        weights = load_file(str(Path(base.path) / "model.safetensors"))
        body = {k[len("model."):]: v for k, v in weights.items() if k.startswith("model.")}
        model.model.load_state_dict(body, strict=True)
        origin.update(base_path=base.path, base_recipe_hash=base.recipe_hash, base_sft_flops=base.sft_flops,
                      base_test_accuracy=base.test_accuracy)
    return model.float().eval(), origin


def rm_shape(model: Any, name: str = "rm") -> Any:
    """``ModelShape`` of an RM: the backbone from its config, the head = its score layer."""
    return scorer_shape(model, name)


# -- training and evaluation ---------------------------------------------------------------
def _loss(recipe: RMRecipe, logits: Any, labels: Any) -> Any:
    """Cross-entropy (PRM) or logistic loss (ORM); with ``recipe.balance`` each label's
    positions weigh ``n / (2 n_label)`` so wrong and right count equally in the batch."""
    import torch
    import torch.nn.functional as F

    weight = None
    if recipe.balance:
        n, n_pos = len(labels), int(labels.sum())
        weight = torch.where(labels == 1, n / (2 * max(1, n_pos)), n / (2 * max(1, n - n_pos)))
    if reward_kind(recipe.kind).per_step:
        per = F.cross_entropy(logits, labels, reduction="none")
    else:
        per = F.binary_cross_entropy_with_logits(logits[:, 0], labels.float(), reduction="none")
    return (per if weight is None else per * weight).mean()


def batch_pairs(recipe: RMRecipe, task: Any, pool: Sequence[tuple[Problem, str]] | None,
                step: int) -> list[tuple[Problem, str]]:
    """Step ``step``'s batch: ``round(batch_size * synthetic_frac)`` programmatic examples
    (:func:`race.builds.rm_data.make_dataset`, the recipe's ``correct_frac``) and the rest
    drawn uniformly, with replacement, from the policy-sample ``pool``."""
    import random

    n_syn = recipe.batch_size if not pool else round(recipe.batch_size * recipe.synthetic_frac)
    out = make_dataset(task, "train", n_syn, step_seed(recipe.seed, step), recipe.correct_frac) if n_syn else []
    if pool:
        rng = random.Random(f"race-rm-pool:{recipe.seed}:{step}")
        out.extend(pool[rng.randrange(len(pool))] for _ in range(recipe.batch_size - n_syn))
    return out


def _labels(recipe: RMRecipe, batch: dict[str, Any], pairs: Sequence[tuple[Problem, str]]) -> Any:
    import torch

    out: list[int] = []
    for (p, c), k in zip(pairs, batch["counts"]):
        lab = marker_labels(p, c) if reward_kind(recipe.kind).per_step else [int(verify(p, c).correct)]
        # markers cut by truncation of a long input are dropped from the end
        out.extend((lab + [0] * k)[:k])
    return torch.tensor(out, dtype=torch.long)


def train_rm(model: Any, tok: Any, recipe: RMRecipe, *, max_length: int = MAX_LENGTH,
             progress: Callable[[int, int, float], None] | None = None,
             pool: Sequence[tuple[Problem, str]] | None = None) -> dict[str, float]:
    """Train ``model`` in place on :func:`batch_pairs` (``pool``: the policy samples);
    returns token counts, FLOPs and the final loss."""
    shape = rm_shape(model)
    task = recipe.make_task()
    stats = dict(tokens_processed=0, real_tokens=0, scored_positions=0, train_flops=0)

    def loss_at(step: int) -> Any:
        pairs = batch_pairs(recipe, task, pool, step)
        batch = encode(tok, [p.prompt for p, _ in pairs], [c for _, c in pairs], recipe.kind, max_length=max_length)
        labels = _labels(recipe, batch, pairs)
        B, L = batch["input_ids"].shape
        stats["tokens_processed"] += B * L
        stats["real_tokens"] += int(batch["attention_mask"].sum())
        stats["scored_positions"] += len(labels)
        stats["train_flops"] += train_flops(shape, [L] * B, logits=list(batch["counts"]))
        return _loss(recipe, head_logits(model, batch), labels)

    tail = optimise(model, recipe, loss_at, progress)
    return dict(stats, final_loss=tail)


def evaluate_rm(model: Any, tok: Any, recipe: RMRecipe, n: int | None = None, *, split: str = "test",
                batch_size: int = 128, max_length: int = MAX_LENGTH) -> dict[str, float]:
    """Held-out accuracy at threshold 0.5 on the recipe's data mixture (``test`` split).

    ``step_accuracy`` (prm): over ``;`` markers of steps; ``bad_step_recall``: fraction of
    invalid steps flagged; ``outcome_accuracy``: the trajectory score (PRM: min over its
    markers, 0 when it has none; ORM: its score) against final-answer correctness."""
    import torch

    task = recipe.make_task()
    data = make_dataset(task, split, n or recipe.n_eval, seed=12345, correct_frac=0.5)
    step_hits = step_n = bad_hits = bad_n = out_hits = 0
    step_pairs: list[tuple[float, int]] = []
    out_pairs: list[tuple[float, int]] = []
    with torch.no_grad():
        for i in range(0, len(data), batch_size):
            chunk = data[i: i + batch_size]
            batch = encode(tok, [p.prompt for p, _ in chunk], [c for _, c in chunk], recipe.kind, max_length=max_length)
            probs = positive_prob(head_logits(model, batch)).tolist()
            at = 0
            for (p, c), k in zip(chunk, batch["counts"]):
                row, at = probs[at: at + k], at + k
                correct = verify(p, c).correct
                if reward_kind(recipe.kind).per_step:
                    labs = marker_labels(p, c)[:k]
                    hash_at = c.find(FINAL_MARK)
                    n_steps = sum(1 for j, ch in enumerate(c) if ch == STEP_SEP and (hash_at < 0 or j < hash_at))
                    for s, (pr, lab) in enumerate(zip(row, labs)):
                        if s < n_steps:
                            step_hits += int((pr >= 0.5) == bool(lab))
                            step_n += 1
                            step_pairs.append((pr, int(lab)))
                            if not lab:
                                bad_n += 1
                                bad_hits += int(pr < 0.5)
                    finished = any(ch == END_MARK for ch in c[hash_at:]) if hash_at >= 0 else False
                    score = min(row + ([] if finished else [0.0])) if row else 0.0
                else:
                    score = row[0]
                out_hits += int((score >= 0.5) == correct)
                out_pairs.append((score, int(correct)))
    res = dict(outcome_accuracy=out_hits / max(1, len(data)), outcome_auc=auc(out_pairs), n_eval=len(data))
    if reward_kind(recipe.kind).per_step:
        res.update(step_accuracy=step_hits / max(1, step_n), bad_step_recall=bad_hits / max(1, bad_n),
                   step_auc=auc(step_pairs), n_steps=step_n)
    return res


# -- cache ----------------------------------------------------------------------------------
def _round(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


def build_rm(name: str, *, cache_dir: str | os.PathLike[str] | None = None, force: bool = False,
             recipe: RMRecipe | None = None, progress: Callable[[int, int, float], None] | None = None) -> RMInfo:
    """Train reward model ``name`` (or reuse its cached checkpoint) and describe it.
    ``recipe`` overrides the registered one (tests, experiments)."""
    recipe = recipe or recipe_for(name)
    final = rm_dir(name, cache_dir=cache_dir, recipe=recipe)
    return build_or_reuse(final, read_info, lambda: _train(name, recipe, final, cache_dir, progress), force)


def _train(name: str, recipe: RMRecipe, final: Path, cache_dir: str | os.PathLike[str] | None,
           progress: Callable[[int, int, float], None] | None) -> RMInfo:
    import json

    pool, data = training_pool(recipe, cache_dir=cache_dir)  # sampled before the clock starts
    if recipe.scoring == "likelihood":
        from dataclasses import replace

        from race.builds.rm_calibration import fit_likelihood

        t0, c0 = time.perf_counter(), time.process_time()
        fit = fit_likelihood(recipe, pool, cache_dir=cache_dir)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        model, tok, origin, stats = fit["model"], fit["tokenizer"], fit["origin"], fit["stats"]
        saved, shape = fit["lm"], replace(fit["shape"], name=name)
        settings = dict(rm_settings(recipe, MAX_LENGTH), calibration=origin["calibration"])
        n_params = count_params(saved.parameters())
    else:
        tok = build_char_tokenizer()
        model, origin = build_rm_model(recipe, attn_implementation="sdpa", cache_dir=cache_dir)
        t0, c0 = time.perf_counter(), time.process_time()  # the warm start's build is not counted
        stats = train_rm(model, tok, recipe, progress=progress, pool=pool)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        saved, shape, settings = model, rm_shape(model, name), rm_settings(recipe, MAX_LENGTH)
        n_params = count_params(model.parameters())
    if progress is not None and recipe.scoring == "likelihood":
        progress(recipe.steps, recipe.steps, stats["final_loss"])
    ev = evaluate_rm(model, tok, recipe)
    if recipe.policies:
        from race.rewards.rm_encoding import Scorer

        scorer = Scorer(model, tok, shape, None, None, MAX_LENGTH)
        if recipe.scoring == "likelihood":
            scorer.head_positions = "all"  # type: ignore[attr-defined]
        held = heldout_for(recipe, scorer, pool, cache_dir=cache_dir)
        if "by_group" in held:
            held["by_group"] = {g: _round(v) for g, v in held["by_group"].items()}
        data["heldout"] = _round(held)
    info = RMInfo(name=name, kind=recipe.kind, path=str(final), recipe=dataclasses.asdict(recipe),
                  recipe_hash=recipe_hash(name, recipe), total_params=n_params,
                  shape=shape.to_dict(), steps=recipe.steps,
                  tokens_processed=int(stats["tokens_processed"]), real_tokens=int(stats["real_tokens"]),
                  scored_positions=int(stats["scored_positions"]), train_flops=int(stats["train_flops"]),
                  flops_conventions="race", seconds=round(seconds, 2), final_loss=round(stats["final_loss"], 5),
                  eval=_round(ev), origin=origin, cpu_seconds=round(cpu_seconds, 2), data=data)
    saved.config._attn_implementation = "eager"

    def write(tmp: Path) -> None:
        saved.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "race_rm.json").write_text(json.dumps(settings, indent=2) + "\n")

    publish(final, info.to_json(), write)
    return info
