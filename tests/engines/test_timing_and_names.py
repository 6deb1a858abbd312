"""Per-phase seconds synchronize CUDA before reading the clock (one helper, both engines),
and TRL's loss types and reward scalings in the built-in engine leave its ledger as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from race.spec.run import run_config_from_dict


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=6e9, prompts_per_step=2, num_generations=4, max_completion_length=8,
             reward="random", learning_rate=1e-3, seed=3, max_steps=1, torch_threads=1,
             eval={"n_problems": 2, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"]})
    d.update(over)
    return run_config_from_dict(d)


@pytest.fixture
def syncs(monkeypatch):
    """Record torch.cuda.synchronize calls (a CPU machine has nothing to synchronize)."""
    import torch

    calls: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    return calls


def test_device_clock_synchronizes_cuda_only(syncs):
    import torch

    from race.models.timing import device_clock, is_cuda

    for dev in (torch.device("cuda", 1), "cuda", "cuda:0"):
        assert is_cuda(dev)
        device_clock(dev)
    assert syncs == [torch.device("cuda", 1), "cuda", "cuda:0"]
    for dev in (torch.device("cpu"), "cpu", None, "mps"):
        assert not is_cuda(dev)
        device_clock(dev)
    assert len(syncs) == 3


def _ledger(run: Path) -> dict:
    return {(r["step"], r["phase"], r["component"]): r["flops"] for r in map(json.loads, (run / "ledger.jsonl")
                                                                             .read_text().splitlines())}


def test_builtin_engine_times_phases_through_the_synchronizing_clock(tiny_model_dir, tmp_path, syncs, monkeypatch):
    import race.models.timing as timing
    from race.engines import run_engine

    run_engine(_cfg(tiny_model_dir), tmp_path / "cpu")
    assert syncs == []  # a CPU run never synchronizes
    monkeypatch.setattr(timing, "is_cuda", lambda device: True)  # the policy's device reads as CUDA
    run_engine(_cfg(tiny_model_dir), tmp_path / "cuda")
    # rollout (2 readings) and old-logprob / reference / update (2 each), one step
    assert len(syncs) == 8 and all(str(d) == "cpu" for d in syncs)
    assert _ledger(tmp_path / "cuda") == _ledger(tmp_path / "cpu")


def test_trl_loss_types_and_scalings_leave_the_builtin_ledger_unchanged(tiny_model_dir, tmp_path):
    """Same step-1 batch, same passes: the same FLOPs, while the update differs."""
    import torch
    from safetensors.torch import load_file

    from race.engines import run_engine

    ledgers, updates, clip, loss = {}, {}, {}, {}
    for name, over in {"dapo": {}, "cispo": {"loss_type": "cispo", "epsilon_high": 0.5},
                       "sapo": {"loss_type": "sapo"}, "batch": {"scale_rewards": "batch"},
                       "none": {"scale_rewards": False}}.items():
        run_engine(_cfg(tiny_model_dir, **over), tmp_path / name)
        ledgers[name] = _ledger(tmp_path / name)
        updates[name] = load_file(str(tmp_path / name / "adapter" / "adapter_model.safetensors"))
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        clip[name], loss[name] = next((r["clip_frac"], r["loss"]) for r in rows if r["kind"] == "train")
    assert all(led == ledgers["dapo"] for led in ledgers.values())
    assert sum(v for k, v in ledgers["dapo"].items() if k[1] == "update") > 0
    assert clip["dapo"] == 0 < clip["cispo"]  # on-policy ratio 1 is above cispo's cap of 0.5: capped
    assert loss["sapo"] != loss["dapo"]  # the gate's temperatures differ by the advantage's sign
    for name in ("batch", "none"):  # the scalings change the update
        assert any(not torch.equal(w, updates["dapo"][k]) for k, w in updates[name].items()), name
