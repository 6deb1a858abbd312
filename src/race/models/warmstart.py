"""Warm-start (SFT) the tiny family on worked solutions, cached by recipe hash.

GRPO needs a policy that already solves some problems (a group whose rewards are all 0
carries no signal), but not all (then nothing is left to learn). :func:`build_base`
supervised-fine-tunes a tiny size on ``prompt -> worked solution + <eos>`` pairs from the
train split of the built-in arithmetic task with ONE recipe for every size: AdamW,
linear warmup then cosine decay, batch 32, and the SAME number of optimizer steps for
every size. docs/design.md section 4: fixing the step count (rather than the wall-clock time)
ranks bigger models stronger, which is the ordering the pilot grid should start from.
The loss is on completion tokens only (prompt tokens are random draws: nothing to learn).

Checkpoints go to ``<cache>/base/<name>-<recipe hash>/`` (safetensors + tokenizer +
``info.json``); the hash covers the recipe, the size's config and the tokenizer
alphabet, so a changed recipe builds a new directory and an unchanged one is reused.
Directories are written under a temporary name and renamed into place, so concurrent
builders never see half a checkpoint.

Calibration (DEFAULT_RECIPE: 500 steps x batch 32, operands 0-19, 2-4 operations; greedy
accuracy on 500 test / 200 hard (5-operation) problems; ``race base build --threads 1``
on a shared 2-core CPU; SFT seconds exclude evaluation)::

    size     non-emb   SFT s   test   hard
    tiny-xs   92,976      61  0.126  0.070
    tiny-s   293,200      76  0.288  0.150
    tiny-m   854,656     119  0.584  0.160
    tiny-l 3,151,552     366  0.602  0.175

With ``--threads 2`` on an idle machine the three smallest took 35/43/76 s (2 min 50 s
for the whole command) and reached 0.100/0.332/0.610: results are deterministic for a
given seed AND torch thread count (``info.json`` records the thread count), and vary by
a few points across thread counts. Operands 0-49 needed ~1,000 steps for similar
numbers; a 600-step schedule at 0-19 put tiny-s at 0.57 already (and tiny-m at 0.77
after 600 of 800 steps), leaving the larger sizes little room for RL.

FLOPs: ``info.json`` records the tokens processed (padded, i.e. what executed), the
parameter counts, and ``sft_flops``: ``race.accounting.train_flops`` (full fine-tuning,
RACE conventions: causal attention, logits at every position) summed over the padded
batch of every optimizer step, i.e. what the warm start executed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from race.accounting import train_flops
from race.builds.cache import ArtefactCache, build_each, recipe_digest
from race.builds.recipe import RecipeSchedule
from race.builds.train import optimise
from race.models.family import build_tiny_model, lm_head_params, non_embedding_params, tiny_config_kwargs
from race.models.refs import model_shape
from race.models.tokenizer import ALPHABET, SPECIAL_TOKENS, build_char_tokenizer
from race.tasks.arith import ArithTask, Problem, solution_text, step_seed
from race.tasks.verify import verify

#: Bumped when the training code changes in a way the recipe fields do not capture.
WARMSTART_VERSION = 1
CACHE = ArtefactCache("base")


@dataclass(frozen=True)
class SFTRecipe(RecipeSchedule):
    """The one warm-start recipe shared by every size (all fields enter the hash)."""

    steps: int = 500
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    seed: int = 0
    task: dict[str, Any] = field(default_factory=lambda: ArithTask().describe())
    n_eval_test: int = 500
    n_eval_hard: int = 200
    #: ``None``: every size trains ``steps`` steps. A size name: every size trains for the
    #: SFT FLOPs that ``steps`` steps of THAT size cost (:meth:`steps_for`), so smaller
    #: sizes take more steps (warm starts comparable at equal compute).
    equal_flops_to: str | None = None

    def __post_init__(self) -> None:
        self._check_schedule()

    def steps_for(self, name: str) -> int:
        """Optimizer steps of size ``name``: ``steps``, or with ``equal_flops_to = ref``
        round(steps x F(ref) / F(name)), F = ``train_flops`` of one batch of
        ``batch_size`` sequences at the task's mean prompt + solution length (the ratio
        barely depends on that length)."""
        if self.equal_flops_to is None or self.equal_flops_to == name:
            return self.steps
        from race.models.refs import tiny_shape

        task = self.make_task()
        sample = task.problems("train", 64, seed=0)
        length = round(sum(len(p.prompt) + len(solution_text(p)) + 1 for p in sample) / len(sample))
        ref, own = (train_flops(tiny_shape(n), [length] * self.batch_size) for n in (self.equal_flops_to, name))
        return max(1, round(self.steps * ref / own))

    def for_size(self, name: str) -> "SFTRecipe":
        """This recipe with the steps of size ``name`` (what :func:`sft` runs)."""
        n = self.steps_for(name)
        return self if n == self.steps else dataclasses.replace(self, steps=n, equal_flops_to=None)


DEFAULT_RECIPE = SFTRecipe()


@dataclass
class BaseInfo:
    """What ``info.json`` holds about a warm-start checkpoint. ``seconds`` is the SFT
    wall time (model build + training), ``eval_seconds`` the greedy evaluation after it;
    ``reused`` is not stored: True when this call found the checkpoint instead of
    training it."""

    name: str
    path: str
    recipe: dict[str, Any]
    recipe_hash: str
    non_embedding_params: int
    lm_head_params: int
    total_params: int
    steps: int
    tokens_processed: int
    real_tokens: int
    loss_tokens: int
    sft_flops: float
    seconds: float
    final_loss: float
    test_accuracy: float
    hard_accuracy: float
    config: dict[str, Any] = field(default_factory=dict)
    eval_seconds: float = 0.0
    torch_threads: int = 0
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("reused")
        return d


def _recipe(recipe: SFTRecipe | None) -> SFTRecipe:
    # resolved at call time, so swapping the module's DEFAULT_RECIPE (tests) takes effect
    return DEFAULT_RECIPE if recipe is None else recipe


def recipe_hash(name: str, recipe: SFTRecipe | None = None) -> str:
    """12 hex digits over the recipe, the size's config and the tokenizer alphabet."""
    recipe = _recipe(recipe)
    fields = dataclasses.asdict(recipe)
    if fields["equal_flops_to"] is None:  # added later: recipes without it keep their hashes
        del fields["equal_flops_to"]
    return recipe_digest(dict(version=WARMSTART_VERSION, recipe=fields,
                              config=tiny_config_kwargs(name), alphabet="".join(ALPHABET), special=SPECIAL_TOKENS))


def base_dir(name: str, *, cache_dir: str | os.PathLike[str] | None = None,
             recipe: SFTRecipe | None = None) -> Path:
    """Directory of the warm start of ``name`` under ``recipe`` (default
    :data:`DEFAULT_RECIPE`)."""
    return CACHE.directory(name, recipe_hash(name, recipe), cache_dir)


def _batch_encoder(tok: Any) -> Callable[[Sequence[Problem]], tuple[Any, Any, Any]]:
    """A function mapping problems to right-padded ``input_ids`` / ``attention_mask`` /
    ``labels`` ([B, T] each; labels -100 on prompt and padding positions). A character
    tokenizer is encoded by direct vocabulary lookup (one id per character): a tokenizer
    call per batch would otherwise rival the tiny models' step time."""
    import torch

    vocab, unk, pad, eos = tok.get_vocab(), tok.unk_token_id, tok.pad_token_id, tok.eos_token_id
    specials = set(tok.all_special_tokens)
    char_level = unk is not None and all(len(t) == 1 for t in vocab if t not in specials)

    def ids_of(texts: list[str]) -> list[list[int]]:
        if char_level:
            return [[vocab.get(ch, unk) for ch in text] for text in texts]
        return tok(texts, add_special_tokens=False)["input_ids"]

    def encode(problems: Sequence[Problem]) -> tuple[Any, Any, Any]:
        p_ids = ids_of([p.prompt for p in problems])
        seqs = [p + c + [eos] for p, c in zip(p_ids, ids_of([solution_text(p) for p in problems]))]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], dtype=torch.long)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], dtype=torch.long)
        labels = torch.tensor([[-100] * len(p) + s[len(p):] + [-100] * (width - len(s))
                               for p, s in zip(p_ids, seqs)], dtype=torch.long)
        return ids, mask, labels

    return encode


def sft(model: Any, tok: Any, recipe: SFTRecipe,
        progress: Callable[[int, int, float], None] | None = None, *, conventions: str = "race") -> dict[str, float]:
    """Run the warm-start recipe on ``model`` in place; returns token counts, the mean
    loss of the last 5% of steps, and ``sft_flops`` (``train_flops`` of every step's
    padded batch under ``conventions``). Deterministic under ``recipe.seed`` (same threads)."""
    task = recipe.make_task()
    encode = _batch_encoder(tok)
    shape = model_shape(model)
    step_flops: dict[tuple[int, int], int] = {}
    stats = dict(tokens_processed=0, real_tokens=0, loss_tokens=0, sft_flops=0)

    def loss_at(step: int) -> Any:
        batch = task.problems("train", recipe.batch_size, seed=step_seed(recipe.seed, step))
        ids, mask, labels = encode(batch)  # [B, T] each
        B, T = ids.shape
        if (B, T) not in step_flops:
            step_flops[B, T] = train_flops(shape, [T] * B, conventions=conventions)
        stats["tokens_processed"] += ids.numel()
        stats["sft_flops"] += step_flops[B, T]
        stats["real_tokens"] += int(mask.sum())
        stats["loss_tokens"] += int((labels != -100).sum())
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss

    tail = optimise(model, recipe, loss_at, progress)
    return dict(stats, final_loss=tail)


def greedy_completions(model: Any, tok: Any, prompts: Sequence[str], max_new_tokens: int,
                       batch_size: int = 64) -> list[str]:
    """Greedy completions (text after the prompt, special tokens dropped), batched with
    left padding through HF ``generate``."""
    import torch

    device = next(model.parameters()).device
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        enc = tok(list(prompts[i: i + batch_size]), return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(device) for k, v in enc.items()}
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        out.extend(tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True))
    return out


def evaluate_greedy(model: Any, tok: Any, problems: Sequence[Any], max_new_tokens: int | None = None,
                    batch_size: int = 64) -> float:
    """Fraction of ``problems`` whose greedy completion has the correct final answer.

    Arithmetic problems are checked with :func:`race.tasks.verify`; question/answer
    problems with :func:`race.tasks.verify_final_answer`. ``max_new_tokens`` defaults to
    the longest reference solution plus 16 characters (arithmetic) or 256.
    """
    from race.tasks.files import verify_final_answer

    if not problems:
        return 0.0
    arith = all(isinstance(p, Problem) for p in problems)
    if max_new_tokens is None:
        max_new_tokens = max(len(solution_text(p)) for p in problems) + 16 if arith else 256
    was_training = model.training
    model.eval()
    texts = greedy_completions(model, tok, [p.prompt for p in problems], max_new_tokens, batch_size)
    model.train(was_training)
    check = verify if arith else verify_final_answer
    return sum(check(p, t).correct for p, t in zip(problems, texts)) / len(problems)


def cached_base(name: str, *, cache_dir: str | os.PathLike[str] | None = None,
                recipe: SFTRecipe | None = None) -> BaseInfo | None:
    """The cached warm start of ``name`` for ``recipe`` (default: the family's), or
    ``None`` when it has not been built; builds nothing."""
    return _read_info(base_dir(name, cache_dir=cache_dir, recipe=_recipe(recipe)))


def current_recipe() -> SFTRecipe:
    """The family's canonical warm-start recipe (``DEFAULT_RECIPE``, read at call time)."""
    return _recipe(None)


def _info_of(data: dict[str, Any]) -> BaseInfo:
    known = {f.name for f in dataclasses.fields(BaseInfo)} - {"reused"}
    return BaseInfo(**{k: v for k, v in data.items() if k in known}, reused=True)


def _read_info(path: Path) -> BaseInfo | None:
    return CACHE.read_info(path, _info_of)


def _save_quietly(model: Any, tok: Any, path: Path) -> None:
    """save_pretrained (safetensors) without transformers' one-shard tqdm bar, which
    would break the CLI's progress display."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path, safe_serialization=True)
        tok.save_pretrained(path)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def build_base(name: str, *, cache_dir: str | os.PathLike[str] | None = None, force: bool = False,
               progress: Callable[[int, int, float], None] | None = None,
               recipe: SFTRecipe | None = None) -> BaseInfo:
    """Warm-start tiny size ``name`` (or reuse the cached checkpoint) and describe it.

    ``force`` retrains even when the checkpoint exists. ``progress(step, steps, loss)``
    is called after every optimizer step. ``recipe`` exists for tests and experiments;
    the family's canonical warm starts use :data:`DEFAULT_RECIPE`.
    """
    recipe = _recipe(recipe)
    final = base_dir(name, cache_dir=cache_dir, recipe=recipe)
    return CACHE.build_or_reuse(final, _read_info, lambda: _train_base(name, recipe, final, progress), force)


def _train_base(name: str, recipe: SFTRecipe, final: Path,
                progress: Callable[[int, int, float], None] | None) -> BaseInfo:
    import torch

    t0 = time.perf_counter()
    tok = build_char_tokenizer()
    model = build_tiny_model(name, seed=recipe.seed, attn_implementation="sdpa")
    sized = recipe.for_size(name)
    stats = sft(model, tok, sized, progress)
    seconds = time.perf_counter() - t0
    task = recipe.make_task()
    test_acc = evaluate_greedy(model, tok, task.problems("test", recipe.n_eval_test, seed=0))
    hard_acc = evaluate_greedy(model, tok, task.problems("hard", recipe.n_eval_hard, seed=0))
    eval_seconds = time.perf_counter() - t0 - seconds
    n_ne, n_head = non_embedding_params(model), lm_head_params(model)
    info = BaseInfo(
        name=name, path=str(final), recipe=dataclasses.asdict(recipe), recipe_hash=recipe_hash(name, recipe),
        non_embedding_params=n_ne, lm_head_params=n_head,
        total_params=sum(p.numel() for p in model.parameters()), steps=sized.steps,
        tokens_processed=int(stats["tokens_processed"]), real_tokens=int(stats["real_tokens"]),
        loss_tokens=int(stats["loss_tokens"]), sft_flops=float(stats["sft_flops"]),
        seconds=round(seconds, 2), final_loss=round(stats["final_loss"], 5),
        test_accuracy=test_acc, hard_accuracy=hard_acc, config=tiny_config_kwargs(name),
        eval_seconds=round(eval_seconds, 2), torch_threads=torch.get_num_threads(),
    )
    model.config._attn_implementation = "eager"  # the saved default; load_policy chooses anyway
    CACHE.publish(final, info.to_json(), lambda tmp: _save_quietly(model, tok, tmp))
    return info


def build_all(names: Sequence[str] | None = None, *, cache_dir: str | os.PathLike[str] | None = None,
              force: bool = False, progress: Callable[[str, int, int, float], None] | None = None,
              recipe: SFTRecipe | None = None) -> list[BaseInfo]:
    """:func:`build_base` for each name (default: the whole family, smallest first)."""
    from race.models.family import TINY_FAMILY

    return build_each(list(names or TINY_FAMILY), build_base, progress, cache_dir=cache_dir, force=force,
                      recipe=recipe)
