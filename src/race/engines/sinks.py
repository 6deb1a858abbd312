"""Where a run's metrics stream goes besides ``metrics.jsonl``: TensorBoard and/or Weights &
Biases (offline), the way TRL users are used to (``log_to`` in the run file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class MetricsSink:
    """Mirror the metrics stream to TensorBoard and/or Weights & Biases (offline), the way
    TRL users are used to. Both are optional: a missing package is a clear error."""

    def __init__(self, kinds: list[str], run_dir: Path, name: str) -> None:
        self.tb = self.wb = None
        if "tensorboard" in kinds:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise RuntimeError("log_to: tensorboard needs the tensorboard package (pip install tensorboard)")
            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        if "wandb" in kinds:
            try:
                import wandb
            except ImportError:
                raise RuntimeError("log_to: wandb needs the wandb package (pip install wandb)")
            self.wb = wandb.init(project="race", name=name, dir=str(run_dir), mode="offline")

    def log(self, row: dict[str, Any]) -> None:
        step = int(row.get("step", 0))
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(f"train/{k}", v, step)
        if self.wb is not None:
            self.wb.log({f"train/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wb is not None:
            self.wb.finish()
