"""The local runner gives each worker its own GPU through CUDA_VISIBLE_DEVICES (faked
device lists: this machine has no GPU)."""

from __future__ import annotations

import json

import pytest

import race.grid.local as local
from race.grid.local import LocalExecutor, visible_gpus, worker_gpu_env
from race.spec.grid import RunnerSettings


def test_one_gpu_per_worker_round_robin_and_none_without_gpus(monkeypatch):
    assert [worker_gpu_env(i, ["0", "1"]) for i in range(3)] == [
        {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}, {"CUDA_VISIBLE_DEVICES": "0"}]
    assert worker_gpu_env(0, []) == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert visible_gpus() == ["2", "3"]  # the driver's own restriction is kept
    for empty in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", empty)
        assert visible_gpus() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert visible_gpus() == ["0", "1"]


PROBE = '''
import json, os, time
from pathlib import Path

def go(cfg, run_dir):
    """Hold the worker until {n} workers each hold a cell, then report this one's GPU."""
    gate = Path({gate!r})
    (gate / str(os.getpid())).touch()
    t0 = time.time()
    while len(list(gate.iterdir())) < {n} and time.time() - t0 < 120:
        time.sleep(0.05)
    out = {{"status": "complete", "pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}}
    (run_dir / "run.json").write_text(json.dumps(out))
    return out
'''


@pytest.mark.parametrize("gpus,workers,want", [(["0", "1"], 2, ["0", "1"]), (["0", "1"], 3, ["0", "0", "1"]),
                                               ([], 2, [None, None]), (["0", "1", "2"], None, ["0", "1", "2"])])
def test_worker_environments_name_one_gpu_each(tmp_path, monkeypatch, gpus, workers, want):
    """``workers`` unset: one worker per GPU (``race.grid.local.default_workers``)."""
    monkeypatch.setattr(local, "visible_gpus", lambda: list(gpus))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gate = tmp_path / "gate"
    gate.mkdir()
    probe = tmp_path / "probe.py"
    ex = LocalExecutor(RunnerSettings(workers=workers, preload_torch=False), f"{probe}:go")
    workers = ex.capacity
    assert workers == len(want)
    probe.write_text(PROBE.format(gate=str(gate), n=workers))
    try:
        assert ("one GPU each" in ex.description) == bool(gpus)
        futs = [ex.submit({"budget_flops": 1e9}, str(tmp_path / f"c{i}")) for i in range(workers)]
        assert all(f.result(timeout=180)["ok"] for f in futs)
    finally:
        ex.close()
    runs = [json.loads((tmp_path / f"c{i}" / "run.json").read_text()) for i in range(workers)]
    assert len({r["pid"] for r in runs}) == workers  # every worker held one cell at once
    assert sorted((r["gpu"] for r in runs), key=str) == sorted(want, key=str)
