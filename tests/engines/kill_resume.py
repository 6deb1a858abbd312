"""Shared by the built-in engine's crash tests: kill a run after a step, resume it, and
compare its files with an uninterrupted run's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def without_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


def kill_after_step(monkeypatch: Any, cfg: Any, run_dir: Path, step: int) -> None:
    """Run ``cfg`` into ``run_dir`` and kill it (KeyboardInterrupt) right after training
    step ``step``; the engine is restored for the next call."""
    from race.engines import builtin, run_engine

    real = builtin.BuiltinEngine._train_step

    def crashing(self, s, *a, **k):
        charged = real(self, s, *a, **k)
        if s == step:
            raise KeyboardInterrupt("simulated kill")
        return charged

    monkeypatch.setattr(builtin.BuiltinEngine, "_train_step", crashing)
    with pytest.raises(KeyboardInterrupt):
        run_engine(cfg, run_dir)
    monkeypatch.setattr(builtin.BuiltinEngine, "_train_step", real)


def assert_same_files(ref: Path, run: Path) -> None:
    """Ledger and metrics equal record for record, wall seconds aside."""
    for f in ("ledger.jsonl", "metrics.jsonl"):
        assert without_seconds(lines(ref / f)) == without_seconds(lines(run / f)), f
