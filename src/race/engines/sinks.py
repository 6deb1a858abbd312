"""Where a run's metrics stream goes besides ``metrics.jsonl``: TensorBoard and/or Weights &
Biases, the way TRL users are used to (``log_to`` in the run file).

W&B runs online when you are logged in (``WANDB_API_KEY`` set, or ``wandb login`` done:
a key for the W&B host in ``~/.netrc`` or ``$NETRC``, or one wandb itself finds) and offline otherwise (sync later with ``wandb sync``); ``WANDB_MODE`` set in the
environment wins. The project is the run file's ``wandb_project``, else ``$WANDB_PROJECT``,
else ``race``. Neither package is required: both are in the ``logging`` extra, imported
only when a run asks for them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

Progress = Callable[[dict[str, Any]], None]


def netrc_has_wandb_key(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``wandb login`` stored a key: an entry with a password for the W&B host
    (``$WANDB_BASE_URL``'s, default ``api.wandb.ai``) in ``$NETRC`` or ``~/.netrc``. Reads
    the file only; wandb is not imported."""
    import netrc
    from urllib.parse import urlparse

    real = env is None or env is os.environ
    env = os.environ if env is None else env
    host = urlparse(env.get("WANDB_BASE_URL", "").strip() or "https://api.wandb.ai").hostname or "api.wandb.ai"
    home = env.get("HOME", "").strip() or (str(Path.home()) if real else "")  # a given env without HOME: none
    path = env.get("NETRC", "").strip() or (str(Path(home) / ".netrc") if home else "")
    if not path or not Path(path).is_file():
        return False
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (netrc.NetrcParseError, OSError):
        return False
    return bool(entry and entry[2])


def wandb_mode(env: Mapping[str, str] | None = None) -> str:
    """``online`` when the user is logged in to W&B, ``offline`` otherwise; an explicit
    ``WANDB_MODE`` (``online``, ``offline``, ``disabled``, ``dryrun``) is honoured. Logged
    in: ``WANDB_API_KEY`` is set, ``wandb login`` stored a key in the netrc file
    (:func:`netrc_has_wandb_key`), or wandb (when installed) finds one."""
    env = os.environ if env is None else env
    mode = env.get("WANDB_MODE", "").strip().lower()
    if mode:
        return "offline" if mode == "dryrun" else mode
    if env.get("WANDB_API_KEY", "").strip() or netrc_has_wandb_key(env):
        return "online"
    try:
        import wandb
    except ImportError:
        return "offline"
    try:
        key = wandb.api.api_key  # the key `wandb login` stored (netrc / settings); None when logged out
    except Exception:
        key = None
    return "online" if key else "offline"


def wandb_project(project: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The W&B project: ``project`` (the run file's ``wandb_project``), else
    ``$WANDB_PROJECT``, else ``race``."""
    env = os.environ if env is None else env
    return project or env.get("WANDB_PROJECT", "").strip() or "race"


class MetricsSink:
    """Mirror the metrics stream to TensorBoard and/or Weights & Biases. A missing package
    is a clear error."""

    def __init__(self, kinds: list[str], run_dir: Path, name: str, *, project: str | None = None) -> None:
        self.tb = self.wb = None
        if "tensorboard" in kinds:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise RuntimeError("log_to: tensorboard needs the tensorboard package (pip install 'race-rl[logging]')")
            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        if "wandb" in kinds:
            try:
                import wandb
            except ImportError:
                raise RuntimeError("log_to: wandb needs the wandb package (pip install 'race-rl[logging]')")
            self.wb = wandb.init(project=wandb_project(project), name=name, dir=str(run_dir), mode=wandb_mode())

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


def check_installed(kinds: list[str]) -> None:
    """Fail before training when a ``log_to`` backend's package is missing."""
    import importlib.util

    for kind in kinds:
        if importlib.util.find_spec(kind) is None:
            raise RuntimeError(f"log_to: {kind} needs the {kind} package (pip install 'race-rl[logging]')")


class LazySink:
    """A run's ``log_to`` sinks, opened on the first metrics row (a run that is already
    complete opens none), as a progress callback chained before ``progress``. Missing
    packages fail here, before training."""

    def __init__(self, cfg: Any, run_dir: Path, progress: Progress | None = None) -> None:
        self.cfg, self.run_dir, self.progress = cfg, Path(run_dir), progress
        self.sink: MetricsSink | None = None
        check_installed(list(cfg.log_to))

    def __call__(self, row: dict[str, Any]) -> None:
        if self.cfg.log_to:
            if self.sink is None:
                self.sink = MetricsSink(list(self.cfg.log_to), self.run_dir, self.cfg.name,
                                        project=self.cfg.wandb_project)
            self.sink.log(row)
        if self.progress is not None:
            self.progress(row)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            self.sink = None


__all__ = ["LazySink", "MetricsSink", "check_installed", "netrc_has_wandb_key", "wandb_mode", "wandb_project"]
