"""Plans that speak GPU (issue 49): wall time and GPU-hours per cell, per rung and in all on a
device of the table, the MFU assumed, given or measured on a study's finished runs; the CPU
plan unchanged; workers default to the GPU count."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from race.accounting.devices import plan_device
from race.cli.app import app
from race.grid import Store, plan_grid
from race.grid.plan import default_seconds
from race.grid.pricing import ASSUMED_MFU, GPU_CELL_SECONDS, GPU_DECODE_SECONDS, GPU_STEP_SECONDS, measured_mfu, \
    parse_mfu, pricing
from race.grid.race_plan import plan_race
from race.spec.grid import grid_spec_from_dict

from .conftest import grid, write_grid
from .test_grid_race import race_grid
from .test_grid_spec import _fake_predict

H100 = 989.4e12  # bf16 dense (the table's h100 row)


def _cli(*args):
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, [str(a) for a in args])
    return res.exit_code, res.output


def test_the_gpu_formula_by_hand():
    """cell_s + n x (step_s + max(R / (P m_r), L x decode_s) + Lrn / (P m_l) + F / (P m_f))."""
    h = pricing("h100")
    n, L = 10, 256
    big = {"rollout": n * 5e14, "learning": n * 8e14, "feedback": n * 1e13}  # compute-bound rollout
    want = GPU_CELL_SECONDS + n * (GPU_STEP_SECONDS + 5e14 / (H100 * ASSUMED_MFU["rollout"])
                                   + 8e14 / (H100 * ASSUMED_MFU["learning"]) + 1e13 / (H100 * ASSUMED_MFU["feedback"]))
    assert h.run_seconds(n, big, dtype="bf16", completion_len=L) == pytest.approx(want, rel=1e-12)
    small = {"rollout": n * 1e11, "learning": n * 1e11, "feedback": 0.0}  # a small model: decoding is latency
    want = GPU_CELL_SECONDS + n * (GPU_STEP_SECONDS + L * GPU_DECODE_SECONDS + 1e11 / (H100 * ASSUMED_MFU["learning"]))
    assert h.run_seconds(n, small, dtype="bf16", completion_len=L) == pytest.approx(want, rel=1e-12)
    fp32 = h.run_seconds(n, big, dtype="fp32", completion_len=L) - GPU_CELL_SECONDS - n * GPU_STEP_SECONDS
    assert fp32 == pytest.approx((5e14 / 0.02 + 8e14 / 0.15 + 1e13 / 0.15) * n / 66.9e12, rel=1e-12)  # full FT
    assert h.hours(7200.0) == 2.0 and pricing("h100", gpus_per_cell=0.5).hours(7200.0) == 1.0


def test_mfu_is_given_one_for_all_or_per_phase_and_checked():
    assert parse_mfu("0.3") == {"rollout": 0.3, "learning": 0.3, "feedback": 0.3}
    assert parse_mfu("search=0.05, learning=0.4") == {"rollout": 0.05, "learning": 0.4, "feedback": 0.15}
    for bad in ("1.5", "rollout=0", "speed=0.3", "fast"):
        with pytest.raises(ValueError, match="--mfu"):
            parse_mfu(bad)
    fast = pricing("h200", mfu="0.5")
    assert fast.mfu_source == "--mfu" and fast.device.peak("bf16") == H100


def test_the_cpu_plan_is_the_old_plan():
    spec = grid_spec_from_dict(grid())
    old = plan_grid(spec, predictor=_fake_predict)
    cpu = plan_grid(spec, predictor=_fake_predict, price=pricing("cpu"))
    assert old.pricing.device.key == "cpu" and cpu.est_wall_s == old.est_wall_s
    for c in old.runnable:
        p = c.prediction
        assert p["est_seconds"] == pytest.approx(default_seconds(p["steps"], p["total"]), rel=1e-12)
        assert old.cell_hours(c) == pytest.approx(p["est_seconds"] / 3600, rel=1e-12)
    assert plan_device("cpu").peak("fp32") == 5e10  # the old constant, now the table's cpu row


def test_race_plan_device_h100_prints_gpu_hours_and_refuses_an_unknown_device():
    args = ["plan", "--budget", "1e18", "--models", "qwen2.5-0.5b,qwen2.5-7b", "--groups", "8", "--rewards", "rule"]
    code, out = _cli(*args, "--device", "h100")
    assert code == 0, out
    assert "wall (h100)" in out and "GPU-h" in out and "priced on h100" in out and "assumed, not measured" in out
    code, out = _cli(*args, "--device", "h100", "--json")
    rows = json.loads(out)
    h = pricing("h100")
    for r in rows:  # each row's time is the formula over its own steps and phase FLOPs
        assert r["device"] == "h100" and r["device_hours"] == pytest.approx(r["wall_s"] / 3600, rel=1e-12)
        steps = r["steps"]
        want = h.run_seconds(steps, {"rollout": r["search"] * r["total_flops"], "learning": r["learning"] *
                                     r["total_flops"], "feedback": r["feedback"] * r["total_flops"]},
                             dtype="bf16", completion_len=512)
        assert r["wall_s"] == pytest.approx(want, rel=1e-9)
    code, out = _cli(*args, "--device", "v100")
    assert code == 2 and "unknown device 'v100'" in out and "h100, h200, a100, l40s, cpu" in out
    code, out = _cli(*args)
    assert code == 0 and "GPU-h" not in out  # without a device the table is as it was


def test_race_grid_plan_prices_cells_and_the_total_on_a_gpu(tmp_path):
    g = write_grid(tmp_path / "g.yaml", grid())
    code, out = _cli("grid", "plan", g, "--device", "h100", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["device"]["name"] == "h100" and d["device"]["unit"] == "GPU" and d["device"]["mfu"] == ASSUMED_MFU
    assert d["device_hours"] == pytest.approx(sum(c["est_seconds"] for c in d["cells"]) / 3600, rel=1e-12)
    code, out = _cli("grid", "plan", g, "--device", "a100", "--mfu", "0.5", "--workers", "3")
    text = " ".join(out.split())
    assert code == 0 and "GPU-h" in text and "with 3 worker(s)" in text and "GPU-hours:" in text
    assert "MFU rollout 0.5, learning 0.5, feedback 0.5 (--mfu)" in text
    code, out = _cli("grid", "plan", g, "--device", "tpu")
    assert code == 2 and "unknown device 'tpu'" in out


def test_a_ray_grid_charges_its_gpus_per_cell(tmp_path):
    g = grid(runner={"kind": "ray", "gpus_per_cell": 0.5})
    code, out = _cli("grid", "plan", write_grid(tmp_path / "g.yaml", g), "--device", "h100", "--json")
    d = json.loads(out)
    assert d["device"]["gpus_per_cell"] == 0.5
    assert d["device_hours"] == pytest.approx(0.5 * sum(c["est_seconds"] for c in d["cells"]) / 3600, rel=1e-12)


def _study_with_timed_runs(tmp_path, seconds: dict[str, float], flops: dict[str, float]):
    """A study store holding one finished run whose ledger timed each phase."""
    spec = grid_spec_from_dict(grid())
    cells = spec.cells()
    with Store(tmp_path) as store:
        store.register_study(spec.study, spec.model_dump_json())
        store.add_cells(spec.study, cells)
        ledger = [{"step": 0, "phase": ph, "component": "x", "flops": flops[ph], "tokens": 1, "seconds": seconds[ph],
                   "counted": True} for ph in flops]
        store.ingest(cells[0].run_id, {"run": {"status": "complete", "steps": 1, "total_flops": sum(flops.values()),
                                               "wall_s": 100.0}, "ledger": ledger, "evals": [], "train": []})
    return spec, cells[0]


def test_the_mfu_is_measured_on_the_studys_finished_runs(tmp_path):
    flops = {"rollout": 3e12, "update": 4e12, "old_logprobs": 1e12, "reward": 0.0}
    seconds = {"rollout": 2.0, "update": 1.0, "old_logprobs": 1.0, "reward": 0.0}
    spec, cell = _study_with_timed_runs(tmp_path, seconds, flops)
    peak = plan_device("h100").peak("bf16")  # the cell trains LoRA: bf16 on a GPU
    got = measured_mfu(tmp_path, plan_device("h100"))
    assert got["runs"] == 1 and set(got["mfu"]) == {"rollout", "learning"}  # feedback was never timed
    assert got["mfu"]["rollout"] == pytest.approx(3e12 / (2.0 * peak), rel=1e-12)
    assert got["mfu"]["learning"] == pytest.approx(5e12 / (2.0 * peak), rel=1e-12)
    price = pricing("h100", study_dir=tmp_path)
    assert price.mfu["rollout"] == got["mfu"]["rollout"] and price.mfu["feedback"] == ASSUMED_MFU["feedback"]
    assert "measured on 1 finished run(s)" in price.mfu_source and "the other phases assumed" in price.mfu_source
    assert pricing("h100", mfu="0.4", study_dir=tmp_path).mfu_source == "--mfu"  # --mfu wins
    p = plan_grid(spec, predictor=_fake_predict, study_dir=tmp_path, price=price)
    assert any("calibrated on 1 finished run" in n for n in p.notes)  # the wall time calibration, as on the CPU
    raw = plan_grid(spec, predictor=_fake_predict, price=price)
    ran = next(c for c in raw.cells if c.cell.run_id == cell.run_id)
    assert p.time_scale == pytest.approx(100.0 / ran.prediction["est_seconds"], rel=1e-12)
    code, out = _cli("grid", "plan", write_grid(tmp_path / "g.yaml", grid()), "--device", "h100", "--study-dir",
                     tmp_path)
    assert code == 0 and "measured on 1 finished run(s)" in " ".join(out.split())


def test_a_racing_plan_prices_each_rung_in_gpu_hours(tmp_path):
    from race.protocol.racing import race_schedule

    spec = grid_spec_from_dict(race_grid())
    sched = race_schedule(spec, _fake_predict)
    p = plan_race(spec, sched, predictor=_fake_predict, price=pricing("h100"))
    for end in ("schedule", "least", "all"):
        e = p.race[end]
        assert len(e["rungs"]) == 3 and e["rungs"][0]["cells"] == 8
        assert e["device_hours"] == pytest.approx(sum(r["device_hours"] for r in e["rungs"]), rel=1e-12)
        assert e["est_wall_s"] == pytest.approx(sum(r["est_wall_s"] for r in e["rungs"]), rel=1e-12)
        assert e["pilot_budget"] == pytest.approx(sum(r["pilot_budget"] for r in e["rungs"]), rel=1e-12)
    assert p.race["all"]["rungs"][1]["cells"] == 4 and p.race["least"]["rungs"][1]["cells"] == 1
    assert [r["cells"] for r in p.race["schedule"]["rungs"]] == [8, *sched.keep[1:]]
    first = p.race["all"]["rungs"][0]
    assert first["device_hours"] == pytest.approx(sum(p.cell_hours(c) for c in p.runnable), rel=1e-12)
    assert p.race["least"]["device_hours"] < p.race["all"]["device_hours"]
    code, out = _cli("grid", "plan", write_grid(tmp_path / "r.yaml", race_grid()), "--device", "h100")
    text = " ".join(out.split())
    assert code == 0 and "race schedule: 3 rungs" in text and "rung 0 (T/32)" in text and "race in all (" in text


def test_workers_default_to_the_cuda_device_count(monkeypatch):
    import torch

    from race.grid.local import default_workers
    from race.spec.grid import RunnerSettings

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert default_workers(RunnerSettings()) == 4  # one cell per GPU
    assert default_workers(RunnerSettings(workers=3)) == 3  # the grid's setting wins
    spec = grid_spec_from_dict({**grid(), "runner": {"kind": "local"}})
    assert plan_grid(spec, predictor=_fake_predict).workers == 4
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert default_workers(RunnerSettings()) == 2 and plan_grid(spec, predictor=_fake_predict).workers == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3,5")
    assert default_workers(RunnerSettings()) == 3  # the driver's own restriction counts


def test_evaluations_are_priced_as_rollouts_on_a_gpu():
    from race.spec.run import RunConfig

    cfg = RunConfig(model="tiny-s", budget_flops=1e16, prompts_per_step=8, num_generations=8,
                    max_completion_length=256, eval={"targets": ["greedy", "pass@k"], "n_problems": 200,
                                                     "n_pass_problems": 50, "pass_k": 4, "num_points": 4})
    h = pricing("h100")
    rows, points, batches = 200 + 50 * 4, 1 + 4, 2  # step 0 and 4 points; 400 rows in 2 loops of <= 256
    small = {"steps": 10, "rollout": 10 * 64 * 1e9, "learning": 1e12, "feedback": 0.0}  # decoding is latency
    assert h.eval_seconds(small, cfg) == pytest.approx(points * batches * 256 * GPU_DECODE_SECONDS, rel=1e-12)
    big = {"steps": 10, "rollout": 10 * 64 * 1e13, "learning": 1e15, "feedback": 0.0}  # decoding is FLOPs
    assert h.eval_seconds(big, cfg) == pytest.approx(points * rows * 1e13 / (H100 * ASSUMED_MFU["rollout"]), rel=1e-12)
    assert h.cell_seconds(big, cfg) == pytest.approx(
        h.run_seconds(10, big, dtype="bf16", completion_len=256) + h.eval_seconds(big, cfg), rel=1e-12)
    nested = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"at_budgets": [1e15, 3e15]})})
    assert h.eval_seconds(small, nested) == pytest.approx((points + 2) / points * h.eval_seconds(small, cfg))
    assert pricing("cpu").eval_seconds(big, cfg) == 0.0  # the CPU model counts them in its fixed costs


def test_a_ray_cluster_of_gpu_nodes_runs_one_cell_per_gpu_by_default():
    pytest.importorskip("ray")
    from race.grid.ray_runner import ray_capacity
    from race.spec.grid import RunnerSettings

    two_nodes = {"CPU": 64.0, "GPU": 16.0}
    assert ray_capacity(RunnerSettings(kind="ray", gpus_per_cell=1), two_nodes) == 16
    assert ray_capacity(RunnerSettings(kind="ray", gpus_per_cell=0.5), two_nodes) == 32
    assert ray_capacity(RunnerSettings(kind="ray", cpus_per_cell=8, gpus_per_cell=1), two_nodes) == 8  # CPUs bind
    assert ray_capacity(RunnerSettings(kind="ray"), two_nodes) == 64  # CPU cells: the CPUs
    assert ray_capacity(RunnerSettings(kind="ray", workers=5, gpus_per_cell=1), two_nodes) == 5
    assert ray_capacity(RunnerSettings(kind="ray", gpus_per_cell=1), {"CPU": 8.0}) == 1  # no GPU: at least one


@pytest.mark.parametrize("size", ["0.5b", "1.5b", "7b"])
def test_the_qwen_gpu_pilots_plan_without_weights_as_docs_gpu_md_says(size, monkeypatch, tmp_path):
    from pathlib import Path

    from race.grid import load_grid_spec

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the grids' data paths are relative to the checkout
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # nothing downloaded: priced from the presets
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    spec = load_grid_spec(root / "configs" / f"grid-qwen-gpu-{size}.yaml")
    hours = {}
    for device in ("h100", "a100", "l40s"):
        p = plan_grid(spec, price=pricing(device))
        assert len(p.runnable) == 8 and not p.refused and all(c.prediction for c in p.cells)
        hours[device] = p.device_hours
    row = next(line for line in (root / "docs" / "gpu.md").read_text().splitlines()
               if line.startswith(f"| Qwen2.5-{size[:-1]}B |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert [float(cells[3]), float(cells[4]), float(cells[5])] == [
        float(f"{hours[d]:.2g}") for d in ("h100", "a100", "l40s")]  # the table is what the plan prints
