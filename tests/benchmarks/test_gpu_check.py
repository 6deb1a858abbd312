"""benchmarks/gpu_check.py in its reduced form (tiny shapes, CPU): the same checks the GPU run
makes, as one subprocess, the way CI and the GPU box run it. Every check must pass or say why
it was not tested; none may fail or be cut by the time guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
# checks that execute on a CPU and must pass there (the rest need CUDA, vLLM, DeepSpeed, ...)
MUST_PASS = {"trl_lora_beta0_mask_on", "trl_lora_beta0_mask_off", "trl_full_beta0.04_mask_off",
             "recompute_non_reentrant", "recompute_reentrant", "trl_reward_model", "builtin_measured_vs_analytic",
             "overhead_with_without_race", "phase_seconds_vs_wall"}


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)


@pytest.mark.slow
def test_reduced_gpu_check_passes_or_says_why(tmp_path):
    out = tmp_path / "gpu.json"
    proc = _run("--reduced", "--max-seconds", "1500", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    check_reduced_json(json.loads(out.read_text()), proc.stdout)


def check_reduced_json(data: dict, stdout: str) -> None:
    """What a reduced run's JSON and printout must show."""
    assert data["mode"] == "reduced" and data["device"] == "cpu" and data["tolerance"] == 1e-3
    checks = {c["name"]: c for c in data["checks"]}
    assert not [c for c in checks.values() if c["status"] in ("failed", "not_run")], checks
    assert {n for n, c in checks.items() if c["status"] == "passed"} == MUST_PASS
    for c in checks.values():
        if c["status"] == "not_tested":
            assert len(c["reason"]) > 20, c
            assert f"NOT TESTED: {c['name']}" in stdout
    s = data["summary"]
    assert s == {"passed": len(MUST_PASS), "failed": 0, "not_tested": len(checks) - len(MUST_PASS), "not_run": 0,
                 "ok": True}
    # the exactness checks compared real, non-zero counts step by step
    for name in ("trl_lora_beta0_mask_on", "trl_lora_beta0_mask_off", "trl_full_beta0.04_mask_off",
                 "trl_reward_model"):
        d = checks[name]["detail"]
        assert d["n_steps"] == 2 and d["max_rel"] <= 1e-3 and not d["unknown_keys"]
        assert d["steps"]["1"]["measured"]["rollout"] > 0
        assert all(st["measured"]["update/backward"] > 0 for st in d["steps"].values())
    steps = checks["trl_lora_beta0_mask_off"]["detail"]["steps"]  # num_iterations=2: old log-probs at step 1
    assert steps["1"]["ledger"]["old_logprobs"] > 0
    steps = checks["trl_full_beta0.04_mask_off"]["detail"]["steps"]  # a reference model, one generation per 2 steps
    assert steps["1"]["ledger"]["reference"] > 0 and steps["2"]["ledger"]["rollout"] == 0
    assert all(st["measured"]["reward"] > 0 for st in checks["trl_reward_model"]["detail"]["steps"].values())
    ratios = checks["phase_seconds_vs_wall"]["detail"]["ratios"]
    assert len(ratios) == 3 and all(r <= 1.001 for r in ratios)


def test_driver_isolates_failures_and_stops_at_the_time_guard(tmp_path, capsys, load_script):
    """A check that raises is FAILED with its error and the next one runs; NotTested is
    NOT TESTED with its reason; once a check's estimate would pass --max-seconds it and
    the rest are NOT RUN; the summary is not ok."""
    import time

    gc = load_script("benchmarks/gpu_check.py")
    ran = []

    def good(ctx):
        ran.append("good")
        return {"ok": True, "headline": "fine"}

    def bad(ctx):
        ran.append("bad")
        raise ZeroDivisionError("boom")

    def skipped(ctx):
        raise gc.NotTested("no such device here")

    def off(ctx):
        ran.append("off")
        return {"ok": False, "why": "3 != 4"}

    def costly(ctx):
        ran.append("costly")
        return {"ok": True}

    args = gc.parse_args(["--reduced"])
    ctx = gc.Ctx(reduced=True, device="cpu", dtype="float32", sizes=gc.Sizes.of(True), work=tmp_path, args=args)
    checks = [("a", bad, 0, 0), ("b", good, 0, 0), ("c", skipped, 0, 0), ("d", off, 0, 0), ("e", costly, 0, 50),
              ("f", good, 0, 0)]
    rows = gc.run_checks(ctx, checks, max_seconds=30, t0=time.perf_counter())
    assert ran == ["bad", "good", "off", "good"]
    st = {r["name"]: r for r in rows}
    assert [r["status"] for r in rows] == ["failed", "passed", "not_tested", "failed", "not_run", "passed"]
    assert st["a"]["error"] == "ZeroDivisionError: boom" and "boom" in st["a"]["traceback"]
    assert st["c"]["reason"] == "no such device here" and st["d"]["error"] == "3 != 4"
    assert "time guard" in st["e"]["reason"] and "--max-seconds 30" in st["e"]["reason"]
    assert gc.summary(rows) == {"passed": 2, "failed": 2, "not_tested": 1, "not_run": 1, "ok": False}
    printed = capsys.readouterr().out
    assert "NOT TESTED: c (" in printed and "NOT RUN: e" in printed and "FAILED: a" in printed
    gc.print_table(rows)
    assert "NOT_TESTED" in capsys.readouterr().out


def test_missing_imports_are_named_before_anything_runs(tmp_path, monkeypatch, load_script):
    gc = load_script("benchmarks/gpu_check.py")
    monkeypatch.setitem(gc.NEEDED, "race_no_such_module_xyz", "race-no-such-package")
    out = tmp_path / "gpu.json"
    assert gc.main(["--out", str(out)]) == 2
    data = json.loads(out.read_text())
    assert data["missing_imports"] == ["race-no-such-package"] and "gpu_setup.sh" in data["summary"]["error"]


def test_builtin_step_in_bfloat16_with_float32_adapters(tmp_path, load_script):
    """The built-in engine's check in bf16 (what a GPU runs by default), reduced on a CPU:
    ledger = FlopCounterMode, the base bf16 and the adapters fp32, a rate per phase."""
    gc = load_script("benchmarks/gpu_check.py")
    import gpu_check_trl

    ctx = gc.Ctx(reduced=True, device="cpu", dtype="bfloat16", sizes=gc.Sizes.of(True), work=tmp_path,
                 args=gc.parse_args(["--reduced", "--dtype", "bfloat16"]))
    out = gpu_check_trl.check_builtin_step(ctx)
    assert out["ok"], out["headline"]
    assert out["rel"] == {"rollout": 0.0, "learning": 0.0}
    assert out["dtype"] == "bfloat16" and out["adapter_dtypes"] == ["torch.float32"]
    assert out["rates"]["rollout"]["tokens_per_s"] > 0 and out["rates"]["update"]["flop_per_s"] > 0
    assert out["rates"]["update"]["mfu"] is None  # no peak for a CPU


def test_the_check_modules_import_in_one_direction():
    """No import circle among gpu_check.py and its modules (imports inside functions count):
    the shared pieces (context, sizes, tolerance, peak FLOP/s) live in gpu_check_base.py."""
    import ast

    mods = {p.stem: p for p in (ROOT / "benchmarks").glob("gpu_check*.py")}
    edges = {m: {a.name.split(".")[0] for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Import)
                 for a in n.names} | {n.module.split(".")[0] for n in ast.walk(ast.parse(p.read_text()))
                                       if isinstance(n, ast.ImportFrom) and n.module}
             for m, p in mods.items()}
    edges = {m: sorted(e & set(mods) - {m}) for m, e in edges.items()}
    assert "gpu_check_perf" not in edges["gpu_check_trl"] and edges["gpu_check_base"] == []

    def reaches(a: str, b: str, seen: frozenset = frozenset()) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n})) for n in edges[a])

    assert not [m for m in mods if reaches(m, m)], edges


def test_the_peak_table_is_the_projects_with_a_local_fallback(load_script):
    """peak_flops reads race.accounting.devices' table (an H100 in bf16); a device no table
    knows has none; mfu is F / (t P)."""
    load_script("benchmarks/gpu_check.py")
    import gpu_check_base

    from race.accounting.devices import peak_flops as project_peak

    got, source = gpu_check_base.peak_flops("NVIDIA H100 80GB HBM3", "bfloat16")
    assert got == project_peak("NVIDIA H100 80GB HBM3", "bfloat16") and got > 0
    assert source == "race.engines.trl.utilisation"
    assert gpu_check_base.peak_flops("cpu", "float32") == (None, "gpu_check_base (local table)")
    assert gpu_check_base.mfu(6.0, 2.0, 3.0) == 1.0
