"""A run spec as TRL's ``GRPOConfig`` (TRL's names map one to one). The settings the TRL
engine refuses are checked by ``check_trl_config`` (in ``race.engines.checks``, torch-free,
so ``race grid plan`` runs the same check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from race.engines.checks import check_trl_config
from race.spec.run import RunConfig


def grpo_args(cfg: RunConfig, output_dir: Path, *, use_cpu: bool, max_steps: int) -> Any:
    """The ``GRPOConfig`` of a run spec (TRL names map one to one; a step's
    ``prompts_per_step x num_generations`` sequences are one generation batch of
    ``steps_per_generation`` micro-batches of ``per_device_train_batch_size``, trained in
    optimizer steps of ``gradient_accumulation_steps`` micro-batches; unset, TRL's default
    ``steps_per_generation = gradient_accumulation_steps``: one optimizer step per generation)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir), use_cpu=use_cpu, bf16=False, fp16=False,
        # a generation of steps_per_generation micro-batches, gradient_accumulation_steps per optimizer step
        per_device_train_batch_size=cfg.micro_batch_size, gradient_accumulation_steps=cfg.accumulation_steps,
        steps_per_generation=cfg.generation_steps,
        num_generations=cfg.num_generations, max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature, learning_rate=cfg.learning_rate, beta=cfg.beta,
        num_iterations=cfg.num_iterations, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high,
        loss_type=cfg.loss_type, scale_rewards=cfg.scale_rewards, sapo_temperature_pos=cfg.sapo_temperature_pos,
        sapo_temperature_neg=cfg.sapo_temperature_neg,
        mask_truncated_completions=cfg.mask_truncated_completions, seed=cfg.seed, data_seed=cfg.seed,
        max_steps=max_steps, max_grad_norm=cfg.max_grad_norm, weight_decay=cfg.weight_decay,
        optim="adamw_torch", activation_checkpointing=cfg.gradient_checkpointing,
        report_to="none", push_to_hub=False, logging_steps=1, logging_nan_inf_filter=False,
        save_strategy="steps", save_steps=cfg.checkpoint_every, save_total_limit=1,
        shuffle_dataset=False, disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )


__all__ = ["check_trl_config", "grpo_args"]
