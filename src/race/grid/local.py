"""Local runner: a spawn-context process pool, ``workers`` processes x
``threads_per_worker`` threads (2 x 1 on a 2-core machine, docs/design.md section 4)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from race.grid.cell import execute_cell, init_local_worker, ping
from race.spec.grid import RunnerSettings


class LocalExecutor:
    """Cells as futures of a ``ProcessPoolExecutor`` (spawn). A pool broken by a worker
    that died is replaced on the next submit; the cells it held count a failed attempt."""

    def __init__(self, settings: RunnerSettings, cell_fn: str):
        self.settings = settings
        self.cell_fn = cell_fn
        self.capacity = settings.resolved_workers()
        self.description = f"local: {self.capacity} worker(s) x {settings.threads_per_worker} thread(s)"
        self._pool: cf.ProcessPoolExecutor | None = None
        self._broken = False
        self._make_pool()

    def _make_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        kwargs: dict[str, Any] = {}
        if self.settings.max_cells_per_worker:
            kwargs["max_tasks_per_child"] = self.settings.max_cells_per_worker
        self._pool = cf.ProcessPoolExecutor(
            max_workers=self.capacity,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=init_local_worker,
            initargs=(os.getpid(), self.settings.threads_per_worker, self.settings.preload_torch, self.cell_fn),
            **kwargs,
        )
        self._broken = False
        try:  # fail fast when workers cannot start at all, instead of failing every cell
            self._pool.submit(ping).result(timeout=300)
        except Exception as e:
            self._pool.shutdown(wait=False, cancel_futures=True)
            raise RuntimeError(f"local worker processes failed to start ({type(e).__name__}: {e}); "
                               "run the grid from a script file or the `race` CLI (spawned workers re-import "
                               "the main module), and check the worker's stderr above") from e

    def submit(self, spec: dict[str, Any], run_dir: str) -> cf.Future:
        if self._broken:
            self._make_pool()
        assert self._pool is not None
        return self._pool.submit(execute_cell, self.cell_fn, spec, run_dir)

    def wait(self, handles: list[cf.Future], timeout: float) -> list[tuple[cf.Future, dict[str, Any]]]:
        if not handles:
            return []
        done, _ = cf.wait(handles, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        out = []
        for fut in done:
            try:
                out.append((fut, fut.result()))
            except BrokenProcessPool as e:
                self._broken = True
                out.append((fut, {"ok": False, "error": f"worker process died while running this cell ({e}); "
                                  "out of memory? the cell resumes from its checkpoint on retry"}))
            except Exception as e:  # pickling and other transport errors
                out.append((fut, {"ok": False, "error": f"{type(e).__name__}: {e}"}))
        return out

    def close(self, cancel: bool = False) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if cancel:
            # stop the cells now; their run dirs keep checkpoints and the store keeps them 'running',
            # so the next driver restarts them
            for proc in list(getattr(pool, "_processes", {}).values()):
                if proc.is_alive():
                    proc.terminate()
        pool.shutdown(wait=True, cancel_futures=cancel)
