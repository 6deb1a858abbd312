"""The utilisation arithmetic of the TRL drop-in's logs: the peak-FLOP/s table and the MFU
formula (pure functions)."""

from __future__ import annotations

import pytest


def test_peak_table_matches_device_names_and_dtypes():
    from race.engines.trl.utilisation import dtype_name, peak_flops

    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", "torch.bfloat16") == 756.5e12  # PCIe before the SXM default
    assert peak_flops("NVIDIA H200", "fp32") == 66.9e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "float16") == 312e12
    assert peak_flops("NVIDIA L40S", "bf16") == 362.05e12 and peak_flops("NVIDIA L4", "bf16") == 121e12
    assert peak_flops("NVIDIA A10G", "tf32") == 62.5e12 and peak_flops("NVIDIA A100 80GB PCIe", "tf32") == 156e12
    assert peak_flops("cpu", "fp32") is None and peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    assert peak_flops("NVIDIA H100", "int4") is None
    assert dtype_name("torch.float32") == "fp32" and dtype_name("half") == "fp16" and dtype_name("int8") is None


def test_mfu_and_friends_follow_their_formulas():
    from race.engines.trl.utilisation import gpu_hours, imbalance, mfu, tokens_per_second

    assert mfu(3e12, 2.0, 6e12) == pytest.approx(0.25)
    assert mfu(0, 1.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="seconds > 0"):
        mfu(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="peak > 0"):
        mfu(1.0, 1.0, 0.0)
    assert tokens_per_second(300, 1.5) == pytest.approx(200.0)
    assert gpu_hours(1800, 4) == pytest.approx(2.0)
    assert imbalance([1, 1]) == 1.0 and imbalance([3, 1]) == pytest.approx(1.5) and imbalance([0, 0]) == 1.0


def _expected(records, world: int, peak: float | None) -> dict:
    """What the ledger's records up to a log entry imply, recomputed here from the raw records."""
    from collections import defaultdict

    flops, tokens, seconds = defaultdict(int), defaultdict(int), defaultdict(float)
    for r in records:
        if r.counted:
            flops[r.phase] += r.flops
            tokens[r.phase] += r.tokens
            seconds[r.phase] += r.seconds
    out = {}
    for ph in flops:
        if seconds[ph] > 0:
            out[f"race/tokens_per_s/{ph}"] = tokens[ph] / seconds[ph]
            if peak:
                out[f"race/mfu/{ph}"] = flops[ph] / (seconds[ph] * world * peak)
    out["race/gpu_hours"] = world * sum(r.seconds for r in records) / 3600
    out["race/flops_spent"] = sum(r.flops for r in records if r.counted or r.phase == "overrun")
    return out


def _run(model_dir, out, **kw):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(str(model_dir), device="cpu", attn_implementation="eager")
    args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=4, max_steps=2, report_to="none", disable_tqdm=True,
                      save_strategy="no", activation_checkpointing=False, seed=0, logging_steps=1)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["Q:1+2\nA:", "Q:12+30-4\nA:"] * 4}),
                          processing_class=tok)
    cb = add_race_accounting(trainer, budget_flops=1e13, **kw)
    trainer.train()
    return trainer, cb


def test_utilisation_keys_reach_the_log_history_and_equal_the_ledger(tiny_model_dir, tmp_path):
    trainer, cb = _run(tiny_model_dir, tmp_path, peak_flops=2e12)  # a user-given peak (a CPU has none in the table)
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        want = _expected([r for r in cb.ledger if r.step <= h["step"]], 1, 2e12)
        assert {"race/mfu/rollout", "race/mfu/update", "race/tokens_per_s/rollout", "race/tokens_per_s/update"} <= set(want)
        for k, v in want.items():
            assert h[k] == pytest.approx(v, rel=1e-9, abs=0), k
        assert not {k for k in h if k.startswith(("race/mfu/", "race/tokens_per_s/"))} - set(want)
        assert 0 < h["race/mfu/update"] and h["race/gpu_hours"] > 0
        assert h["race/imbalance/flops"] == h["race/imbalance/seconds"] == 1.0  # one process
        assert h["race/flops_spent"] == h["race/flops"]  # nothing overran
    # TRL's own total_flos is the ledger's counted total (train metrics and checkpoints carry it)
    assert trainer.state.total_flos == float(cb.ledger.total) > 0
    final = trainer.state.log_history[-1]
    assert final["total_flos"] == float(cb.ledger.total)


def test_mfu_without_a_peak_is_omitted_with_one_note(tiny_model_dir, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="race.engines.trl.wiring"):
        trainer, cb = _run(tiny_model_dir, tmp_path)
    notes = [r.getMessage() for r in caplog.records if "race/mfu/* not logged" in r.getMessage()]
    assert len(notes) == 1 and "no peak FLOP/s for device 'cpu' at fp32" in notes[0] and "peak_flops=" in notes[0]
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert steps and not any(k.startswith("race/mfu/") for h in steps for k in h)
    assert all("race/tokens_per_s/update" in h and "race/gpu_hours" in h for h in steps)


def test_utilisation_values_from_a_ledger_by_hand():
    """The rules of race.engines.trl.usage on a ledger written by hand: executed prefill in
    place of the charged one for rollout MFU, weight-sync seconds outside the rollout's,
    overrun in the spent total, no rollout MFU for a vLLM server, imbalance over ranks."""
    from race.accounting import FlopLedger
    from race.engines.trl.usage import utilisation_values

    led = FlopLedger(budget=1e6)
    led.add_components(1, {"rollout/prefill": 4000, "rollout/decode": 1000, "rollout/weight_sync": 0,
                           "executed/rollout_prefill": 1000, "update/forward": 2000, "update/backward": 4000},
                       tokens={"rollout/prefill": 40, "rollout/decode": 10, "update/forward": 50},
                       seconds={"rollout/prefill": 1.0, "rollout/decode": 1.0, "rollout/weight_sync": 3.0,
                                "update/forward": 0.5, "update/backward": 1.5})
    led.record_overrun(2, {"update/forward": 500})
    v = utilisation_values(led, world=2, peak=100.0, rank_flops=[7000, 4000], rank_seconds=[5.0, 5.0])
    assert v["race/mfu/rollout"] == pytest.approx((1000 + 1000) / (2.0 * 2 * 100.0))  # executed prefill + decode
    assert v["race/tokens_per_s/rollout"] == pytest.approx(50 / 2.0)  # the 3 s of weight sync left out
    assert v["race/mfu/update"] == pytest.approx(6000 / (2.0 * 2 * 100.0))
    assert v["race/seconds/weight_sync"] == 3.0 and v["race/gpu_hours"] == pytest.approx(2 * 7.0 / 3600)
    assert v["race/flops_spent"] == 11000 + 500 == led.total + 500
    assert v["race/imbalance/flops"] == pytest.approx(7000 / 5500) and v["race/imbalance/seconds"] == 1.0
    server = utilisation_values(led, world=2, peak=100.0, remote_rollout=True)
    assert "race/mfu/rollout" not in server and "race/mfu/update" in server
    assert not any(k.startswith("race/mfu/") for k in utilisation_values(led, peak=None))
