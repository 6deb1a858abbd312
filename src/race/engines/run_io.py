"""Files of a run directory (docs/run-format.md): config, metrics JSONL, run.json."""

from __future__ import annotations

import json
import os
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
