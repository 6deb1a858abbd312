"""Fixtures of the import tests: real TRL output directories trained here on the tiny family
(``GRPOTrainer`` as a user's own script runs it, with and without RACE's callback), and a
synthetic study written as a CSV by a script."""

from __future__ import annotations

from pathlib import Path

import pytest

#: The fields of the TRL runs below with equal lengths (one generation of 1 prompt x 4
#: completions per step); the uneven run has 2 prompts per step.
TRL_FIELDS = {"model": "tiny-xs", "num_generations": 4, "prompts_per_step": 1, "num_iterations": 1,
              "learning_rate": 1e-3, "reward": "rule"}
EVAL_PROBLEMS = 3
STEPS = 3
COMPLETION = 6


def _problems(n_train: int = 8, one_length: bool = True):
    """Training problems (whose prompts are one length when ``one_length``, so two runs'
    rows have equal shapes), and the evaluation problems."""
    from collections import Counter

    from race.tasks import ArithTask

    task = ArithTask(seed=0)
    pool = task.problems("train", 200, seed=0)
    length = Counter(len(p.prompt) for p in pool).most_common(1)[0][0]
    train = [p for p in pool if len(p.prompt) == length or not one_length][:n_train]
    return train, task.problems("test", EVAL_PROBLEMS, seed=0)


def train_trl(model_dir: Path, out: Path, *, callback: bool, fixed_lengths: bool, seed: int = 0) -> Path:
    """A real TRL output directory: GRPO on a random tiny-xs with LoRA (r=2 on q/v), TRL's
    own evaluation at step 0 and after every step (one sample per problem; the reward: the
    task's 0/1 verifier), with RACE's callback (``add_race_accounting``) or without it.
    ``fixed_lengths``: every completion runs to ``max_completion_length``
    (``min_new_tokens``) and every prompt has one length, one prompt per step; else 2
    prompts of their own lengths per step, and completions that end early (an EOS pushed
    up along the completion: ``exponential_decay_length_penalty``)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from race.models import load_policy
    from race.tasks import outcome_reward, verify

    train, test = _problems(one_length=fixed_lengths)
    problems = train + test
    torch.manual_seed(seed)
    model, tok = load_policy(str(model_dir), device="cpu")

    def correct(completions, idx, **kw):
        return [outcome_reward(verify(problems[i], c)) for c, i in zip(completions, idx)]

    ds = Dataset.from_dict({"prompt": [p.prompt for p in train], "idx": list(range(len(train)))})
    ev = Dataset.from_dict({"prompt": [p.prompt for p in test], "idx": list(range(len(train), len(problems)))})
    gen = {"min_new_tokens": COMPLETION} if fixed_lengths else {"exponential_decay_length_penalty": (1, 2.0)}
    args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, num_generations=4,
                      per_device_train_batch_size=4 if fixed_lengths else 8, num_generations_eval=1,
                      max_completion_length=COMPLETION, max_steps=STEPS, report_to="none", disable_tqdm=True,
                      save_strategy="steps", save_steps=STEPS, logging_steps=1, eval_strategy="steps", eval_steps=1,
                      eval_on_start=True, per_device_eval_batch_size=EVAL_PROBLEMS, seed=seed, learning_rate=1e-3,
                      generation_kwargs=gen)
    trainer = GRPOTrainer(model=model, reward_funcs=correct, args=args, train_dataset=ds, eval_dataset=ev,
                          processing_class=tok, peft_config=LoraConfig(r=2, lora_alpha=4, task_type="CAUSAL_LM"))
    if callback:
        from race.engines.trl_callback import add_race_accounting

        add_race_accounting(trainer, budget_flops=1e13)
    trainer.train()
    return out


@pytest.fixture(scope="session")
def trl_dirs(tiny_model_dir, tmp_path_factory):
    """Three TRL output directories: ``ledger`` (callback, completions of their own
    lengths), ``fixed`` (callback, every completion at full length) and ``plain`` (no
    callback, full-length completions: the same shapes as ``fixed``)."""
    root = tmp_path_factory.mktemp("trl-runs")
    return {"ledger": train_trl(tiny_model_dir, root / "ledger", callback=True, fixed_lengths=False),
            "fixed": train_trl(tiny_model_dir, root / "fixed", callback=True, fixed_lengths=True),
            "plain": train_trl(tiny_model_dir, root / "plain", callback=False, fixed_lengths=True)}
