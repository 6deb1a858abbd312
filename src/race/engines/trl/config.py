"""A run spec as TRL's ``GRPOConfig`` (TRL's names map one to one), and the settings the TRL
engine refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from race.spec.errors import ConfigError
from race.spec.run import RunConfig


def check_trl_config(cfg: RunConfig) -> None:
    """Refuse settings the TRL engine cannot run as specified, saying what to change."""
    if cfg.engine != "trl":
        raise ConfigError(f"engine={cfg.engine!r}: run_trl runs engine: trl specs")
    if cfg.drop_zero_variance_groups:
        raise ConfigError(
            "drop_zero_variance_groups: true is not available with engine: trl (TRL keeps groups whose rewards are "
            "all equal in the update, with advantage 0, and spends their FLOPs); set drop_zero_variance_groups: false")
    if cfg.max_completion_length + cfg.max_prompt_length < 2:
        raise ConfigError("max_prompt_length + max_completion_length must be >= 2")


def grpo_args(cfg: RunConfig, output_dir: Path, *, use_cpu: bool, max_steps: int) -> Any:
    """The ``GRPOConfig`` of a run spec (TRL names map one to one; a step's
    ``prompts_per_step x num_generations`` sequences are one generation batch, trained in
    ``gradient_accumulation_steps`` micro-batches of ``per_device_train_batch_size``)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir), use_cpu=use_cpu, bf16=False, fp16=False,
        # one generation per optimizer step, split into gradient_accumulation_steps micro-batches
        per_device_train_batch_size=cfg.micro_batch_size, gradient_accumulation_steps=cfg.accumulation_steps,
        steps_per_generation=cfg.accumulation_steps,
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
