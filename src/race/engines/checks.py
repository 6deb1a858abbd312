"""What each engine refuses, checked before anything runs (torch-free).

``race grid plan`` calls :func:`engine_refusal` on every cell, so a cell the TRL engine
would refuse in a worker is refused in the plan, with the same message.
"""

from __future__ import annotations

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
    if cfg.num_update_generations is not None:
        raise ConfigError(
            f"num_update_generations={cfg.num_update_generations} (train on a reward-chosen subset of each prompt's "
            "rollouts, PODS) is not available with engine: trl: TRL 1.16's GRPOTrainer computes the old-policy and "
            "reference log-probs of the whole generation batch before the rewards exist, its advantages over all "
            "num_generations rollouts of a prompt, and trains on every row it generated "
            "(_generate_and_score_completions); set engine: builtin, or drop num_update_generations (docs/trl.md)")
    if cfg.max_completion_length + cfg.max_prompt_length < 2:
        raise ConfigError("max_prompt_length + max_completion_length must be >= 2")


#: Engine name -> its config check (raises ``ConfigError`` saying what to change).
ENGINE_CHECKS = {"trl": check_trl_config}


def engine_refusal(cfg: RunConfig) -> str | None:
    """Why ``cfg``'s engine would refuse it, or None (engines without a check accept all)."""
    check = ENGINE_CHECKS.get(cfg.engine)
    if check is None:
        return None
    try:
        check(cfg)
    except ConfigError as e:
        return f"engine: {cfg.engine} refuses this cell: {e}"
    return None


__all__ = ["ENGINE_CHECKS", "check_trl_config", "engine_refusal"]
