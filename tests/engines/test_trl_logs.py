"""The TRL drop-in puts RACE's FLOPs into TRL's logs (what ``report_to`` reports), times
phases through the synchronizing clock, and the TRL engine micro-batches a step with TRL's
``per_device_train_batch_size`` / ``gradient_accumulation_steps`` at an unchanged ledger."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from race.spec.run import run_config_from_dict


def test_flops_reach_trls_logs_and_equal_the_ledger(tiny_model_dir, tmp_path, monkeypatch):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import race.models.timing as timing
    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    syncs: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(timing, "is_cuda", lambda device: True)  # the policy's device reads as CUDA

    class Reporter(TrainerCallback):  # stands for W&B / TensorBoard: logs what on_log hands it
        rows: list = []

        def on_log(self, args, state, control, logs=None, **kw):
            self.rows.append(dict(logs))

    model, tok = load_policy(str(tiny_model_dir), device="cpu")
    ds = Dataset.from_dict({"prompt": ["Q:1+2\nA:", "Q:33-4+5\nA:"] * 8})
    args = GRPOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=5, max_steps=3, report_to="none", disable_tqdm=True,
                      save_strategy="no", logging_steps=1, activation_checkpointing=False)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                          args=args, train_dataset=ds, processing_class=tok, callbacks=[Reporter()],
                          peft_config=LoraConfig(r=2, task_type="CAUSAL_LM"))
    race = add_race_accounting(trainer, budget_flops=5e8)
    names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    assert names.index("RaceFlopCallback") < names.index("Reporter")  # before the reporting callbacks
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2, 3]
    by_step: dict = defaultdict(lambda: defaultdict(int))
    for r in race.ledger:
        by_step[r.step][r.phase] += r.flops
    for h in steps:
        counted = {ph: sum(by_step[s][ph] for s in by_step if s <= h["step"]) for ph in
                   ("rollout", "update", "reward", "recompute")}
        total = counted["rollout"] + counted["update"] + counted["reward"]
        assert h["race/flops"] == total > 0
        assert h["race/flops/rollout"] == counted["rollout"] and h["race/flops/update"] == counted["update"]
        assert h["race/flops/recompute"] == counted["recompute"] > 0  # recorded, not counted
        assert h["race/budget_fraction"] == pytest.approx(total / 5e8)
        assert h["race/split/search"] == pytest.approx(counted["rollout"] / total)
        assert h["race/split/learning"] == pytest.approx(counted["update"] / total)
        assert h["race/split/feedback"] == 0
    assert steps[-1]["race/flops"] == race.ledger.total
    reported = [r for r in Reporter.rows if "loss" in r]
    assert [r["race/flops"] for r in reported] == [h["race/flops"] for h in steps]
    # every per-phase reading synchronized the (pretend-CUDA) policy device first
    assert syncs and all(str(d) == "cpu" for d in syncs)
    assert all(r.seconds >= 0 for r in race.ledger) and sum(r.seconds for r in race.ledger) > 0


def _cfg(model_dir, **over):
    d = dict(engine="trl", model=str(model_dir), budget_flops=1e10, prompts_per_step=2, num_generations=4,
             max_completion_length=6, reward="random", learning_rate=1e-3, seed=3, max_steps=1,
             drop_zero_variance_groups=False, torch_threads=1, lora={"r": 4},
             eval={"n_problems": 2, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"]})
    d.update(over)
    return run_config_from_dict(d)


def test_trl_engine_micro_batches_with_the_same_ledger(tiny_model_dir, tmp_path):
    """gradient_accumulation_steps=2 runs the step's 8 sequences as 2 micro-batches of 4: the
    same generation, the same FLOPs; TRL gets TRL's names and values."""
    from race.engines import run_engine
    from race.engines.trl import TrlEngine

    def ledger(run):
        out: dict = defaultdict(int)
        for r in map(json.loads, (run / "ledger.jsonl").read_text().splitlines()):
            out[(r["step"], r["phase"], r["component"])] += r["flops"]
        return dict(out)

    run_engine(_cfg(tiny_model_dir), tmp_path / "one")
    micro = _cfg(tiny_model_dir, gradient_accumulation_steps=2, loss_type="sapo", scale_rewards="batch")
    engine = TrlEngine(micro, tmp_path / "micro")
    engine.run()
    a = engine.state.trainer.args
    assert (a.per_device_train_batch_size, a.gradient_accumulation_steps, a.steps_per_generation) == (4, 2, 2)
    assert (a.generation_batch_size, a.loss_type, a.scale_rewards) == (8, "sapo", "batch")
    assert engine.state.flops.plan.gradient_accumulation_steps == 2 and not engine.state.flops.plan.needs_old_logprobs
    one, two = ledger(tmp_path / "one"), ledger(tmp_path / "micro")
    assert two == one and sum(v for k, v in one.items() if k[1] == "update") > 0
    assert len(engine.state.flops.tracker.generations) == 1  # one generation fed both micro-batches
