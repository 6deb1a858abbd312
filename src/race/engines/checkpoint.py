"""Resumable checkpoints: trainable weights (safetensors), optimizer state, step.

Written to ``checkpoint.tmp/`` and renamed over ``checkpoint/``, so a crash leaves either
the old checkpoint or the new one, never a half-written one. Weights load with
safetensors; the optimizer state loads with ``torch.load(weights_only=True)`` (tensors and
plain containers only, no pickled code).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(run_dir: Path, *, model: Any, optimizer: Any, step: int, meta: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    tmp = run_dir / "checkpoint.tmp"
    final = run_dir / "checkpoint"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(trainable_state(model), str(tmp / "trainable.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "meta.json").write_text(json.dumps(dict(meta, step=step)))
    publish(tmp, final)


def publish(tmp: Path, final: Path) -> None:
    """Make the finished checkpoint folder ``tmp`` the one at ``final``, crash-safe: its
    files are made durable, the previous ``final`` becomes ``<final>.old`` until ``tmp`` is
    renamed into place (a crash between the two renames leaves ``.old``, which
    :func:`find_checkpoint` reads), then ``.old`` goes."""
    for f in tmp.iterdir():  # make the files durable before the rename
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    old = final.with_name(final.name + ".old")
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)


def find_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (``checkpoint/``, else a ``checkpoint.old/`` left by
    a crash between the two renames)."""
    for name in ("checkpoint", "checkpoint.old"):
        d = run_dir / name
        if (d / "meta.json").exists() and (d / "trainable.safetensors").exists():
            return d
    return None


def load_checkpoint(ckpt: Path, *, model: Any, optimizer: Any) -> dict[str, Any]:
    from safetensors.torch import load_file

    state = load_file(str(ckpt / "trainable.safetensors"))
    params = dict(model.named_parameters())
    missing = [n for n in state if n not in params]
    if missing:
        raise RuntimeError(f"checkpoint {ckpt} does not match the model (unknown tensors {missing[:3]}...); "
                           "delete the run directory to start over")
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t)
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    return json.loads((ckpt / "meta.json").read_text())


def cut_lines(path: Path, n: int) -> None:
    """Keep the first ``n`` lines of the JSON Lines file ``path`` (what a run had written
    when it checkpointed), rewritten atomically. Counts, not steps: a record written at the
    checkpoint's own step after the checkpoint (a final evaluation cut short by a crash)
    goes too, so a resumed run never writes it twice."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)[:n]
    tmp = path.with_suffix(path.suffix + ".cut")
    tmp.write_text("".join(x if x.endswith("\n") else x + "\n" for x in lines), encoding="utf-8")
    os.replace(tmp, path)

