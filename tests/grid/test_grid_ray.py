"""The Ray runner gives the same study as the local runner (on a local Ray cluster)."""

from __future__ import annotations

import json

import pytest

from race.grid import Store, run_grid

from .conftest import grid, snapshot

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_runner_matches_local_runner(tmp_path, ray_cluster):
    spec = grid(axes={"model": ["tiny-xs", "tiny-s", "flaky-xs"], "num_generations": [4]}, seeds=[0, 1])
    local = run_grid(spec, tmp_path / "local", poll_s=0.1)
    events = []
    via_ray = run_grid(spec, tmp_path / "ray", runner="ray", poll_s=0.1,
                       on_event=lambda e: events.append(e.kind))
    assert local.ok and via_ray.ok and via_ray.complete == local.complete == 12
    assert events.count("retry") == 4  # the flaky cells fail once on Ray too, then resume
    assert snapshot(tmp_path / "ray") == snapshot(tmp_path / "local")
    with Store(tmp_path / "ray") as s:
        runs = s.runs()
        assert s.integrity_check() == "ok"
    assert all(json.loads(r["run_json"])["omp_threads"] == "1" for r in runs)
    assert ray_cluster.is_initialized()  # a cluster the caller started is left running
    # a second session on Ray skips everything
    again = run_grid(spec, tmp_path / "ray", runner="ray", poll_s=0.1)
    assert again.ran == 0 and again.skipped_complete == 12


def test_ray_runner_trains_gangs_as_the_local_runner_does(tiny_model_dir, tmp_path, ray_cluster):
    """gang: true on Ray: a gang is one Ray task; the study equals the local runner's gangs
    (real built-in engine on the tiny model: gangs need it)."""
    from .test_grid_gangs import _grid, _stored

    spec = _grid(tiny_model_dir, seeds=[0], gang=True, gang_size=2)
    local = run_grid(spec, tmp_path / "local", poll_s=0.1)
    via_ray = run_grid(spec, tmp_path / "ray", runner="ray", poll_s=0.1)
    assert local.ok and via_ray.ok and via_ray.complete == local.complete == 4
    assert _stored(tmp_path / "ray") == _stored(tmp_path / "local")
    with Store(tmp_path / "ray", create=False) as s:
        members = {json.dumps(json.loads(r["run_json"])["gang"]["members"]) for r in s.runs()}
    assert len(members) == 2 and len(list((tmp_path / "ray" / "gangs").iterdir())) == 2
