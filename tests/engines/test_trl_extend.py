"""Extension is resumption on the TRL engine too: a TRL run seeded from a shorter run of its
trajectory (``race.engines.run_io.seed_extension`` copies its last ``trl/checkpoint-N``)
resumes it through ``Trainer.train(resume_from_checkpoint=...)`` with its own, larger
budget and ends where a fresh TRL run of that budget ends: the same ledger rows, metrics,
per-problem outcomes, budget points and adapter (wall seconds aside), also when the
extension is killed part-way and resumed; and a TRL run evaluated where a run of a smaller
budget would stop (``eval.at_budgets``) holds that run as its prefix. Real TRL runs, tiny
model.

Tolerance: none is needed on one CPU thread. TRL's arithmetic differs from the built-in
engine's (no shared prompt prefix, its own loss and sampler), but an extension runs the
same TRL code on the same tensors in the same order as the fresh run: the checkpoint holds
the adapter and AdamW's state bit for bit (safetensors / torch.save), the RNG states
(python, numpy, torch) that TRL's sampling draws from, the scheduler and the dataloader
position (``Trainer`` skips the batches already seen; the dataset's first batches do not
depend on the budget). So the comparisons are exact, as in the killed-and-resumed TRL test
(``test_trl.py``); a difference would be a resume that lost or repeated something.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from race.engines.run_io import last_checkpoint, seed_extension
from race.spec.run import run_config_from_dict

B_READ, B_SHORT, B_LONG = 1.0e9, 2.0e9, 4.4e9

pytestmark = pytest.mark.trl


def _cfg(model_dir: Path, budget: float, at: list[float], **over):
    d = dict(engine="trl", model=str(model_dir), budget_flops=budget, prompts_per_step=4, num_generations=4,
             max_completion_length=12, reward="random", learning_rate=1e-3, warmup_steps=2, seed=3,
             checkpoint_every=2, drop_zero_variance_groups=False, torch_threads=1,
             eval={"n_problems": 8, "n_hard_problems": 0, "n_pass_problems": 4, "pass_k": 2,
                   "targets": ["greedy", "pass@k"], "every_flops": 1.5e9, "at_budgets": at})
    d.update(over)
    return run_config_from_dict(d)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _no_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


SUMMARY = ("status", "stop_reason", "total_flops", "phase_flops", "steps", "initial", "final", "diagnostics",
           "budget_points", "trajectory", "run_id")


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


def _kill_at_reward_call(monkeypatch, cfg, run_dir: Path, call: int) -> None:
    """Run ``cfg`` into ``run_dir`` and kill it in its ``call``-th reward call (a step's
    rollout done, its update not), as ``test_trl.py``'s crash test does."""
    from race.engines import run_engine
    from race.engines.trl import RaceReward

    real = RaceReward.__call__
    calls = {"n": 0}

    def crashing(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt("killed")
        return real(self, *a, **k)

    monkeypatch.setattr(RaceReward, "__call__", crashing)
    with pytest.raises(KeyboardInterrupt):
        run_engine(cfg, run_dir)
    monkeypatch.setattr(RaceReward, "__call__", real)


def test_an_extended_trl_run_is_the_fresh_run_of_the_larger_budget(tiny_model_dir, tmp_path, monkeypatch):
    from race.engines import run_engine

    short = run_engine(_cfg(tiny_model_dir, B_SHORT, [B_READ]), tmp_path / "short")
    long_cfg = _cfg(tiny_model_dir, B_LONG, [B_READ, B_SHORT])
    fresh = run_engine(long_cfg, tmp_path / "fresh")
    assert short["engine"] == fresh["engine"] == "trl" and short["stop_reason"] == "budget"
    assert 3 <= short["steps"] < fresh["steps"] - 3 and short["trajectory"] == fresh["trajectory"]
    assert last_checkpoint(tmp_path / "short").name == f"checkpoint-{short['steps']}"  # the budget stop saved

    ext_dir = tmp_path / "extended"
    seed_extension(tmp_path / "short", ext_dir)
    assert (ext_dir / "trl" / f"checkpoint-{short['steps']}").is_dir()
    _kill_at_reward_call(monkeypatch, long_cfg, ext_dir, 4)  # three steps past the short run, its checkpoint between
    assert max(r["step"] for r in _lines(ext_dir / "ledger.jsonl")) == short["steps"] + 3
    ext = run_engine(long_cfg, ext_dir)

    for f in ("ledger.jsonl", "metrics.jsonl"):  # record for record: nothing charged twice, nothing lost
        assert _no_seconds(_lines(ext_dir / f)) == _no_seconds(_lines(tmp_path / "fresh" / f)), f
    assert {k: ext[k] for k in SUMMARY} == {k: fresh[k] for k in SUMMARY}
    assert [p["budget"] for p in ext["budget_points"]] == [B_READ, B_SHORT]
    assert ext["budget_points"][1] == {"budget": B_SHORT, "step": short["steps"], "flops": short["total_flops"]}
    assert ext["extends"] == {k: short[k] for k in ("run_id", "budget_flops", "steps", "total_flops", "wall_s")}
    assert ext["wall_s"] >= short["wall_s"] and ext["resumed_from"] > short["steps"]
    a, b = _weights(ext_dir), _weights(tmp_path / "fresh")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def test_a_trl_run_read_at_a_smaller_budget_holds_that_run_as_its_prefix(tiny_model_dir, tmp_path):
    """``eval.at_budgets`` on the TRL engine: the point where the run of B_SHORT stops is the
    short run's last step, with its FLOPs, training rows, counted ledger rows and evaluation."""
    from race.engines import run_engine

    short = run_engine(_cfg(tiny_model_dir, B_SHORT, []), tmp_path / "short")
    long = run_engine(_cfg(tiny_model_dir, B_LONG, [B_SHORT]), tmp_path / "long")
    (point,) = long["budget_points"]
    k = short["steps"]
    assert point == {"budget": B_SHORT, "step": k, "flops": short["total_flops"]} and long["steps"] > k

    def upto(run: str, kind: str) -> list[dict]:
        return _no_seconds([r for r in _lines(tmp_path / run / "metrics.jsonl") if r["kind"] == kind and r["step"] <= k])

    def counted(run: str) -> list[tuple]:
        return [(r["step"], r["phase"], r["component"], r["flops"]) for r in _lines(tmp_path / run / "ledger.jsonl")
                if r["counted"] and r["step"] <= k]

    assert upto("long", "train") == upto("short", "train") and counted("long") == counted("short")
    assert upto("long", "eval") == upto("short", "eval")  # the short run's final evaluation is the read at k


def test_a_seeded_trl_directory_refuses_a_run_of_another_trajectory(tiny_model_dir, tmp_path):
    from race.engines import run_engine

    run_engine(_cfg(tiny_model_dir, B_READ, []), tmp_path / "short")
    seed_extension(tmp_path / "short", tmp_path / "other")
    with pytest.raises(RuntimeError, match="not a shorter run of this one's trajectory"):
        run_engine(_cfg(tiny_model_dir, B_SHORT, [B_READ], learning_rate=5e-4), tmp_path / "other")
