"""Files of a run directory (docs/run-format.md): config, metrics JSONL, run.json, and a
run directory seeded to extend a shorter run of the same trajectory (:func:`seed_extension`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable

from race.accounting.ledger import read_jsonl_records


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_config(run_dir: Path, cfg: Any) -> None:
    import yaml

    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


class MetricsLog:
    """Append-only metrics JSONL (same torn-line rules as the ledger)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        if path.exists():
            rows, torn = read_jsonl_records(path)
            if torn is not None:
                with path.open("r+b") as f:
                    f.truncate(torn)
            self.rows = rows

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
            f.flush()
            os.fsync(f.fileno())
        self.rows.extend(rows)

    def truncate_after(self, step: int) -> None:
        keep = [r for r in self.rows if r.get("step", 0) <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in keep))
        os.replace(tmp, self.path)
        self.rows = keep

    def evals(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("kind") == "eval"]


def read_run(run_dir: Path) -> dict[str, Any] | None:
    p = run_dir / "run.json"
    if not p.exists():
        return None
    return json.loads(p.read_text())


#: A seeded run directory's note of the shorter run it continues (docs/run-format.md).
EXTENDS_FILE = "extends.json"
#: What a seeded run directory takes from the run it extends (besides the checkpoint).
SEEDED_FILES = ("ledger.jsonl", "metrics.jsonl")


def last_checkpoint(run_dir: Path) -> Path | None:
    """The folder of the last checkpoint an engine left in ``run_dir``: the built-in
    engine's ``checkpoint/`` (``race.engines.checkpoint``), else the newest of TRL's
    ``trl/checkpoint-N`` (``race.engines.trl``: ``Trainer`` names them so); None when there
    is none."""
    run_dir = Path(run_dir)
    if (run_dir / "checkpoint").is_dir():
        return run_dir / "checkpoint"
    steps = [(int(p.name.rpartition("-")[2]), p) for p in (run_dir / "trl").glob("checkpoint-*")
             if p.is_dir() and p.name.rpartition("-")[2].isdigit()] if (run_dir / "trl").is_dir() else []
    return max(steps)[1] if steps else None


def read_extends(run_dir: Path) -> dict[str, Any] | None:
    """The :data:`EXTENDS_FILE` of a seeded run directory, else None."""
    p = Path(run_dir) / EXTENDS_FILE
    return json.loads(p.read_text()) if p.exists() else None


def seed_extension(parent_dir: Path, run_dir: Path) -> dict[str, Any]:
    """Start ``run_dir`` as the continuation of the complete run in ``parent_dir``: a copy
    of its last checkpoint (:func:`last_checkpoint`, at the same place: either engine),
    ledger and metrics, and :data:`EXTENDS_FILE` saying which run
    it extends (its id, budget, steps, counted FLOPs, wall seconds, trajectory and budget
    points). The engine then resumes that checkpoint with its own, larger budget
    (``race.engines.common.RunDir.resume``). Built in a temporary folder and renamed into
    place, so a crash leaves either no seeded directory or a whole one; whatever
    ``run_dir`` held before (a directory without a checkpoint) is replaced."""
    parent_dir, run_dir = Path(parent_dir), Path(run_dir)
    parent = read_run(parent_dir)
    ckpt = last_checkpoint(parent_dir)
    if parent is None or parent.get("status") != "complete" or ckpt is None:
        raise RuntimeError(f"{parent_dir} holds no complete run with a checkpoint to extend (status "
                           f"{(parent or {}).get('status')!r}); run it first")
    ext = {"run_id": parent["run_id"], "budget_flops": parent["budget_flops"], "steps": parent["steps"],
           "total_flops": parent["total_flops"], "wall_s": parent.get("wall_s") or 0.0,
           "trajectory": parent.get("trajectory"), "budget_points": parent.get("budget_points") or []}
    tmp = run_dir.with_name(run_dir.name + ".extend.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(ckpt, tmp / ckpt.relative_to(parent_dir))
    for name in SEEDED_FILES:
        if (parent_dir / name).exists():
            shutil.copy2(parent_dir / name, tmp / name)
    write_json_atomic(tmp / EXTENDS_FILE, ext)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    tmp.rename(run_dir)
    return ext
