"""Ray runner: the same cells as Ray tasks, on a local Ray started for the run or on an
existing cluster (``ray_address``), with ``cpus_per_cell``/``gpus_per_cell`` resources.

Workers return results to the driver exactly as in the local runner. With ``gang: true``
a gang is one Ray task (``race.grid.gangs.execute_gang``) holding ``cpus_per_cell`` /
``gpus_per_cell`` for the whole gang: those resources are per unit of work, a cell alone
or a gang. On a multi-node
cluster the study directory must be on a filesystem every node sees (run directories
hold the checkpoints a restarted cell resumes from), and ``race`` (plus a file-path
``cell_fn``) must be installed/present on every node.
"""

from __future__ import annotations

from typing import Any

from race.grid.cell import execute_cell, set_threads
from race.grid.gangs import execute_gang
from race.spec.grid import RunnerSettings


def ray_cell(cell_fn: str, spec: dict[str, Any], run_dir: str, threads: int, preload_torch: bool) -> dict[str, Any]:
    """Body of the Ray task."""
    set_threads(threads, preload_torch)
    return execute_cell(cell_fn, spec, run_dir)


def ray_gang(cell_fn: str, specs: list[dict[str, Any]], run_dirs: list[str], gang_dir: str, threads: int,
             preload_torch: bool) -> dict[str, Any]:
    """Body of a gang's Ray task: the gang trains in this worker (``execute_gang``)."""
    set_threads(threads, preload_torch)
    return execute_gang(cell_fn, specs, run_dirs, gang_dir)


def ray_capacity(settings: RunnerSettings, resources: dict[str, float]) -> int:
    """Cells in flight on a Ray cluster: ``runner.workers`` when set, else as many as the
    cluster's CPUs hold at ``cpus_per_cell`` and, with ``gpus_per_cell``, its GPUs at
    ``gpus_per_cell`` (one cell per GPU on a cluster of GPU nodes), at least 1."""
    if settings.workers:
        return settings.workers
    fits = [int(resources.get("CPU", 1.0) // settings.cpus_per_cell)]
    if settings.gpus_per_cell > 0:
        fits.append(int(resources.get("GPU", 0.0) // settings.gpus_per_cell))
    return max(1, min(fits))


class RayExecutor:
    """Cells and gangs as Ray tasks (``max_retries=0``: the grid driver does the retrying)."""

    def __init__(self, settings: RunnerSettings, cell_fn: str):
        try:
            import ray
        except ImportError as e:
            raise RuntimeError("runner kind 'ray' needs Ray: pip install 'race-rl[ray]'") from e
        self._ray = ray
        self.settings = settings
        self.cell_fn = cell_fn
        self._started = False
        if not ray.is_initialized():
            ray.init(address=settings.ray_address, include_dashboard=False, log_to_driver=False)
            self._started = True
        self.capacity = ray_capacity(settings, ray.cluster_resources())
        resources = dict(num_cpus=settings.cpus_per_cell, num_gpus=settings.gpus_per_cell, max_retries=0)
        self._task = ray.remote(ray_cell).options(**resources)
        self._gang_task = ray.remote(ray_gang).options(**resources)  # per gang: one unit of work
        where = settings.ray_address or ("local Ray (started here)" if self._started else "existing Ray session")
        self.description = (f"ray: {where}, {self.capacity} cell(s) in flight x {settings.cpus_per_cell:g} CPU"
                            + (f" + {settings.gpus_per_cell:g} GPU" if settings.gpus_per_cell else ""))
        self._inflight: set[Any] = set()

    def submit(self, spec: dict[str, Any], run_dir: str) -> Any:
        ref = self._task.remote(self.cell_fn, spec, run_dir, self.settings.threads_per_worker,
                                self.settings.preload_torch)
        self._inflight.add(ref)
        return ref

    def submit_gang(self, specs: list[dict[str, Any]], run_dirs: list[str], gang_dir: str) -> Any:
        """One gang as one Ray task, with one cell's resources."""
        ref = self._gang_task.remote(self.cell_fn, specs, run_dirs, gang_dir, self.settings.threads_per_worker,
                                     self.settings.preload_torch)
        self._inflight.add(ref)
        return ref

    def wait(self, handles: list[Any], timeout: float) -> list[tuple[Any, dict[str, Any]]]:
        if not handles:
            return []
        ready, _ = self._ray.wait(handles, num_returns=1, timeout=timeout)
        if ready:  # collect everything else already done too
            ready, _ = self._ray.wait(handles, num_returns=len(handles), timeout=0)
        out = []
        for ref in ready:
            self._inflight.discard(ref)
            try:
                out.append((ref, self._ray.get(ref)))
            except Exception as e:  # worker crash, OOM kill, node loss
                out.append((ref, {"ok": False, "error": f"Ray task failed: {type(e).__name__}: {e}"}))
        return out

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for ref in list(self._inflight):
                try:
                    self._ray.cancel(ref, force=True)
                except Exception:
                    pass
        self._inflight.clear()
        if self._started:
            self._ray.shutdown()
            self._started = False
