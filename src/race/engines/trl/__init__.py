"""The TRL adapter, in one folder.

    engine.py        TrlEngine: a RunConfig trained by TRL's GRPOTrainer, the run directory
    config.py        RunConfig -> GRPOConfig; settings the TRL engine refuses
    reward.py        a race.rewards system as a TRL reward function
    trainer.py       GRPOTrainer with the built-in engine's learning-rate schedule
    run_callback.py  metrics, evaluation and resume state inside TRL's loop
    callback.py      RaceFlopCallback / add_race_accounting: the drop-in ledger for any TRL script
    hooks.py         forward hooks that record what TRL's models execute
    flops.py         those calls -> phase/component FLOPs; comparison with the built-in engine

Importing this package is cheap; transformers and trl load when a run starts (or when
``callback`` is imported).
"""

from race.engines.trl.config import check_trl_config, grpo_args
from race.engines.trl.engine import TrlEngine, run_trl
from race.engines.trl.reward import RaceReward

__all__ = ["RaceReward", "TrlEngine", "check_trl_config", "grpo_args", "run_trl"]
