"""Warm-start (SFT) the tiny family on worked solutions, cached by recipe hash.

GRPO needs a policy that already solves some problems (a group whose rewards are all 0
carries no signal), but not all (then nothing is left to learn). :func:`build_base`
supervised-fine-tunes a tiny size on ``prompt -> worked solution + <eos>`` pairs from the
train split of the built-in arithmetic task with ONE recipe for every size: AdamW,
linear warmup then cosine decay, batch 32, and the SAME number of optimizer steps for
every size. docs/design.md section 4: fixing the step count (rather than the wall-clock time)
ranks bigger models stronger, which is the ordering the pilot grid should start from.
The loss is on completion tokens only (prompt tokens are random draws: nothing to learn).

The recipe (:class:`~race.models.base_recipes.SFTRecipe`), its hash and where a warm
start lives are :mod:`race.models.base_recipes` (torch-free, what loaders read); this
module trains: checkpoints go to ``<cache>/base/<name>-<recipe hash>/`` (safetensors +
tokenizer + ``info.json``), written under a temporary name and renamed into place
(:mod:`race.builds.store`), so concurrent builders never see half a checkpoint.

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
from pathlib import Path
from typing import Any

from race.accounting import train_flops
from race.builds.store import build_or_reuse, publish
from race.builds.train import optimise
from race.models.base_recipes import BaseInfo, SFTRecipe, base_dir, current_recipe, read_base_info, recipe_hash
from race.models.family import build_tiny_model, count_params, lm_head_params, non_embedding_params, \
    tiny_config_kwargs
from race.models.refs import model_shape
from race.models.tokenizer import build_char_tokenizer
from race.tasks.arith import Problem, solution_text, step_seed
from race.tasks.verify import verify

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
    recipe = current_recipe() if recipe is None else recipe
    final = base_dir(name, cache_dir=cache_dir, recipe=recipe)
    return build_or_reuse(final, read_base_info, lambda: _train_base(name, recipe, final, progress), force)


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
        total_params=count_params(model.parameters()), steps=sized.steps,
        tokens_processed=int(stats["tokens_processed"]), real_tokens=int(stats["real_tokens"]),
        loss_tokens=int(stats["loss_tokens"]), sft_flops=float(stats["sft_flops"]),
        seconds=round(seconds, 2), final_loss=round(stats["final_loss"], 5),
        test_accuracy=test_acc, hard_accuracy=hard_acc, config=tiny_config_kwargs(name),
        eval_seconds=round(eval_seconds, 2), torch_threads=torch.get_num_threads(),
    )
    model.config._attn_implementation = "eager"  # the saved default; load_policy chooses anyway
    publish(final, info.to_json(), lambda tmp: _save_quietly(model, tok, tmp))
    return info
