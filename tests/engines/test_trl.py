"""The TRL engine and the TRL drop-in: run directory, budget stop, errors, the docs example,
and the cross-check with the built-in engine's accounting."""

from __future__ import annotations

from race.accounting import PolicyCost
import json
import re
from pathlib import Path

import pytest

from race.spec import ConfigError, run_config_from_dict

# the keys of every engine's run.json (race.engines.common.RunDir.finish)
RUN_KEYS = {"run_id", "name", "engine", "status", "stop_reason", "error", "budget_flops", "total_flops",
            "phase_flops", "steps", "wall_s", "phase_seconds", "model_params", "non_embedding_params", "initial",
            "final", "diagnostics", "resumed_from", "conventions", "config", "trajectory"}


def _cfg(model_dir: Path, **over):
    d = dict(engine="trl", model=str(model_dir), budget_flops=2.5e9, prompts_per_step=4, num_generations=4,
             max_completion_length=12, reward="random", learning_rate=1e-3, seed=3, checkpoint_every=2,
             drop_zero_variance_groups=False, torch_threads=1,
             eval={"n_problems": 8, "n_hard_problems": 4, "n_pass_problems": 4, "pass_k": 2, "num_points": 2})
    d.update(over)
    return run_config_from_dict(d)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_tiny_trl_run_stays_within_budget_and_writes_the_run_directory(tiny_model_dir, tmp_path):
    from race.engines import run_engine
    from race.engines.trl import TrlEngine

    cfg = _cfg(tiny_model_dir)
    run = tmp_path / "run"
    engine = TrlEngine(cfg, run)
    out = engine.run()
    assert set(out) == RUN_KEYS and out["engine"] == "trl"
    assert out["status"] == "complete" and out["stop_reason"] == "budget" and out["steps"] >= 2
    assert 0 < out["total_flops"] <= cfg.budget_flops
    ledger = _lines(run / "ledger.jsonl")
    assert sum(r["flops"] for r in ledger if r["counted"]) == out["total_flops"]
    assert {r["phase"] for r in ledger if r["flops"] > 0} >= {"rollout", "update", "recompute", "eval"}
    assert not any(r["counted"] for r in ledger if r["phase"] in ("recompute", "eval"))
    assert {r["step"] for r in ledger if r["counted"]} == set(range(1, out["steps"] + 1))
    # every step stayed under the bound the budget check used, and the next step would not have fit
    bound = engine.state.flops.step_bound(0, buffered=False)
    for s in range(1, out["steps"] + 1):
        assert 0 < sum(r["flops"] for r in ledger if r["counted"] and r["step"] == s) <= bound
    assert out["total_flops"] + bound > cfg.budget_flops
    for f in ("config.yaml", "metrics.jsonl", "report_card.json", "report_card.md", "report_card.tex", "run.json"):
        assert (run / f).exists(), f
    assert (run / "adapter" / "adapter_model.safetensors").exists()
    rows = _lines(run / "metrics.jsonl")
    evals = [r for r in rows if r["kind"] == "eval"]
    trains = [r for r in rows if r["kind"] == "train"]
    assert {r["target"] for r in evals} == {"greedy", "pass@k", "hard"}
    assert evals[0]["step"] == 0 and evals[-1]["step"] == out["steps"]
    assert [r["step"] for r in trains] == list(range(1, out["steps"] + 1))
    assert all({"reward_mean", "zero_var_frac", "trunc_rate", "loss", "lr"} <= set(r) for r in trains)
    assert trains[-1]["flops"] == out["total_flops"]
    card = json.loads((run / "report_card.json").read_text())
    assert card["total_flops"] == out["total_flops"] and sum(card["split"].values()) == out["total_flops"]
    vs = card["extra"]["vs_builtin"]
    assert card["extra"]["engine"] == "trl" and "no prompt prefix shared" in card["extra"]["trl_execution"]
    assert vs["rollout"]["trl"] > vs["rollout"]["builtin_same_shapes"] > 0  # TRL prefills every row
    assert vs["update"]["trl"] == out["phase_flops"]["update"] > 0
    assert "no shared prompt prefix" in (run / "report_card.md").read_text()
    # a second call returns the stored result without training again
    size = (run / "ledger.jsonl").stat().st_size
    assert run_engine(cfg, run) == out and (run / "ledger.jsonl").stat().st_size == size


def test_trl_specific_settings_are_refused_with_what_to_change(tiny_model_dir, tmp_path):
    from race.accounting import AccountingError
    from race.engines import run_engine
    from race.engines.trl import check_trl_config

    with pytest.raises(ConfigError, match="drop_zero_variance_groups: false"):
        check_trl_config(_cfg(tiny_model_dir, drop_zero_variance_groups=True))
    with pytest.raises(AccountingError, match="smaller than one step"):
        run_engine(_cfg(tiny_model_dir, budget_flops=1e6), tmp_path / "x")


def test_cross_check_with_the_builtin_engine(tiny_model_dir, tmp_path):
    """Same spec, same padded batch shapes: the built-in column is what the built-in
    engine's own accounting charges; the phases both engines execute alike are equal, the
    others differ by exactly the documented amounts."""
    from race.engines.builtin import BuiltinEngine
    from race.engines.trl_flops import (
        TrlStepPlan,
        compare_with_builtin,
        counted,
        generation_components,
        update_components,
    )

    spec = dict(prompts_per_step=2, num_generations=4, max_completion_length=12, num_iterations=2, beta=0.1,
                lora={"r": 4})
    builtin = BuiltinEngine(_cfg(tiny_model_dir, engine="builtin", **spec), tmp_path / "b")
    builtin.start()
    shape, lora, P, T, G = builtin.state.shape, builtin.state.lora, 20, 12, 4
    for ckpt in (False, True):
        rows = compare_with_builtin(PolicyCost(shape, lora), prompts=2, num_generations=G, prompt_len=P,
                                    completion_len=T, num_iterations=2, beta=0.1, gradient_checkpointing=ckpt)
        by = {r["key"]: r for r in rows}
        # the built-in column is the built-in engine's step cost at these shapes
        assert sum(r["builtin"] for r in rows) == builtin.step_bound(P)
        # the TRL column is what the TRL plan charges (counted) for one batch, plus hardware recompute
        plan = TrlStepPlan(per_device_train_batch_size=8, num_generations=G, num_iterations=2, beta=0.1)
        trl = counted(generation_components(plan, PolicyCost(shape, lora), n_seqs=8, prompt_len=P, completion_len=T))
        trl += 2 * counted(update_components(plan, PolicyCost(shape, lora), n_seqs=8, seq_len=P + T, completion_len=T,
                                             inputs_require_grad=ckpt))
        assert sum(r["trl"] for r in rows if not r["key"].startswith("recompute/")) == trl
        same = {k for k, r in by.items() if r["same"]}
        assert "rollout/decode" in same
        assert by["rollout/prefill"]["trl"] == G * by["rollout/prefill"]["builtin"]
        # the learning passes: the built-in engine runs each prompt once per group, the last token not at all
        for k in ("old_logprobs/layers", "reference/layers", "update/forward/layers", "update/backward/layers"):
            assert 0 < by[k]["builtin"] < by[k]["trl"] and "once for its G=4" in by[k]["why"], k
        assert ("layer-0 q/k/v" in by["update/backward/layers"]["why"]) == ckpt
        heads = 2 + 8 * (T - 1)  # each prompt's last position, then T-1 per row
        for k in ("old_logprobs/head", "reference/head", "update/forward/head", "update/backward/head"):
            assert by[k]["trl"] * heads == by[k]["builtin"] * 8 * (P + T - 1), k  # TRL: S-1 per row
        assert (by["recompute/forward"]["trl"] > 0) == ckpt and by["recompute/lm_head"]["trl"] > 0
        assert all(r["why"] for r in rows if not r["same"])


def test_docs_example_runs_and_stops_at_the_budget(tmp_path, monkeypatch):
    """The drop-in example of docs/trl.md, as written (a tiny random model)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "trl.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    import torch

    torch.set_num_threads(1)
    ns: dict = {}
    exec(compile(code, "docs/trl.md", "exec"), ns)
    race = ns["race"]
    assert race.stop_reason == "budget" and 0 < race.ledger.total <= 1e9
    assert race.ledger.total + race.next_step_bound(ns["trainer"].state) > 1e9  # the next step would not fit
    assert (tmp_path / "grpo-run" / "ledger.jsonl").exists() and (tmp_path / "grpo-run" / "report_card.md").exists()
    card = json.loads((tmp_path / "grpo-run" / "report_card.json").read_text())
    assert card["total_flops"] == race.ledger.total and card["lora_rank"] == 8


def test_callback_refuses_what_it_cannot_see(tiny_model_dir, tmp_path):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.accounting import AccountingError
    from race.engines.trl_callback import RaceFlopCallback, add_race_accounting
    from race.models import load_policy

    model, tok = load_policy(str(tiny_model_dir), device="cpu")
    ds = Dataset.from_dict({"prompt": ["Q:1+2\nA:"] * 8})
    args = GRPOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=4, max_steps=1, beta=0.1, report_to="none",
                      disable_tqdm=True)
    # full fine-tuning with beta != 0: the reference model is only visible through add_race_accounting
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [0.0] * len(completions), args=args,
                          train_dataset=ds, processing_class=tok, callbacks=[RaceFlopCallback(1e12)])
    with pytest.raises(AccountingError, match="add_race_accounting"):
        trainer.train()
    # a reward module is charged from its shape: one without a scoring head has none to read
    trainer.reward_funcs = [torch.nn.Linear(2, 2)]
    with pytest.raises(AccountingError, match="reward model Linear: no score/classifier Linear head"):
        add_race_accounting(trainer, 1e12)


def _strip_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


@pytest.mark.slow
def test_killed_trl_run_resumes_to_the_same_result(tiny_model_dir, tmp_path, monkeypatch):
    """Crash in step 4 (TRL checkpoint at step 2): the resumed run cuts the ledger and
    metrics back to step 2, redoes steps 3.., and ends with the records of an
    uninterrupted run (same seed, same process layout)."""
    from race.engines import run_engine
    from race.engines.trl import RaceReward

    cfg = _cfg(tiny_model_dir, budget_flops=2.5e9)
    full = run_engine(cfg, tmp_path / "full")
    assert full["steps"] >= 5

    calls = {"n": 0}
    original = RaceReward.__call__

    def crashing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt("killed")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RaceReward, "__call__", crashing)
    with pytest.raises(KeyboardInterrupt):
        run_engine(cfg, tmp_path / "r")
    assert {r["step"] for r in _lines(tmp_path / "r" / "ledger.jsonl")} == {0, 1, 2, 3}
    monkeypatch.setattr(RaceReward, "__call__", original)
    resumed = run_engine(cfg, tmp_path / "r")
    assert resumed["resumed_from"] == 2
    for f in ("ledger.jsonl", "metrics.jsonl"):
        assert _strip_seconds(_lines(tmp_path / "r" / f)) == _strip_seconds(_lines(tmp_path / "full" / f)), f
    drop = {"wall_s", "phase_seconds", "resumed_from"}
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}


def test_callback_in_callbacks_list_stops_at_the_budget(tiny_model_dir, tmp_path):
    """``callbacks=[RaceFlopCallback(...)]`` alone (no attach): LoRA, beta 0, TRL's own
    defaults otherwise (gradient checkpointing on)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from race.engines.trl_callback import RaceFlopCallback
    from race.models import load_policy

    model, tok = load_policy(str(tiny_model_dir), device="cpu")
    ds = Dataset.from_dict({"prompt": ["Q:1+2\nA:", "Q:33-4+5\nA:"] * 8})
    args = GRPOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=5, max_steps=50, report_to="none", disable_tqdm=True,
                      save_strategy="no")
    cb = RaceFlopCallback(2e8)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                          args=args, train_dataset=ds, processing_class=tok, callbacks=[cb],
                          peft_config=LoraConfig(r=2, task_type="CAUSAL_LM"))
    trainer.train()
    steps = trainer.state.global_step
    assert cb.stop_reason == "budget" and 2 <= steps < 50
    assert 0 < cb.ledger.total <= 2e8 and cb.ledger.total + cb.next_step_bound(trainer.state) > 2e8
    assert cb.lora is not None and cb.lora.targets == ("q_proj", "v_proj")  # PEFT's Qwen2 default
    keys = {r.key for r in cb.ledger}
    assert {"rollout/prefill", "rollout/decode", "update/forward", "update/backward", "recompute/forward",
            "recompute/lm_head"} <= keys and not any(k.startswith("old_logprobs") for k in keys)
    assert (tmp_path / "o" / "ledger.jsonl").exists() and (tmp_path / "o" / "report_card.json").exists()
    # the hooks are gone after training
    assert "generate" not in model.__dict__ and not model._forward_pre_hooks


@pytest.mark.slow
def test_non_finite_loss_stops_the_trl_run_and_keeps_the_last_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    from race.engines import run_engine
    from race.engines.trl import trainer as trl_trainer

    make = trl_trainer.trainer_class

    def poisoned():
        base = make()

        class Poisoned(base):
            def _compute_loss(self, model, inputs):
                loss = super()._compute_loss(model, inputs)
                return loss * float("nan") if self.state.global_step == 2 else loss

        return Poisoned

    monkeypatch.setattr(trl_trainer, "trainer_class", poisoned)
    out = run_engine(_cfg(tiny_model_dir, budget_flops=4e9), tmp_path / "d")
    assert out["status"] == "diverged" and out["stop_reason"] == "diverged" and "non-finite" in out["error"]
    assert out["steps"] == 3 and not (tmp_path / "d" / "adapter").exists()
    assert sorted(p.name for p in (tmp_path / "d" / "trl").glob("checkpoint-*")) == ["checkpoint-2"]


def test_builtin_same_shapes_shares_prompts_and_takes_a_partial_group():
    """The built-in column of a TRL report card: learning passes with each prompt once per
    group, below the unshared passes; a generation whose rows end in a partial group is
    still charged (its last prompt segment is smaller)."""
    from race.accounting import LoRA, learning_components
    from race.engines.trl_flops import builtin_same_shapes
    from race.models.refs import resolve_shape

    shape = resolve_shape("tiny-s")
    for rows in (8, 6):
        out = builtin_same_shapes(PolicyCost(shape, LoRA(8), "torch"), [(rows, 10, 8)], num_generations=4)
        plain = learning_components(shape, [18] * rows, [8] * rows, lora=LoRA(8), conventions="torch")
        assert 0 < out["update"] < plain["update/forward"] + plain["update/backward"]
