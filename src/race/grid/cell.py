"""Worker side: run one cell and hand its results back to the driver.

A cell function has the engine's signature, ``fn(cfg: RunConfig, run_dir: Path) -> dict``,
and writes the run directory described in ``docs/run-format.md``. It is named by a
dotted path (``package.module:function``) or a file (``path/to/file.py:function``), and
resolved inside the worker, so nothing but plain data crosses process boundaries.

:func:`execute_cell` never raises for a failing cell: it returns ``{"ok": False,
"error": ...}`` with the traceback, so local and Ray runners treat failures alike.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from race.accounting.ledger import read_jsonl_records
from race.grid.lock import run_dir_lock
from race.schema import FINISHED

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
              "NUMEXPR_NUM_THREADS")
MAX_ERROR_CHARS = 6000

_FN_CACHE: dict[str, Callable[..., Any]] = {}


class CellFunctionError(ImportError):
    """The cell function named in the grid cannot be loaded."""


def resolve_cell_fn(path: str) -> Callable[..., Any]:
    """Load ``package.module:function`` or ``/path/file.py:function``."""
    if path in _FN_CACHE:
        return _FN_CACHE[path]
    target, _, name = path.rpartition(":")
    if not target or not name:
        raise CellFunctionError(f"cell_fn {path!r}: write 'package.module:function' or 'path/to/file.py:function'")
    try:
        if target.endswith(".py"):
            file = Path(target)
            if not file.exists():
                raise CellFunctionError(f"cell_fn {path!r}: file {file} not found")
            mod_name = "race_cell_fn_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
            if mod_name in sys.modules:
                module = sys.modules[mod_name]
            else:
                spec = importlib.util.spec_from_file_location(mod_name, file)
                assert spec and spec.loader
                module = importlib.util.module_from_spec(spec)
                sys.modules[mod_name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[mod_name]  # a later attempt re-runs the file, not a half-built module
                    raise
        else:
            module = importlib.import_module(target)
    except CellFunctionError:
        raise
    except ImportError as e:
        raise CellFunctionError(f"cell_fn {path!r}: cannot import {target}: {e}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise CellFunctionError(f"cell_fn {path!r}: {target} has no function {name!r}")
    _FN_CACHE[path] = fn
    return fn


def set_threads(threads: int, preload_torch: bool = False) -> None:
    """Pin BLAS/OpenMP and torch intra-op threads for this process."""
    for var in THREAD_ENV:
        os.environ[var] = str(threads)
    os.environ["RACE_TORCH_THREADS"] = str(threads)
    if preload_torch and "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401  (reads OMP_NUM_THREADS; set explicitly below too)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.set_num_threads(threads)


def _watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Exit when the driver ``parent_pid`` is no longer this process's parent (it died,
    e.g. by SIGKILL, possibly before this worker even started): an orphaned worker must
    not go on writing a run directory the next driver will resume."""
    def loop() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(70)
            time.sleep(interval_s)

    threading.Thread(target=loop, name="race-parent-watch", daemon=True).start()


def init_local_worker(driver_pid: int, threads: int, preload_torch: bool, cell_fn: str | None = None) -> None:
    """Initializer of a local pool worker started by the driver process ``driver_pid``."""
    _watch_parent(driver_pid)
    set_threads(threads, preload_torch)
    if cell_fn:
        try:
            resolve_cell_fn(cell_fn)  # import once up front; errors surface per cell
        except Exception:
            pass


def ping() -> int:
    """A no-op task: proves a worker process starts and imports RACE."""
    return os.getpid()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's JSON Lines file, read by the one JSONL reader
    (``race.accounting.ledger.read_jsonl_records``: a torn last line, an interrupted
    write, is dropped; a malformed line elsewhere raises, saying the file is corrupt)."""
    if not path.exists():
        return []
    return read_jsonl_records(path)[0]


def collect_run_dir(run_dir: Path, returned: Any = None) -> dict[str, Any]:
    """Read a finished run directory into the result the driver stores."""
    run_file = run_dir / "run.json"
    if run_file.exists():
        run = json.loads(run_file.read_text())
    elif isinstance(returned, dict):
        run = returned
    else:
        raise RuntimeError(f"the cell function returned without writing {run_file}")
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    return {
        "run": run,
        "ledger": _read_jsonl(run_dir / "ledger.jsonl"),
        "evals": [m for m in metrics if m.get("kind") == "eval"],
        "train": [m for m in metrics if m.get("kind") == "train"],
    }


def quiet_transformers() -> None:
    """No tqdm bars from transformers in grid workers ("Loading weights", "Writing model
    shards"): many cells share one terminal and the driver shows the progress."""
    if importlib.util.find_spec("transformers") is not None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def execute_cell(cell_fn: str, spec: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """Run one cell in this process; return ``{"ok": True, "result": ...}`` or
    ``{"ok": False, "error": ...}`` (plus pid/host/seconds)."""
    t0 = time.time()
    info = {"pid": os.getpid(), "host": socket.gethostname()}
    try:
        from race.spec.run import run_config_from_dict

        quiet_transformers()

        rd = Path(run_dir)
        rd.mkdir(parents=True, exist_ok=True)
        cfg = run_config_from_dict({**spec, "output_dir": str(rd)}, source=f"cell {rd.name}")
        fn = resolve_cell_fn(cell_fn)
        with run_dir_lock(rd):
            returned = fn(cfg, rd)
            result = collect_run_dir(rd, returned)
        status = result["run"].get("status", "complete")
        if status not in FINISHED:
            err = result["run"].get("error") or f"run.json status is {status!r}"
            return {"ok": False, "error": f"run ended with status {status!r}: {err}", "seconds": time.time() - t0, **info}
        result["wall_s"] = time.time() - t0
        return {"ok": True, "result": result, "seconds": time.time() - t0, **info}
    except BaseException as e:  # noqa: BLE001 - report everything, incl. KeyboardInterrupt in a worker
        if isinstance(e, (SystemExit,)) and e.code == 0:
            raise
        tb = traceback.format_exc()
        text = f"{type(e).__name__}: {e}\n{tb}"
        if len(text) > MAX_ERROR_CHARS:
            text = text[: MAX_ERROR_CHARS // 3] + "\n...\n" + text[-2 * MAX_ERROR_CHARS // 3:]
        return {"ok": False, "error": text, "seconds": time.time() - t0, **info}
