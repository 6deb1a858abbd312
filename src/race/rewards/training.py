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

What these RMs learn in ~30-50 s of CPU (measured, see ``race rm build``): structure, not
arithmetic. They reliably catch a final answer that differs from the last step's result
(AUC ~0.98), an unfinished trajectory, noise, and often a wrong operand/operator or an
extra step (AUC ~0.7-0.8), but NOT an arithmetic slip inside a step (AUC ~0.52): checking
``a+b=c`` takes a tiny model thousands of steps (longer training, base init, reversed
digits and dense per-digit labels were tried and moved that AUC by at most 0.07). Step
accuracy at threshold 0.5 is close to the majority rate. Treat them as weak, exploitable
feedback -- the setting where over-optimisation (``race.rewards.diagnostics``) shows.

Cache: ``<cache>/rm/<name>-<recipe hash>/`` (safetensors, config.json, tokenizer,
``info.json``), written under a temporary name and renamed into place, reused when
present, rebuilt when the recipe (or this module's :data:`RM_VERSION`) changes -- the
same scheme as ``race.models.warmstart``. ``info.json`` records the RM's TRAINING FLOPs
(``race.accounting.train_flops`` per optimizer step over the padded batch: full
fine-tuning, head at the scored positions, ``race`` conventions), kept apart from any
run's budget, and its held-out step-level and outcome accuracy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from race.models.family import tiny_config_kwargs
from race.models.loading import cache_dir as _cache_root
from race.models.tokenizer import ALPHABET, SPECIAL_TOKENS
from race.models.warmstart import RecipeSchedule
from race.tasks.arith import END_MARK, FINAL_MARK, STEP_SEP, ArithTask, Problem, solution_text
from race.tasks.verify import verify

#: Bumped when the data, model or training code changes in a way the recipe does not capture.
RM_VERSION = 1
#: Most markers a PRM scores per sequence (a real solution has n_ops + 1 <= 65).
MAX_MARKERS = 65
MARKERS = (STEP_SEP, END_MARK)
#: Tokens a RACE-built RM reads at most (prompt + completion).
MAX_LENGTH = 256


@dataclass(frozen=True)
class RMRecipe(RecipeSchedule):
    """How one reward model is trained (every field enters the cache hash)."""

    kind: str  # "prm" | "orm"
    backbone: str  # tiny family size whose dims the RM uses
    steps: int = 400
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    seed: int = 0
    correct_frac: float = 0.4
    task: dict[str, Any] = field(default_factory=lambda: ArithTask().describe())
    n_eval: int = 400
    init: str = "scratch"  # "scratch": random init; "base": start from the backbone's warm start

    def __post_init__(self) -> None:
        if self.kind not in ("prm", "orm"):
            raise ValueError(f"RMRecipe.kind must be 'prm' or 'orm', got {self.kind!r}")
        if self.init not in ("base", "scratch"):
            raise ValueError(f"RMRecipe.init must be 'base' or 'scratch', got {self.init!r}")
        tiny_config_kwargs(self.backbone)  # raises KeyError naming the family
        self._check_schedule()

    @property
    def num_labels(self) -> int:
        return 2 if self.kind == "prm" else 1


#: The reward models RACE builds (``race rm build``): two sizes per kind, so feedback
#: strength is an axis of the grid. Sized to train in well under a minute each on 2 CPU
#: cores (the tiny-s dims run ~2.5x slower per step, hence fewer steps).
RM_RECIPES: dict[str, RMRecipe] = {
    "prm-xs": RMRecipe("prm", "tiny-xs", steps=400),
    "prm-s": RMRecipe("prm", "tiny-s", steps=300),
    "orm-xs": RMRecipe("orm", "tiny-xs", steps=400),
    "orm-s": RMRecipe("orm", "tiny-s", steps=300),
}


def known_rms() -> list[str]:
    return list(RM_RECIPES)


def recipe_for(name: str) -> RMRecipe:
    if name not in RM_RECIPES:
        raise KeyError(f"unknown reward model {name!r}; RACE builds: {', '.join(RM_RECIPES)} "
                       "(or pass a local HF directory as orm:/path or prm:/path)")
    return RM_RECIPES[name]


# -- data ------------------------------------------------------------------------------
def _render(steps: Sequence[tuple[int, str, int, int]], final: int | None) -> str:
    body = "".join(f"{a}{op}{b}={c}{STEP_SEP}" for a, op, b, c in steps)
    return body + ("" if final is None else f"{FINAL_MARK}{final}{END_MARK}")


def _delta(rng: random.Random) -> int:
    d = rng.choice([1, 2, 10, rng.randint(1, 20)])
    return d if rng.random() < 0.5 else -d


def _chain(problem: Problem, k: int, a_k: int, op_k: str, b_k: int, c_k: int,
           carry: bool) -> list[tuple[int, str, int, int]]:
    """Steps with step ``k`` replaced; later steps continue from the written value
    (``carry``) or from the true running value (then their first operand is wrong)."""
    steps = [tuple(s) for s in problem.steps]
    steps[k] = (a_k, op_k, b_k, c_k)
    cur = c_k
    for i in range(k + 1, len(steps)):
        a, op, b, c = steps[i]
        a = cur if carry else a
        c = a + b if op == "+" else a - b
        steps[i] = (a, op, b, c)
        cur = c
    return steps  # type: ignore[return-value]


CORRUPTIONS = ("wrong_result", "wrong_operand", "wrong_operator", "skip_step", "extra_step", "wrong_final",
               "no_final", "truncated", "noise")


def corrupt(problem: Problem, rng: random.Random, kind: str | None = None) -> str:
    """A plausible wrong completion for ``problem`` (see module docstring)."""
    kind = kind or rng.choice(CORRUPTIONS)
    steps, n = list(problem.steps), len(problem.steps)
    k = rng.randrange(n)
    a, op, b, c = steps[k]
    if kind == "wrong_result":
        new = _chain(problem, k, a, op, b, c + _delta(rng), carry=rng.random() < 0.6)
        final = new[-1][3] if rng.random() < 0.7 else problem.answer
        return _render(new, final)
    if kind == "wrong_operand":
        d = _delta(rng)
        b2 = b + d if b + d >= 0 else b - d
        new = _chain(problem, k, a, op, b2, a + b2 if op == "+" else a - b2, carry=True)
        return _render(new, new[-1][3])
    if kind == "wrong_operator":
        op2 = "-" if op == "+" else "+"
        new = _chain(problem, k, a, op2, b, a + b if op2 == "+" else a - b, carry=True)
        return _render(new, new[-1][3])
    if kind == "skip_step" and n > 1:
        del steps[k]  # a later step then fails to chain; a skipped last step leaves the answer wrong
        return _render(steps, steps[-1][3] if k == n - 1 or rng.random() < 0.5 else problem.answer)
    if kind == "extra_step":
        last = steps[-1][3]
        x = rng.randint(0, 20)
        steps.insert(rng.randint(0, n), (last, "+", x, last + x))
        return _render(steps, problem.answer if rng.random() < 0.5 else last + x)
    if kind == "wrong_final":
        return _render(steps, problem.answer + _delta(rng))
    if kind == "no_final":
        return _render(steps, None) + rng.choice(["", "#", f"#{problem.answer}", "."])
    if kind == "truncated":
        text = solution_text(problem) if rng.random() < 0.5 else corrupt(problem, rng, "wrong_result")
        return text[: rng.randint(1, len(text) - 1)]
    alphabet = "0123456789+-=;#."
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))


def marker_labels(problem: Problem, completion: str) -> list[int]:
    """0/1 label per marker (``;`` or ``.``) of ``completion``, in order (capped at
    :data:`MAX_MARKERS`): step validity for ``;`` before the final mark, final-answer
    correctness for the ``.`` that closes the answer, 0 for any other marker."""
    v = verify(problem, completion)
    hash_at = completion.find(FINAL_MARK)
    answer_end = -1
    if hash_at >= 0 and v.answer is not None:
        answer_end = completion.find(END_MARK, hash_at)
    labels: list[int] = []
    step = 0
    for j, ch in enumerate(completion):
        if ch not in MARKERS:
            continue
        if ch == STEP_SEP and (hash_at < 0 or j < hash_at):
            labels.append(int(step < len(v.step_correct) and v.step_correct[step]))
            step += 1
        elif ch == END_MARK and j == answer_end:
            labels.append(int(v.correct))
        else:
            labels.append(0)
        if len(labels) >= MAX_MARKERS:
            break
    return labels


def make_example(problem: Problem, rng: random.Random, correct_frac: float) -> str:
    return solution_text(problem) if rng.random() < correct_frac else corrupt(problem, rng)


def make_dataset(task: ArithTask, split: str, n: int, seed: int, correct_frac: float) -> list[tuple[Problem, str]]:
    rng = random.Random(f"race-rm:{split}:{seed}")
    return [(p, make_example(p, rng, correct_frac)) for p in task.problems(split, n, seed=seed)]


# -- encoding and the scoring forward ------------------------------------------------------
def marker_ids(tok: Any) -> list[int]:
    return [tok.convert_tokens_to_ids(m) for m in MARKERS]


def encode(tok: Any, prompts: Sequence[str], completions: Sequence[str], kind: str, *, max_length: int,
           markers: Sequence[int] | None = None) -> dict[str, Any]:
    """Left-padded batch of ``prompt + completion`` in the RM's tokenisation, cut to
    ``max_length`` tokens (the prompt end and the completion start are kept), and the
    positions the head reads: the marker tokens of the completion (``prm``, at most
    :data:`MAX_MARKERS` per row) or the last token (``orm``).

    Returns ``input_ids``/``attention_mask`` [B, L], ``position_ids`` [B, L] (counting
    real tokens only, so left padding does not shift positions), ``rows``/``cols`` [K]
    (the head positions), ``counts`` (head positions per row) and ``completion_start``."""
    import torch

    p_ids = tok(list(prompts), add_special_tokens=False)["input_ids"]
    c_ids = tok(list(completions), add_special_tokens=False)["input_ids"]
    seqs, starts = [], []
    for p, c in zip(p_ids, c_ids):
        p = p[-max(1, max_length // 2):] if len(p) + len(c) > max_length else p
        s = (p + c)[:max_length]
        seqs.append(s if s else [tok.pad_token_id])
        starts.append(len(p))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    rows: list[int] = []
    cols: list[int] = []
    counts: list[int] = []
    mset = set(markers if markers is not None else marker_ids(tok))
    for i, s in enumerate(seqs):
        off = width - len(s)
        ids[i, off:] = torch.tensor(s)
        mask[i, off:] = 1
        if kind == "prm":
            pos = [off + j for j in range(starts[i], len(s)) if s[j] in mset][:MAX_MARKERS]
        else:
            pos = [width - 1]
        rows.extend([i] * len(pos))
        cols.extend(pos)
        counts.append(len(pos))
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return dict(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                rows=torch.tensor(rows, dtype=torch.long),
                cols=torch.tensor(cols, dtype=torch.long), counts=counts, completion_start=starts)


def head_logits(model: Any, batch: dict[str, Any]) -> Any:
    """One forward of the backbone over the padded batch, then the scoring head at the
    gathered positions only: logits [K, num_labels]."""
    body = model.base_model
    hidden = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  position_ids=batch["position_ids"], use_cache=False).last_hidden_state  # [B, L, h]
    return model.score(hidden[batch["rows"], batch["cols"]])  # [K, C]


def positive_prob(logits: Any) -> Any:
    """p(label 1) per head position: softmax over 2 classes, sigmoid of 1 logit."""
    import torch

    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[..., 0].float())
    return torch.softmax(logits.float(), dim=-1)[..., 1]


# -- the model ----------------------------------------------------------------------------------
def rm_config(recipe: RMRecipe, attn_implementation: str = "eager") -> Any:
    from transformers import Qwen2Config

    cfg = Qwen2Config(**tiny_config_kwargs(recipe.backbone), num_labels=recipe.num_labels)
    cfg.architectures = ["Qwen2ForTokenClassification" if recipe.kind == "prm" else "Qwen2ForSequenceClassification"]
    cfg.classifier_dropout = 0.0
    cfg._attn_implementation = attn_implementation
    return cfg


def build_rm_model(recipe: RMRecipe, attn_implementation: str = "eager", *,
                   cache_dir: str | os.PathLike[str] | None = None) -> tuple[Any, dict[str, Any]]:
    """A new RM and where its backbone came from. ``init="base"`` copies the backbone of
    the tiny size's warm start (built first when missing, see ``race.models.warmstart``);
    the head is freshly initialised. Deterministic under ``recipe.seed`` (the global RNG
    is restored afterwards)."""
    import torch
    from transformers import Qwen2ForSequenceClassification, Qwen2ForTokenClassification

    cls = Qwen2ForTokenClassification if recipe.kind == "prm" else Qwen2ForSequenceClassification
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(recipe.seed)
        model = cls(rm_config(recipe, attn_implementation))
    finally:
        torch.random.set_rng_state(state)
    origin: dict[str, Any] = {"init": recipe.init}
    if recipe.init == "base":
        from safetensors.torch import load_file

        from race.models.warmstart import build_base

        base = build_base(recipe.backbone, cache_dir=cache_dir)
        weights = load_file(str(Path(base.path) / "model.safetensors"))
        body = {k[len("model."):]: v for k, v in weights.items() if k.startswith("model.")}
        model.model.load_state_dict(body, strict=True)
        origin.update(base_path=base.path, base_recipe_hash=base.recipe_hash, base_sft_flops=base.sft_flops,
                      base_test_accuracy=base.test_accuracy)
    return model.float().eval(), origin


def rm_shape(model: Any, name: str = "rm") -> Any:
    """``ModelShape`` of an RM: the backbone from its config, the head = its score layer."""
    from race.rewards.hf import scorer_shape

    return scorer_shape(model, name)


def shape_of_rm(name: str) -> Any:
    """``ModelShape`` of RACE's RM ``name`` from its recipe alone (no torch, nothing
    built): for ``race flops --reward prm:prm-s`` and planning."""
    from dataclasses import replace

    from race.accounting import ModelShape

    recipe = recipe_for(name)
    base = ModelShape.from_hf_config(dict(tiny_config_kwargs(recipe.backbone), model_type="qwen2"), name=name)
    return replace(base, head=((base.hidden, recipe.num_labels),), head_bias=recipe.kind == "prm",
                   tie_embeddings=False)


def rm_settings(recipe: RMRecipe, max_length: int = MAX_LENGTH) -> dict[str, Any]:
    """``race_rm.json`` of a RACE-built RM (how ``race.rewards.hf`` reads it)."""
    d: dict[str, Any] = dict(kind=recipe.kind, chat_template=False, max_length=max_length)
    if recipe.kind == "prm":
        d.update(markers=list(MARKERS), final_marker=END_MARK)
    return d


# -- training and evaluation ---------------------------------------------------------------
def _loss(recipe: RMRecipe, logits: Any, labels: Any) -> Any:
    import torch.nn.functional as F

    if recipe.kind == "prm":
        return F.cross_entropy(logits, labels)
    return F.binary_cross_entropy_with_logits(logits[:, 0], labels.float())


def _labels(recipe: RMRecipe, batch: dict[str, Any], pairs: Sequence[tuple[Problem, str]]) -> Any:
    import torch

    out: list[int] = []
    for (p, c), k in zip(pairs, batch["counts"]):
        lab = marker_labels(p, c) if recipe.kind == "prm" else [int(verify(p, c).correct)]
        # markers cut by truncation of a long input are dropped from the end
        out.extend((lab + [0] * k)[:k])
    return torch.tensor(out, dtype=torch.long)


def train_rm(model: Any, tok: Any, recipe: RMRecipe, *, max_length: int = MAX_LENGTH,
             progress: Callable[[int, int, float], None] | None = None) -> dict[str, float]:
    """Train ``model`` in place; returns token counts, FLOPs and the final loss."""
    import torch

    from race.accounting import train_flops

    shape = rm_shape(model)
    task = recipe.make_task()
    torch.manual_seed(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, betas=recipe.betas,
                            weight_decay=recipe.weight_decay)
    model.train()
    tokens = real = scored = flops = 0
    tail, tail_n = 0.0, max(1, recipe.steps // 20)
    for step in range(recipe.steps):
        pairs = make_dataset(task, "train", recipe.batch_size, recipe.seed * 1_000_003 + step, recipe.correct_frac)
        batch = encode(tok, [p.prompt for p, _ in pairs], [c for _, c in pairs], recipe.kind, max_length=max_length)
        labels = _labels(recipe, batch, pairs)
        for g in opt.param_groups:
            g["lr"] = recipe.lr_at(step)
        loss = _loss(recipe, head_logits(model, batch), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        opt.step()
        B, L = batch["input_ids"].shape
        tokens += B * L
        real += int(batch["attention_mask"].sum())
        scored += len(labels)
        flops += train_flops(shape, [L] * B, logits=list(batch["counts"]))
        value = float(loss.detach())
        if step >= recipe.steps - tail_n:
            tail += value / tail_n
        if progress is not None:
            progress(step + 1, recipe.steps, value)
    model.eval()
    return dict(tokens_processed=tokens, real_tokens=real, scored_positions=scored, train_flops=flops,
                final_loss=tail)


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
                if recipe.kind == "prm":
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
    if recipe.kind == "prm":
        res.update(step_accuracy=step_hits / max(1, step_n), bad_step_recall=bad_hits / max(1, bad_n),
                   step_auc=auc(step_pairs), n_steps=step_n)
    return res


def auc(pairs: Sequence[tuple[float, int]]) -> float:
    """Area under the ROC curve of (score, 0/1 label) pairs: the chance that a random
    positive outscores a random negative (ties count half); 0.5 when one class is absent.
    What matters for GRPO, which only compares rewards within a group."""
    pos = sorted(s for s, y in pairs if y)
    neg = sorted(s for s, y in pairs if not y)
    if not pos or not neg:
        return 0.5
    import bisect

    wins = sum(bisect.bisect_left(neg, s) + 0.5 * (bisect.bisect_right(neg, s) - bisect.bisect_left(neg, s))
               for s in pos)
    return wins / (len(pos) * len(neg))


# -- cache ----------------------------------------------------------------------------------
@dataclass
class RMInfo:
    """What ``info.json`` holds about a built reward model (``reused`` is not stored)."""

    name: str
    kind: str
    path: str
    recipe: dict[str, Any]
    recipe_hash: str
    total_params: int
    shape: dict[str, Any]
    steps: int
    tokens_processed: int
    real_tokens: int
    scored_positions: int
    train_flops: int
    flops_conventions: str
    seconds: float
    final_loss: float
    eval: dict[str, float]
    origin: dict[str, Any] = field(default_factory=dict)
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("reused")
        return d


def recipe_hash(name: str, recipe: RMRecipe | None = None) -> str:
    """12 hex digits over the recipe, the backbone config, the tokenizer alphabet and (for
    ``init="base"``) the warm start's own recipe hash, so a new warm start rebuilds the RM."""
    recipe = recipe or recipe_for(name)
    base = ""
    if recipe.init == "base":
        from race.models.warmstart import recipe_hash as base_hash

        base = base_hash(recipe.backbone)
    blob = json.dumps(dict(version=RM_VERSION, name=name, recipe=dataclasses.asdict(recipe), base=base,
                           config=tiny_config_kwargs(recipe.backbone), alphabet="".join(ALPHABET),
                           special=SPECIAL_TOKENS), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def rm_dir(name: str, *, cache_dir: str | os.PathLike[str] | None = None, recipe: RMRecipe | None = None) -> Path:
    """Directory of reward model ``name`` under ``recipe`` (default :data:`RM_RECIPES`)."""
    return _cache_root(cache_dir) / "rm" / f"{name}-{recipe_hash(name, recipe)}"


def read_info(path: Path) -> RMInfo | None:
    try:
        data = json.loads((Path(path) / "info.json").read_text())
        if not (Path(path) / "model.safetensors").is_file():
            return None
        return RMInfo(**data, reused=True)
    except (OSError, ValueError, TypeError):
        return None


def build_rm(name: str, *, cache_dir: str | os.PathLike[str] | None = None, force: bool = False,
             recipe: RMRecipe | None = None, progress: Callable[[int, int, float], None] | None = None) -> RMInfo:
    """Train reward model ``name`` (or reuse its cached checkpoint) and describe it.
    ``recipe`` overrides the registered one (tests, experiments)."""
    recipe = recipe or recipe_for(name)
    final = rm_dir(name, cache_dir=cache_dir, recipe=recipe)
    if not force:
        info = read_info(final)
        if info is not None:
            return info
    from race.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model, origin = build_rm_model(recipe, attn_implementation="sdpa", cache_dir=cache_dir)
    t0 = time.perf_counter()  # the warm start's own build is not the RM's training time
    stats = train_rm(model, tok, recipe, progress=progress)
    seconds = time.perf_counter() - t0
    ev = evaluate_rm(model, tok, recipe)
    info = RMInfo(name=name, kind=recipe.kind, path=str(final), recipe=dataclasses.asdict(recipe),
                  recipe_hash=recipe_hash(name, recipe), total_params=sum(p.numel() for p in model.parameters()),
                  shape=rm_shape(model, name).to_dict(), steps=recipe.steps,
                  tokens_processed=int(stats["tokens_processed"]), real_tokens=int(stats["real_tokens"]),
                  scored_positions=int(stats["scored_positions"]), train_flops=int(stats["train_flops"]),
                  flops_conventions="race", seconds=round(seconds, 2), final_loss=round(stats["final_loss"], 5),
                  eval={k: (round(v, 4) if isinstance(v, float) else v) for k, v in ev.items()}, origin=origin)
    model.config._attn_implementation = "eager"
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "info.json").write_text(json.dumps(info.to_json(), indent=2, sort_keys=True) + "\n")
    (tmp / "race_rm.json").write_text(json.dumps(rm_settings(recipe, MAX_LENGTH), indent=2) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return info


def build_rms(names: Sequence[str] | None = None, *, cache_dir: str | os.PathLike[str] | None = None,
              force: bool = False, progress: Callable[[str, int, int, float], None] | None = None,
              recipes: dict[str, RMRecipe] | None = None) -> list[RMInfo]:
    """:func:`build_rm` for each name (default: every registered RM)."""
    out = []
    for name in names or list(RM_RECIPES):
        cb = (lambda s, n, loss, _name=name: progress(_name, s, n, loss)) if progress else None
        out.append(build_rm(name, cache_dir=cache_dir, force=force, progress=cb,
                            recipe=(recipes or {}).get(name)))
    return out


def resolve_rm(name: str, *, cache_dir: str | os.PathLike[str] | None = None, build_missing: bool = True,
               recipe: RMRecipe | None = None) -> Path:
    """Directory of the built RM ``name``; builds it when missing and ``build_missing``
    (about half a minute), else raises ``FileNotFoundError`` saying to run ``race rm build``."""
    recipe = recipe or recipe_for(name)
    path = rm_dir(name, cache_dir=cache_dir, recipe=recipe)
    if read_info(path) is None:
        if not build_missing:
            raise FileNotFoundError(f"reward model {name!r} is not built (no checkpoint at {path}): run "
                                    f"`race rm build --names {name}` first")
        path = Path(build_rm(name, cache_dir=cache_dir, recipe=recipe).path)
    return path
