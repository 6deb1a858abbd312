"""Local runner: a spawn-context process pool, ``workers`` processes x
``threads_per_worker`` threads (2 x 1 on a 2-core machine, docs/design.md section 4).

On a machine with GPUs each worker gets its own: worker slot i sees only GPU
``gpus[i % len(gpus)]`` through ``CUDA_VISIBLE_DEVICES`` (round robin when there are more
workers than GPUs), so the cells' ``device: auto`` lands on ``cuda:0`` of a different card
per worker instead of all sharing the first. The GPUs are those the driver sees
(``CUDA_VISIBLE_DEVICES`` when set, else every CUDA device); without GPUs nothing is set.
A worker recycled after ``max_cells_per_worker`` cells hands its slot to its replacement."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from race.grid.cell import execute_cell, init_local_worker, ping
from race.spec.grid import RunnerSettings


def visible_gpus() -> list[str]:
    """The GPUs the driver may hand to workers: the ids in ``CUDA_VISIBLE_DEVICES`` when it
    is set, else ``0..n-1`` for torch's CUDA device count (none without CUDA or torch)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [x.strip() for x in env.split(",") if x.strip()]
        return [] if ids[:1] == ["-1"] else ids
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def default_workers(settings: RunnerSettings) -> int:
    """Cells in flight on the local runner: ``runner.workers`` when the grid sets it, else one
    per GPU the driver sees (:func:`visible_gpus`: one cell per GPU), else 2 (a 2-core CPU)."""
    if settings.workers is not None:
        return settings.workers
    return len(visible_gpus()) or 2


def worker_gpu_env(slot: int, gpus: list[str]) -> dict[str, str]:
    """The environment worker ``slot`` runs with: one GPU, round robin; nothing without GPUs."""
    return {"CUDA_VISIBLE_DEVICES": gpus[slot % len(gpus)]} if gpus else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _claim_slot(slots: Any) -> int:
    """The lowest slot no live worker holds (a recycled worker's replacement takes its slot)."""
    import multiprocessing.util

    with slots.get_lock():
        free = [i for i in range(len(slots)) if slots[i] == 0 or not _alive(slots[i])]
        slot = free[0] if free else os.getpid() % len(slots)
        slots[slot] = os.getpid()

    def release() -> None:
        with slots.get_lock():
            if slots[slot] == os.getpid():
                slots[slot] = 0

    multiprocessing.util.Finalize(None, release, exitpriority=10)
    return slot


def init_gpu_worker(slots: Any, gpus: list[str], *init_args: Any) -> None:
    """Pool initializer: claim a worker slot, set its GPU environment, then the usual
    worker setup (``init_local_worker``)."""
    if gpus:
        os.environ.update(worker_gpu_env(_claim_slot(slots), gpus))
    init_local_worker(*init_args)


class LocalExecutor:
    """Cells as futures of a ``ProcessPoolExecutor`` (spawn). A pool broken by a worker
    that died is replaced on the next submit; the cells it held count a failed attempt."""

    def __init__(self, settings: RunnerSettings, cell_fn: str):
        self.settings = settings
        self.cell_fn = cell_fn
        self.capacity = default_workers(settings)
        self.gpus = visible_gpus()
        self.description = f"local: {self.capacity} worker(s) x {settings.threads_per_worker} thread(s)"
        if self.gpus:
            self.description += f", one GPU each (round robin over {','.join(self.gpus)})"
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
            initializer=init_gpu_worker,
            initargs=(multiprocessing.get_context("spawn").Array("i", self.capacity), self.gpus, os.getpid(),
                      self.settings.threads_per_worker, self.settings.preload_torch, self.cell_fn),
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

    def submit_gang(self, specs: list[dict[str, Any]], run_dirs: list[str], gang_dir: str) -> cf.Future:
        """One gang as one task (``race.grid.gangs.execute_gang``)."""
        from race.grid.gangs import execute_gang

        if self._broken:
            self._make_pool()
        assert self._pool is not None
        return self._pool.submit(execute_gang, self.cell_fn, specs, run_dirs, gang_dir)

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
