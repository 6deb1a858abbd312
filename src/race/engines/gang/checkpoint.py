"""The gang's checkpoint: every member's state at one gang step, written as one directory.

``<gang_dir>/checkpoint/`` holds ``gang.json`` (the gang step, its members' run ids and
which of them had left, each live member's lr-schedule length) and, per live member
``i``, ``m<i>/checkpoint/`` as ``race.engines.checkpoint`` writes it (trainable weights in
safetensors, optimizer state, the run's resume metadata). It is built in
``checkpoint.tmp/`` and renamed over ``checkpoint/`` (the previous one kept as
``checkpoint.old/`` until the rename), so a crash leaves one whole gang state, never a
mix of members at different steps: a gang's members share their passes, and a member's
float rounding depends on which rows it shared them with, so the gang resumes as a whole.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from race.engines.checkpoint import find_checkpoint, publish


def save_gang(gang_dir: Path, *, step: int, run_ids: list[str], left: list[bool], members: list[Any],
              metas: list[dict[str, Any] | None], total_steps: list[int]) -> None:
    """Write the gang's state at ``step``; ``members[i]`` writes its weights and optimizer
    state (``EngineLifecycle.write_checkpoint``; unused for a member that left); ``metas[i]``:
    what its checkpoint records of its run (``EngineLifecycle.save_meta``, with the gang's figures)."""
    tmp, final = gang_dir / "checkpoint.tmp", gang_dir / "checkpoint"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for i, (m, gone) in enumerate(zip(members, left)):
        if not gone:
            d = tmp / f"m{i}"
            d.mkdir()
            m.write_checkpoint(d, step, metas[i] or {})
    state = {"step": step, "run_ids": run_ids, "left": left, "total_steps": total_steps}
    (tmp / "gang.json").write_text(json.dumps(state))
    publish(tmp, final)  # the members' folders were made durable by save_checkpoint


def find_gang(gang_dir: Path) -> Path | None:
    """The newest complete gang checkpoint (``checkpoint/``, else ``checkpoint.old/``)."""
    for name in ("checkpoint", "checkpoint.old"):
        d = gang_dir / name
        if (d / "gang.json").exists():
            return d
    return None


def read_gang(ckpt: Path, run_ids: list[str]) -> dict[str, Any]:
    """The stored gang state; refuses a checkpoint of another gang."""
    state = json.loads((ckpt / "gang.json").read_text())
    if state["run_ids"] != run_ids:
        raise RuntimeError(f"{ckpt} is the checkpoint of another gang (members {state['run_ids']}, not {run_ids}); "
                           "use a new gang directory")
    return state


def load_member(ckpt: Path, i: int, member: Any) -> dict[str, Any]:
    """Restore member ``i``'s weights and optimizer (``member``: its engine, through
    ``EngineLifecycle.read_checkpoint``); returns its resume metadata."""
    d = find_checkpoint(ckpt / f"m{i}")
    if d is None:
        raise RuntimeError(f"{ckpt} has no state for live member {i}; delete the gang directory to start over")
    return member.read_checkpoint(d)


__all__ = ["find_gang", "load_member", "read_gang", "save_gang"]
