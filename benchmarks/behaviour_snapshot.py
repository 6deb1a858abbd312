"""A normalised snapshot of what studies and runs wrote, to diff behaviour before and after a refactor.

    python benchmarks/behaviour_snapshot.py STUDY_OR_RUN_DIR [...] > before.txt
    (change the code, run the same commands again into other directories)
    python benchmarks/behaviour_snapshot.py OTHER_DIR [...] > after.txt && diff before.txt after.txt

For every run directory found (a folder with ``ledger.jsonl``), in run-id order: every line of
``ledger.jsonl`` and ``metrics.jsonl`` and the whole ``run.json``; for every study directory
(a folder with ``study.sqlite``): its runs, evals and rung-decision tables, ``validation.json``
and ``report.json`` when present. Normalised so that only behaviour is compared:

- wall-clock keys are dropped (names containing ``seconds``, ``wall``, ``time``, ``elapsed``,
  ``per_second``, ``mfu``, ``utilisation``, ending in ``_s`` or ``_at``, and a report's
  ``generated``), also inside JSON documents stored as strings (the runs table's ``run_json``);
- the directory given on the command line is replaced by ``<ROOT>`` in every string, and
  absolute paths outside it by their last two components;
- numbers are printed with ``repr`` (a float that differs in any bit shows).

Empty output of ``diff`` means the two code versions wrote the same runs, ledgers, metrics,
decisions and report numbers.
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

WALL = re.compile(r"(seconds|wall|time|elapsed|per_second|mfu|utilisation|_s$|_at$|^pid$|hostname|^generated$)")


def _clean(x: Any, root: str) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v, root) for k, v in sorted(x.items()) if not WALL.search(str(k))}
    if isinstance(x, list):
        return [_clean(v, root) for v in x]
    if isinstance(x, str) and x[:1] in "{[":  # a JSON document stored as a string (runs.run_json, spec_json)
        try:
            return _clean(json.loads(x), root)
        except ValueError:
            pass
    if isinstance(x, str):
        s = x.replace(root, "<ROOT>")
        if s.startswith("/") and "<ROOT>" not in s:
            s = "/".join(Path(s).parts[-2:])
        return s
    return x


def _json_lines(path: Path, root: str) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.dumps(_clean(json.loads(line), root), sort_keys=True))
    return out


def run_lines(run_dir: Path, root: str) -> list[str]:
    out = [f"## run {run_dir.name}"]
    for name in ("ledger.jsonl", "metrics.jsonl"):
        if (run_dir / name).exists():
            out += [f"{name}: {line}" for line in _json_lines(run_dir / name, root)]
    if (run_dir / "run.json").exists():
        out.append("run.json: " + json.dumps(_clean(json.loads((run_dir / "run.json").read_text()), root),
                                             sort_keys=True))
    return out


def study_lines(study_dir: Path, root: str) -> list[str]:
    out = [f"# study {study_dir.name}"]
    con = sqlite3.connect(f"file:{study_dir / 'study.sqlite'}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    tables = [r[0] for r in con.execute("select name from sqlite_master where type='table' order by name")]
    for t in tables:
        cols = [r[1] for r in con.execute(f"pragma table_info({t})")]
        order = ", ".join(c for c in ("run_id", "step", "rung", "target", "name") if c in cols) or "rowid"
        for row in con.execute(f"select * from {t} order by {order}"):
            d = {k: row[k] for k in row.keys()}
            out.append(f"{t}: " + json.dumps(_clean(d, root), sort_keys=True, default=str))
    con.close()
    for name in ("validation.json", "report.json"):
        for p in sorted(study_dir.rglob(name)):
            out.append(f"{p.relative_to(study_dir)}: " + json.dumps(_clean(json.loads(p.read_text()), root),
                                                                   sort_keys=True))
    return out


def snapshot(path: Path) -> list[str]:
    root = str(path.resolve())
    out: list[str] = []
    studies = sorted({p.parent for p in path.rglob("study.sqlite")})
    for s in studies:
        out += study_lines(s, root)
    for r in sorted({p.parent for p in path.rglob("ledger.jsonl")}, key=lambda p: p.name):
        out += run_lines(r, root)
    return out


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for arg in sys.argv[1:]:
        print("\n".join(snapshot(Path(arg))))


if __name__ == "__main__":
    main()
