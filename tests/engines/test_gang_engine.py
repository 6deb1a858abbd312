"""The gang engine: members' run directories and ledgers equal their solo runs', the gang
step executes what the members' ledgers charge (FlopCounterMode), refusals, and a
SIGKILLed gang resumes to the uninterrupted gang's results."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from race.spec.run import run_config_from_dict

#: loss statistics come out of sums over differently blocked matmuls: equal to float32
#: rounding of values of order 1, accumulated over a few hundred terms (see test_gang_forward)
LOSS_KEYS = ("loss", "kl", "clip_frac")


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=2.5e9, prompts_per_step=4, num_generations=4,
             max_completion_length=12, reward="random", learning_rate=1e-3, seed=3, checkpoint_every=2,
             lora={"r": 4, "lora_alpha": 8},
             eval={"n_problems": 8, "n_hard_problems": 4, "n_pass_problems": 4, "pass_k": 2, "num_points": 2},
             torch_threads=1)
    d.update(over)
    return run_config_from_dict(d)


def _members(model_dir: Path):
    """Three members that differ in seed, group size, iterations, beta, micro-batches,
    optimizer steps per generation, loss, LoRA targets and budget (they leave at different
    steps)."""
    return [_cfg(model_dir),
            _cfg(model_dir, seed=4, num_generations=2, budget_flops=1.5e9, num_iterations=2, beta=0.05,
                 loss_type="grpo", lora={"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]}),
            _cfg(model_dir, seed=5, prompts_per_step=3, per_device_train_batch_size=3, gradient_accumulation_steps=2,
                 steps_per_generation=4, budget_flops=2e9, lr_scheduler_type="cosine")]  # 2 optimizer steps a batch


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


def _close(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        if k in LOSS_KEYS:
            if not math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-6):
                return False
        elif a[k] != b[k]:
            return False
    return True


def test_members_write_their_solo_run_directories(tiny_model_dir, tmp_path):
    """Each member's ledger equals its solo run's key by key (FLOPs, tokens, steps; seconds
    aside); its metrics too (loss statistics to float rounding); its run.json the solo's
    plus the gang's composition. Token-level equality holds unless a sampled uniform lands
    within float rounding (~1e-7) of a CDF step, about 1e-7 x ~3,000 draws per run here."""
    from race.engines import run_engine
    from race.engines.gang import run_gang

    cfgs = _members(tiny_model_dir)
    outs = run_gang([(c, tmp_path / f"g{i}") for i, c in enumerate(cfgs)], tmp_path / "gang")
    steps = set()
    for i, (c, out) in enumerate(zip(cfgs, outs)):
        solo = run_engine(c, tmp_path / f"s{i}")
        g, s = tmp_path / f"g{i}", tmp_path / f"s{i}"
        assert _strip(_lines(g / "ledger.jsonl")) == _strip(_lines(s / "ledger.jsonl")), i
        gm, sm = _lines(g / "metrics.jsonl"), _lines(s / "metrics.jsonl")
        assert len(gm) == len(sm) and all(_close(a, b) for a, b in zip(gm, sm)), i
        assert sorted(p.name for p in g.iterdir()) == sorted(p.name for p in s.iterdir())
        assert (g / "adapter" / "adapter_model.safetensors").exists()
        assert out.keys() - solo.keys() == {"gang"}
        for k in ("steps", "total_flops", "phase_flops", "status", "stop_reason", "run_id", "initial", "final"):
            assert out[k] == solo[k], (i, k)
        assert out["gang"]["members"] == [c.run_id() for c in cfgs] and out["gang"]["index"] == i
        assert out["gang"]["rollout_flops_executed"] > 0 and out["phase_flops"]["rollout"] > 0
        assert json.loads((g / "run.json").read_text()) == out
        steps.add(out["steps"])
    assert len(steps) > 1  # members left at different steps
    again = run_gang([(c, tmp_path / f"g{i}") for i, c in enumerate(cfgs)], tmp_path / "gang")
    assert again == outs  # a finished gang does not train again


def test_gang_step_executes_what_the_member_ledgers_charge(tiny_model_dir, tmp_path, gang_step_flops):
    """Under torch conventions, FlopCounterMode over a gang step equals the sum over its
    members of what their ledgers charge for that step, with the rollout as the gang
    executed it (one batched decode over padded prompts and slots: ``FastRollout.executed``;
    the ledgers charge each member's solo rollout, and record their share of it apart)."""
    from race.engines.gang import run_gang

    measured, executed = gang_step_flops
    cfgs = [c.model_copy(update={"conventions": "torch", "budget_flops": c.budget_flops / 2})
            for c in _members(tiny_model_dir)]
    run_gang([(c, tmp_path / f"g{i}") for i, c in enumerate(cfgs)], tmp_path / "gang")
    ledgers = [_lines(tmp_path / f"g{i}" / "ledger.jsonl") for i in range(len(cfgs))]
    assert len(measured) >= 3
    for step, flops in measured.items():
        charged = sum(r["flops"] for i, led in enumerate(ledgers) if i in executed[step] for r in led
                      if r["step"] == step and r["counted"] and r["phase"] != "rollout")
        assert flops == charged + sum(executed[step].values()), step


def test_gangs_refuse_cells_that_cannot_share_a_base(tiny_model_dir, tmp_path):
    from race.engines.gang import GangEngine, gang_key

    a = _cfg(tiny_model_dir)
    for bad, msg in ((dict(lora=None), "needs LoRA"), (dict(lora={"r": 4, "lora_dropout": 0.1}), "lora_dropout"),
                     (dict(max_completion_length=10), "max_completion_length"), (dict(), "same run twice")):
        with pytest.raises(ValueError, match=msg):
            GangEngine([(a, tmp_path / "a"), (_cfg(tiny_model_dir, **bad), tmp_path / "b")], tmp_path / "g")
    assert gang_key(a) == gang_key(_cfg(tiny_model_dir, seed=9, num_generations=2)) is not None


DRIVER = """
import json, sys
from pathlib import Path
from race.engines.gang import run_gang
from race.spec.run import run_config_from_dict
spec = json.loads(Path(sys.argv[1]).read_text())
run_gang([(run_config_from_dict(c), Path(d)) for c, d in spec["members"]], Path(spec["gang"]))
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkilled_gang_resumes_to_the_uninterrupted_result(tiny_model_dir, tmp_path):
    from race.engines.gang import run_gang

    cfgs = [c.model_copy(update={"budget_flops": c.budget_flops * 2}) for c in _members(tiny_model_dir)]
    ref = run_gang([(c, tmp_path / f"r{i}") for i, c in enumerate(cfgs)], tmp_path / "ref")
    spec = {"members": [(c.model_dump(mode="json"), str(tmp_path / f"k{i}")) for i, c in enumerate(cfgs)],
            "gang": str(tmp_path / "killed")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "spec.json")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    state = tmp_path / "killed" / "checkpoint" / "gang.json"
    try:
        deadline = time.time() + 300
        while True:  # kill once the gang has checkpointed past step 2 and some members are live
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the gang made no progress"
            try:
                st = json.loads(state.read_text())
            except (OSError, ValueError):
                st = None
            if st and st["step"] >= 3 and not all(st["left"]):
                break
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not all((tmp_path / f"k{i}" / "run.json").exists() for i in range(len(cfgs)))
    out = run_gang([(c, tmp_path / f"k{i}") for i, c in enumerate(cfgs)], tmp_path / "killed")
    assert any(o["resumed_from"] for o in out)
    for i, (a, b) in enumerate(zip(ref, out)):
        for f in ("ledger.jsonl", "metrics.jsonl"):
            assert _strip(_lines(tmp_path / f"r{i}" / f)) == _strip(_lines(tmp_path / f"k{i}" / f)), (i, f)
        for k in ("steps", "total_flops", "phase_flops", "final", "initial", "status"):
            assert a[k] == b[k], (i, k)


def test_kill_after_a_member_left_but_before_the_gang_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    """A member has finished (its run.json written) when the gang dies before checkpointing
    its departure: the gang resumes from its previous checkpoint with that member still in
    it, so every step runs with the same members as uninterrupted, and every member ends
    with the uninterrupted gang's ledger and metrics."""
    from race.engines.gang import engine, run_gang

    cfgs = _members(tiny_model_dir)
    ref = run_gang([(c, tmp_path / f"r{i}") for i, c in enumerate(cfgs)], tmp_path / "ref")
    real = engine.GangEngine._checkpoint
    seen = {"left": 0}

    def dying(self, step):
        if sum(self.left) > seen["left"]:
            raise KeyboardInterrupt("killed after a member left")
        return real(self, step)

    monkeypatch.setattr(engine.GangEngine, "_checkpoint", dying)
    with pytest.raises(KeyboardInterrupt):
        run_gang([(c, tmp_path / f"k{i}") for i, c in enumerate(cfgs)], tmp_path / "killed")
    gone = [i for i in range(len(cfgs)) if (tmp_path / f"k{i}" / "run.json").exists()]
    assert len(gone) == 1  # one member finished, the others were cut off
    monkeypatch.setattr(engine.GangEngine, "_checkpoint", real)
    out = run_gang([(c, tmp_path / f"k{i}") for i, c in enumerate(cfgs)], tmp_path / "killed")
    for i, (a, b) in enumerate(zip(ref, out)):
        for f in ("ledger.jsonl", "metrics.jsonl"):
            assert _strip(_lines(tmp_path / f"r{i}" / f)) == _strip(_lines(tmp_path / f"k{i}" / f)), (i, f)
        assert a["final"] == b["final"] and a["steps"] == b["steps"]


def test_a_diverging_member_leaves_and_the_others_go_on(tiny_model_dir, tmp_path, monkeypatch):
    """A non-finite loss in one member's update retires that member as ``diverged`` (as
    its solo run would end: no adapter, the error said), without an optimizer step; the
    other members finish as usual."""
    import torch

    from race.engines.gang import run_gang, step

    real = step.grpo_loss

    def nan_for_grpo(logp, *a, **kw):
        loss, st = real(logp, *a, **kw)
        if kw["loss_type"] == "grpo":  # member 1 alone uses the grpo loss
            loss = loss * torch.tensor(float("nan"))
        return loss, st

    monkeypatch.setattr(step, "grpo_loss", nan_for_grpo)
    cfgs = _members(tiny_model_dir)
    outs = run_gang([(c, tmp_path / f"g{i}") for i, c in enumerate(cfgs)], tmp_path / "gang")
    assert outs[1]["status"] == "diverged" and "non-finite loss" in outs[1]["error"]
    assert not (tmp_path / "g1" / "adapter").exists()
    assert all(outs[i]["status"] == "complete" and outs[i]["steps"] > outs[1]["steps"] for i in (0, 2))


def test_an_overrun_member_leaves_as_its_solo_run_stops(tiny_model_dir, tmp_path, monkeypatch):
    """With step bounds too low, a member's exact cost after its rollout does not fit: it
    records the rollout as ``overrun`` and stops on budget, as its solo run does (the
    same ledger, overrun records included)."""
    from race.engines import builtin, run_engine
    from race.engines.gang import run_gang

    real = builtin.BuiltinEngine.step_bound
    monkeypatch.setattr(builtin.BuiltinEngine, "step_bound", lambda self, *a, **k: real(self, *a, **k) // 4)
    cfgs = _members(tiny_model_dir)
    outs = run_gang([(c, tmp_path / f"g{i}") for i, c in enumerate(cfgs)], tmp_path / "gang")
    overruns = 0
    for i, (c, out) in enumerate(zip(cfgs, outs)):
        solo = run_engine(c, tmp_path / f"s{i}")
        g, s = _lines(tmp_path / f"g{i}" / "ledger.jsonl"), _lines(tmp_path / f"s{i}" / "ledger.jsonl")
        assert _strip(g) == _strip(s), i
        assert out["stop_reason"] == solo["stop_reason"] == "budget" and out["steps"] == solo["steps"]
        overruns += sum(r["phase"] == "overrun" for r in g)
    assert overruns > 0
