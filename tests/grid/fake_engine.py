"""A real, cheap cell function: the grid's test double for ``race.engines.run_engine``.

It follows docs/run-format.md: writes ``config.yaml``, ``ledger.jsonl``, ``metrics.jsonl``
(train rows each step, eval rows per target at step 0, at FLOP intervals and at the end)
and ``run.json`` (last, atomically); it is deterministic given the config (numpy RNG
seeded from seed and run id); it checkpoints after every step and resumes from the
checkpoint (truncating the jsonl files to the checkpointed sizes, so a step cut short is
redone, never duplicated); on a complete run it returns the stored run.json. A run directory seeded to extend a shorter
run (``extends.json``, ``race.engines.run_io.seed_extension``) resumes that run's checkpoint
with its own budget and says so in run.json (``extends``), as the built-in engine does.

Behaviour switches (for tests):
- ``model: fail-<size>``  raises at step 2 on every attempt;
- ``model: flaky-<size>`` raises at step 2 on the first attempt only (then resumes);
- ``model: crash-<size>`` SIGKILLs its own process at step 2 on the first attempt only;
- env ``RACE_FAKE_STEP_SLEEP=<seconds>`` sleeps after each step.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

MODEL_PARAMS = {"xs": 57_000, "s": 101_000, "m": 327_000, "l": 760_000}
PHASES = ("rollout", "old_logprobs", "reference", "reward", "update", "recompute", "eval")
BASE_SKILL = {"xs": 0.30, "s": 0.40, "m": 0.50, "l": 0.55}


class FakeEngineError(RuntimeError):
    pass


def _size(name: str) -> str:
    return name.rsplit("-", 1)[-1]


def model_params(name: str) -> int:
    return MODEL_PARAMS.get(_size(name), 200_000)


def step_ledger(cfg: Any) -> list[dict[str, Any]]:
    """Counted FLOPs of one GRPO step (fixed shapes, so deterministic)."""
    n = model_params(cfg.model)
    p, g = cfg.prompts_per_step, cfg.num_generations
    lp, lc = cfg.max_prompt_length, cfg.max_completion_length
    seq = p * g * (lp + lc)
    rows = [("rollout", "prefill", 2 * n * p * lp, p * lp), ("rollout", "decode", 2 * n * p * g * lc, p * g * lc)]
    if cfg.num_iterations > 1:
        rows.append(("old_logprobs", "forward", 2 * n * seq, seq))
    if cfg.beta > 0:
        rows.append(("reference", "forward", 2 * n * seq, seq))
    kind, rm = cfg.reward.kind, cfg.reward.target  # the parsed spec (race.spec.reward.RewardSpec)
    rows.append(("reward", kind, 2 * model_params(rm) * seq if rm else 0, p * g))
    rows.append(("update", "forward", 2 * n * seq * cfg.num_iterations, seq * cfg.num_iterations))
    rows.append(("update", "backward", 4 * n * seq * cfg.num_iterations, seq * cfg.num_iterations))
    return [{"phase": ph, "component": c, "flops": int(f), "tokens": int(t), "counted": True} for ph, c, f, t in rows]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _evaluate(cfg: Any, rng: np.random.Generator, step: int, flops: float) -> list[dict[str, Any]]:
    skill = BASE_SKILL.get(_size(cfg.model), 0.4) + 0.2 * min(1.0, flops / cfg.budget_flops) * (cfg.learning_rate / 1e-4) ** 0.1
    sizes = {"greedy": cfg.eval.n_problems, "pass@k": cfg.eval.n_pass_problems, "hard": cfg.eval.n_hard_problems}
    rows = []
    for target in cfg.eval.targets:
        n = sizes[target]
        if n == 0:
            continue
        p = {"greedy": skill, "pass@k": min(0.99, skill * 1.5), "hard": skill * 0.3}[target]
        per = (rng.random(n) < p).astype(int).tolist()
        rows.append({"kind": "eval", "step": step, "flops": flops, "target": target,
                     "score": sum(per) / n, "n": n, "per_problem": per})
    return rows


def run_engine(cfg: Any, run_dir: Path, progress: Any = None) -> dict[str, Any]:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_file = run_dir / "run.json"
    if run_file.exists():
        stored = json.loads(run_file.read_text())
        if stored.get("status") == "complete":
            return stored
    behaviour = cfg.model.split("-", 1)[0]
    sleep_s = float(os.environ.get("RACE_FAKE_STEP_SLEEP", "0") or 0)
    run_id = cfg.run_id()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=True))
    ledger_f, metrics_f = run_dir / "ledger.jsonl", run_dir / "metrics.jsonl"
    ckpt_dir = run_dir / "checkpoint"
    ckpt_dir.mkdir(exist_ok=True)
    ckpt = ckpt_dir / "state.json"
    step_rows = step_ledger(cfg)
    step_flops = sum(r["flops"] for r in step_rows)
    every = cfg.eval.every_flops or cfg.budget_flops / cfg.eval.num_points
    t_start = time.time()

    if ckpt.exists():
        st = json.loads(ckpt.read_text())
        if st.get("run_id", run_id) != run_id:  # a seeded extension: the shorter run's checkpoint
            ext_f = run_dir / "extends.json"
            ext = json.loads(ext_f.read_text()) if ext_f.exists() else {}
            if ext.get("run_id") != st["run_id"]:
                raise FakeEngineError(f"{run_dir} holds a checkpoint of another run ({st['run_id']})")
            st.update(run_id=run_id, extends={k: ext[k] for k in ("run_id", "budget_flops", "steps", "total_flops",
                                                                   "wall_s")})
        for f, key in ((ledger_f, "ledger_bytes"), (metrics_f, "metrics_bytes")):
            with f.open("r+b") as fh:
                fh.truncate(st[key])
        rng = np.random.default_rng()
        rng.bit_generator.state = st["rng"]
        st["resumed_from"].append(st["step"])
    else:
        ledger_f.write_text("")
        metrics_f.write_text("")
        rng = np.random.default_rng([cfg.seed, int(run_id, 16)])
        evals = _evaluate(cfg, rng, 0, 0.0)
        _append(metrics_f, evals)
        _append(ledger_f, [{"step": 0, "phase": "eval", "component": "generate", "flops": 1000 * len(evals),
                            "tokens": 0, "seconds": 0.0, "counted": False}])
        st = {"run_id": run_id, "step": 0, "flops": 0, "next_eval": every, "last_eval_step": 0, "wall": 0.0, "resumed_from": [],
              "initial": {e["target"]: e["score"] for e in evals}, "final": {e["target"]: e["score"] for e in evals},
              "zv_sum": 0.0, "tr_sum": 0.0, "phase_seconds": {}, "uncounted": {"eval": 1000 * len(evals)}}

    wall_before = st["wall"]

    def checkpoint() -> None:
        st["wall"] = wall_before + (time.time() - t_start)
        st["rng"] = rng.bit_generator.state
        st["ledger_bytes"] = ledger_f.stat().st_size
        st["metrics_bytes"] = metrics_f.stat().st_size
        _write_atomic(ckpt, json.dumps(st))

    checkpoint()
    stop = "budget"
    while True:
        if cfg.max_steps is not None and st["step"] >= cfg.max_steps:
            stop = "max_steps"
            break
        if st["flops"] + step_flops > cfg.budget_flops:
            break
        if st["step"] == 2 and behaviour == "fail":
            raise FakeEngineError(f"fake engine: model {cfg.model!r} always fails at step 2")
        if st["step"] == 2 and behaviour == "flaky" and not (run_dir / "flaky-failed-once").exists():
            (run_dir / "flaky-failed-once").write_text("1")
            raise FakeEngineError(f"fake engine: model {cfg.model!r} fails once at step 2")
        if st["step"] == 2 and behaviour == "crash" and not (run_dir / "crashed-once").exists():
            (run_dir / "crashed-once").write_text("1")
            os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies, as under the OOM killer
        t0 = time.perf_counter()
        st["step"] += 1
        st["flops"] += step_flops
        draws = rng.random(4)
        secs = time.perf_counter() - t0
        _append(ledger_f, [{"step": st["step"], **r, "seconds": secs / len(step_rows)} for r in step_rows])
        zv, tr = float(draws[1] * 0.3), float(draws[2] * 0.05)
        st["zv_sum"] += zv
        st["tr_sum"] += tr
        _append(metrics_f, [{"kind": "train", "step": st["step"], "flops": st["flops"], "reward_mean": float(draws[0]),
                             "reward_std": 0.2, "zero_var_frac": zv, "trunc_rate": tr,
                             "completion_len": float(10 + 10 * draws[3]), "loss": float(draws[3] - 0.5),
                             "lr": cfg.learning_rate, "seconds": secs}])
        for r in step_rows:
            st["phase_seconds"][r["phase"]] = st["phase_seconds"].get(r["phase"], 0.0) + secs / len(step_rows)
        if st["flops"] >= st["next_eval"]:
            evals = _evaluate(cfg, rng, st["step"], float(st["flops"]))
            _append(metrics_f, evals)
            st["final"] = {e["target"]: e["score"] for e in evals}
            st["last_eval_step"] = st["step"]
            while st["next_eval"] <= st["flops"]:
                st["next_eval"] += every
        if progress is not None:
            progress({"step": st["step"], "flops": st["flops"]})
        if sleep_s:
            time.sleep(sleep_s)
        checkpoint()
    if st["last_eval_step"] != st["step"]:
        evals = _evaluate(cfg, rng, st["step"], float(st["flops"]))
        _append(metrics_f, evals)
        st["final"] = {e["target"]: e["score"] for e in evals}
        st["last_eval_step"] = st["step"]
    checkpoint()

    phase_flops = {p: 0 for p in PHASES}
    for r in step_rows:
        phase_flops[r["phase"]] += r["flops"] * st["step"]
    phase_flops["eval"] = st["uncounted"]["eval"]
    steps = max(1, st["step"])
    run = {
        "run_id": run_id, "name": cfg.name, "engine": "fake", "status": "complete", "stop_reason": stop,
        "budget_flops": cfg.budget_flops, "total_flops": st["flops"], "phase_flops": phase_flops,
        "steps": st["step"], "wall_s": st["wall"], "phase_seconds": st["phase_seconds"],
        "model_params": model_params(cfg.model), "final": st["final"], "initial": st["initial"],
        "diagnostics": {"zero_var_frac": st["zv_sum"] / steps, "trunc_rate": st["tr_sum"] / steps},
        "resumed_from": st["resumed_from"], "omp_threads": os.environ.get("OMP_NUM_THREADS"), "config": cfg.model_dump(mode="json"),
    }
    if st.get("extends"):
        run["extends"] = st["extends"]
    _write_atomic(run_file, json.dumps(run, sort_keys=True))
    return run
