"""Extension is resumption: a run seeded from a shorter run of its trajectory
(``race.engines.run_io.seed_extension``) resumes that run's last checkpoint with its own,
larger budget and ends where a fresh run of that budget ends: the same ledger rows, counted
FLOPs, metrics, per-problem outcomes, budget points and weights (wall seconds aside), also
when the extension is killed part-way and resumed. Real built-in engine runs, tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from race.engines.run_io import seed_extension
from race.spec.run import run_config_from_dict

from kill_resume import kill_after_step, lines, without_seconds

B_READ, B_SHORT, B_LONG = 1.5e9, 3e9, 8e9


def _cfg(model_dir: Path, budget: float, at: list[float], **over):
    d = dict(model=str(model_dir), budget_flops=budget, prompts_per_step=4, num_generations=4,
             max_completion_length=12, reward="random", learning_rate=1e-3, warmup_steps=2, seed=5,
             checkpoint_every=2, torch_threads=1,
             eval={"n_problems": 8, "n_hard_problems": 0, "n_pass_problems": 4, "pass_k": 2,
                   "targets": ["greedy", "pass@k"], "every_flops": 2e9, "at_budgets": at})
    d.update(over)
    return run_config_from_dict(d)


SUMMARY = ("status", "stop_reason", "total_flops", "phase_flops", "steps", "initial", "final", "diagnostics",
           "budget_points", "trajectory")


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


def test_an_extended_run_is_the_fresh_run_of_the_larger_budget(tiny_model_dir, tmp_path, monkeypatch):
    from race.engines import run_engine

    short = run_engine(_cfg(tiny_model_dir, B_SHORT, [B_READ]), tmp_path / "short")
    long_cfg = _cfg(tiny_model_dir, B_LONG, [B_READ, B_SHORT])
    fresh = run_engine(long_cfg, tmp_path / "fresh")
    assert short["steps"] < fresh["steps"] and short["trajectory"] == fresh["trajectory"]

    ext_dir = tmp_path / "extended"
    seed_extension(tmp_path / "short", ext_dir)
    kill_after_step(monkeypatch, long_cfg, ext_dir, short["steps"] + 3)  # killed part-way, after its own checkpoint
    ext = run_engine(long_cfg, ext_dir)

    for f in ("ledger.jsonl", "metrics.jsonl"):  # record for record: nothing charged twice, nothing lost
        assert without_seconds(lines(ext_dir / f)) == without_seconds(lines(tmp_path / "fresh" / f)), f
    assert {k: ext[k] for k in SUMMARY} == {k: fresh[k] for k in SUMMARY}
    assert [p["budget"] for p in ext["budget_points"]] == [B_READ, B_SHORT]
    assert ext["budget_points"][1] == {"budget": B_SHORT, "step": short["steps"], "flops": short["total_flops"]}
    assert ext["run_id"] == fresh["run_id"] == long_cfg.run_id()
    assert ext["extends"] == {k: short[k] for k in ("run_id", "budget_flops", "steps", "total_flops", "wall_s")}
    assert ext["wall_s"] >= short["wall_s"]  # the trajectory's seconds: the shorter run's are inside
    a, b = _weights(ext_dir), _weights(tmp_path / "fresh")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def test_a_seeded_directory_refuses_a_run_of_another_trajectory(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    run_engine(_cfg(tiny_model_dir, B_READ, []), tmp_path / "short")
    for i, other in enumerate([_cfg(tiny_model_dir, B_SHORT, [B_READ], learning_rate=5e-4),  # another allocation
                               _cfg(tiny_model_dir, B_SHORT, [B_READ], lr_scheduler_type="cosine")]):  # decays
        d = tmp_path / f"other{i}"
        seed_extension(tmp_path / "short", d)
        with pytest.raises(RuntimeError, match="not a shorter run of this one's trajectory"):
            run_engine(other, d)
    with pytest.raises(RuntimeError, match="no complete run"):
        seed_extension(tmp_path / "nothing", tmp_path / "x")
    assert json.loads((tmp_path / "other0" / "extends.json").read_text())["budget_flops"] == B_READ


def test_a_pilot_evaluating_fewer_targets_extends_into_the_full_run(tiny_model_dir, tmp_path):
    """A racing pilot evaluates only the decision's target; the target run that continues it
    evaluates every target: its training (ledger rows outside evaluation, train metrics, weights)
    is the fresh full-evaluation run's, step for step, and its own evaluations carry every target."""
    from race.engines import run_engine

    def cfg(budget, at, targets):
        c = _cfg(tiny_model_dir, budget, at)
        return c.model_copy(update={"eval": c.eval.model_copy(update={"targets": targets})})

    short = run_engine(cfg(B_SHORT, [B_READ], ["greedy"]), tmp_path / "short")
    full = cfg(B_LONG, [B_READ, B_SHORT], ["greedy", "pass@k"])
    fresh = run_engine(full, tmp_path / "fresh")
    assert short["trajectory"] == fresh["trajectory"]
    seed_extension(tmp_path / "short", tmp_path / "ext")
    ext = run_engine(full, tmp_path / "ext")

    def training(d):
        rows = [json.loads(x) for x in (d / "ledger.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows if r["phase"] != "eval"]

    def train_metrics(d):
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if "second" not in k} for r in rows if r.get("kind") == "train"]

    assert training(tmp_path / "ext") == training(tmp_path / "fresh")
    assert train_metrics(tmp_path / "ext") == train_metrics(tmp_path / "fresh")
    assert (ext["steps"], ext["total_flops"]) == (fresh["steps"], fresh["total_flops"])
    a, b = _weights(tmp_path / "ext"), _weights(tmp_path / "fresh")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    last = [json.loads(x) for x in (tmp_path / "ext" / "metrics.jsonl").read_text().splitlines()
            if json.loads(x).get("kind") == "eval"]
    assert {"greedy", "pass@k"} <= {r["target"] for r in last if r["step"] == ext["steps"]}
    assert {r["target"] for r in last if 0 < r["step"] <= short["steps"]} == {"greedy"}  # the pilot's own
