"""One step-0 evaluation per base model, shared by every run that starts from it.

At step 0 a LoRA policy IS its base model (LoRA's ``B`` starts at zero and evaluation runs
in eval mode, so dropout is off), and the evaluation problems and the pass@k sampler are
seeded independently of the run (``race.engines.evaluation``). Every cell of a grid that
starts from the same base, on the same task and evaluation settings, would therefore
compute exactly the same step-0 rows. With ``eval_cache_dir`` set (grids set it to
``<study>/eval-cache``), the first run computes them and stores them under a key; the
others read them, and their ledgers record the evaluation as ``eval/shared`` with 0 FLOPs
executed (what ran is charged once, to the run that ran it).

The key is a hash of everything that can change those rows: the base's files (name, size,
modification time of every file in its directory), the whole run config except the
settings listed in :data:`NOT_IN_KEY` (which cannot change a step-0 evaluation), and the
torch thread count (results are deterministic per thread count). A setting added to
``RunConfig`` later enters the key by default, so sharing errs on the side of computing.
Runs whose model is not a local directory (a hub name) are never shared.

Concurrent runs wait for each other on a per-key ``fcntl`` lock instead of computing the
same rows twice; entries are written atomically (temporary file, then rename).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

#: RunConfig fields that cannot change the step-0 evaluation (training, reward, budget,
#: bookkeeping). Everything else enters the key.
NOT_IN_KEY = (
    "name", "seed", "budget_flops", "max_steps", "reward", "prompts_per_step", "per_device_train_batch_size",
    "gradient_accumulation_steps", "num_generations", "num_update_generations", "update_selection", "learning_rate",
    "lr_scheduler_type", "warmup_steps",
    "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "num_iterations", "max_grad_norm",
    "weight_decay", "mask_truncated_completions", "drop_zero_variance_groups", "sapo_temperature_pos", "sapo_temperature_neg",
    "checkpoint_every", "gradient_checkpointing", "output_dir", "log_to", "wandb_project", "eval_cache_dir",
)
#: The evaluation schedule decides WHEN evaluations run, not what step 0 scores.
EVAL_NOT_IN_KEY = ("every_flops", "num_points", "at_budgets")
CACHE_VERSION = 1


def model_fingerprint(source: str | os.PathLike[str]) -> str | None:
    """``name:size:mtime_ns`` of every file in a local model directory, hashed; ``None``
    when ``source`` is not a local directory (nothing to fingerprint: never shared)."""
    path = Path(source)
    if not path.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def step0_key(cfg: Any, source: str | os.PathLike[str], threads: int | None) -> str | None:
    """The cache key of ``cfg``'s step-0 evaluation from the base at ``source``, or ``None``
    when it cannot be shared."""
    fp = model_fingerprint(source)
    if fp is None:
        return None
    d = cfg.model_dump(mode="json")
    for k in NOT_IN_KEY:
        d.pop(k, None)
    for k in EVAL_NOT_IN_KEY:
        d["eval"].pop(k, None)
    blob = json.dumps({"v": CACHE_VERSION, "model": fp, "config": d, "threads": threads}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel drops it if the holder dies
        yield
    finally:
        os.close(fd)


class Step0Cache:
    """Shared step-0 evaluations under ``root`` (one JSON file per key)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def get_or_compute(self, key: str, compute: Callable[[], Any]) -> tuple[Any, bool]:
        """``(EvalResult, shared)``: the stored result for ``key`` (``shared=True``), else
        ``compute()``'s, stored for the next run (``shared=False``)."""
        from race.engines.evaluation import EvalResult

        entry = self.root / f"{key}.json"
        with _locked(self.root / f"{key}.lock"):
            if entry.is_file():
                try:
                    data = json.loads(entry.read_text())
                    return EvalResult(rows=data["rows"], flops=0, tokens=0, seconds=0.0), True
                except (ValueError, KeyError):
                    entry.unlink()  # damaged: compute again
            res = compute()
            tmp = entry.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"rows": res.rows, "flops": res.flops, "tokens": res.tokens,
                                       "seconds": res.seconds}))
            os.replace(tmp, entry)
            return res, False


__all__ = ["NOT_IN_KEY", "Step0Cache", "model_fingerprint", "step0_key"]
