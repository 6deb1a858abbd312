"""Worker side, in process: resolving cell functions and reporting a cell's outcome."""

from __future__ import annotations

import pytest

from race.grid import expand_grid, grid_spec_from_dict
from race.grid.cell import CellFunctionError, execute_cell, resolve_cell_fn

from .conftest import FAKE_CELL_FN, grid


def test_cell_functions_resolve_by_module_or_file(tmp_path):
    assert resolve_cell_fn("race.grid.cell:ping")() > 0
    assert resolve_cell_fn(FAKE_CELL_FN).__name__ == "run_engine"
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('import-time failure')\n")
    for _ in range(2):  # the half-imported module is not cached
        with pytest.raises(RuntimeError, match="import-time failure"):
            resolve_cell_fn(f"{broken}:go")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(CellFunctionError, match="has no function 'go'"):
        resolve_cell_fn(f"{empty}:go")
    with pytest.raises(CellFunctionError, match="cannot import no.such.module"):
        resolve_cell_fn("no.such.module:go")
    with pytest.raises(CellFunctionError, match="not found"):
        resolve_cell_fn(f"{tmp_path / 'missing.py'}:go")


def test_execute_cell_returns_results_or_the_error_text(tmp_path):
    cell = expand_grid(grid_spec_from_dict(grid()))[0]
    ok = execute_cell(FAKE_CELL_FN, cell.spec_dict(), str(tmp_path / "a"))
    assert ok["ok"] and ok["result"]["run"]["status"] == "complete"
    assert len(ok["result"]["train"]) == ok["result"]["run"]["steps"] and ok["result"]["evals"]
    assert all(r["kind"] == "eval" for r in ok["result"]["evals"])

    silent = tmp_path / "silent.py"
    silent.write_text("def go(cfg, run_dir):\n    return None\n")
    out = execute_cell(f"{silent}:go", cell.spec_dict(), str(tmp_path / "b"))
    assert not out["ok"] and "returned without writing" in out["error"]

    failed = tmp_path / "failed.py"
    failed.write_text("import json\ndef go(cfg, run_dir):\n"
                      "    (run_dir / 'run.json').write_text(json.dumps({'status': 'failed', 'error': 'nan loss'}))\n")
    out = execute_cell(f"{failed}:go", cell.spec_dict(), str(tmp_path / "c"))
    assert not out["ok"] and "status 'failed': nan loss" in out["error"]

    bad_spec = {**cell.spec_dict(), "num_generations": 1}
    out = execute_cell(FAKE_CELL_FN, bad_spec, str(tmp_path / "d"))
    assert not out["ok"] and "num_generations" in out["error"]


def test_a_run_directory_is_read_by_the_one_jsonl_reader(tmp_path):
    """A torn last line (an interrupted write) is dropped, as the ledger drops it; a
    malformed line before the last is corruption and raises."""
    import json

    from race.accounting import LedgerCorruptError
    from race.grid.cell import collect_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": "r"}))
    rows = [{"kind": "eval", "step": 0}, {"kind": "train", "step": 1}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "tr')
    (run / "ledger.jsonl").write_text('{"step": 1, "phase": "rollout"}\n')
    got = collect_run_dir(run)
    assert got["evals"] == rows[:1] and got["train"] == rows[1:] and got["ledger"] == [{"step": 1, "phase": "rollout"}]
    (run / "metrics.jsonl").write_text('{"kind": "tr\n' + json.dumps(rows[1]) + "\n")
    with pytest.raises(LedgerCorruptError, match="line 1 is malformed"):
        collect_run_dir(run)
