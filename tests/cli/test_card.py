"""`race card OUTPUT_DIR`: the report card rebuilt from a TRL run's RACE ledgers (a real tiny
TRL run; hand-made rank files merged; a directory without ledgers refused)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from race.cli.app import app

CARD_FILES = ("report_card.json", "report_card.md", "report_card.tex")


def _invoke(*args):
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["card", *[str(a) for a in args]])
    return res.exit_code, res.output


def test_card_rebuilt_from_a_real_trl_run_equals_the_callbacks(tiny_model_dir, tmp_path):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(str(tiny_model_dir), device="cpu")
    out = tmp_path / "run"
    args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=4, max_steps=2, report_to="none", disable_tqdm=True,
                      save_strategy="steps", save_steps=1, gradient_checkpointing=False, seed=0, logging_steps=1)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["Q:1+2\nA:", "Q:9-1\nA:"] * 4}),
                          processing_class=tok, peft_config=LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"))
    cb = add_race_accounting(trainer, budget_flops=1e12, conventions="torch")
    trainer.train()
    original = json.loads((out / "report_card.json").read_text())
    # the keys W&B gets (docs/trl.md's recipe): transformers' rewrite_logs prefixes train/
    from transformers.integrations.integration_utils import rewrite_logs

    logged = rewrite_logs(next(h for h in trainer.state.log_history if "race/flops" in h))
    assert logged["train/race/flops"] > 0 and "train/race/flops/rollout" in logged
    assert (out / "checkpoint-2" / "adapter_config.json").exists()
    for f in CARD_FILES:  # as after a crash: the ledger is there, the card is not
        (out / f).unlink()
    code, printed = _invoke(out, "--budget", "1e12", "--num-generations", "4", "--conventions", "torch")
    assert code == 0, printed
    assert all((out / f).exists() for f in CARD_FILES) and "Compute report card" in printed
    rebuilt = json.loads((out / "report_card.json").read_text())
    same = ("total_flops", "phase_flops", "hardware_flops", "steps", "tokens", "budget_flops", "num_generations",
            "lora_rank", "model_params", "conventions", "conventions_text", "split", "shares", "seconds")
    assert {k: rebuilt[k] for k in same} == {k: original[k] for k in same}
    assert rebuilt["total_flops"] == cb.ledger.total > 0 and rebuilt["steps"] == 2
    assert rebuilt["extra"]["rebuilt_from"] == ["ledger.jsonl"] and rebuilt["extra"]["model_from"] == "checkpoint-2"
    assert rebuilt["model"] == str(tiny_model_dir)  # the adapter's base model
    # a second rebuild reads budget, group size and conventions from the card now present
    code, printed = _invoke(out, "--out", tmp_path / "again")
    assert code == 0, printed
    again = json.loads((tmp_path / "again" / "report_card.json").read_text())
    assert {k: again[k] for k in same} == {k: original[k] for k in same}


def _line(step, phase, comp, flops, tokens=0, seconds=0.0, counted=True):
    return json.dumps({"step": step, "phase": phase, "component": comp, "flops": flops, "tokens": tokens,
                       "seconds": seconds, "counted": counted}) + "\n"


def test_rank_files_are_merged_over_the_steps_every_rank_recorded(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    r0 = (_line(1, "rollout", "decode", 100, tokens=10, seconds=2.0) + _line(1, "update", "forward", 50, seconds=1.0)
          + _line(1, "recompute", "forward", 7, counted=False) + _line(2, "rollout", "decode", 110, tokens=11, seconds=1.5))
    r1 = (_line(1, "rollout", "decode", 200, tokens=20, seconds=3.0) + _line(1, "update", "forward", 60, seconds=0.5)
          + _line(2, "rollout", "decode", 120, tokens=12, seconds=2.5)
          + _line(3, "rollout", "decode", 999, tokens=99, seconds=9.0)  # rank 0 never got to step 3
          + '{"step": 3, "phase": "upd')  # torn last line: the crash interrupted a write
    (d / "ledger.rank0.jsonl").write_text(r0)
    (d / "ledger.rank1.jsonl").write_text(r1)
    code, printed = _invoke(d, "--budget", "1000", "--num-generations", "8")
    assert code == 0, printed
    card = json.loads((d / "report_card.json").read_text())
    assert card["total_flops"] == 100 + 50 + 200 + 60 + 110 + 120
    assert card["phase_flops"] == {"rollout": 530, "update": 110} and card["hardware_flops"] == {"recompute": 7}
    assert card["tokens"] == 10 + 20 + 11 + 12 and card["steps"] == 2 and card["budget_flops"] == 1000
    # seconds: the slower rank per step and key (they run side by side), summed over steps
    assert card["seconds"] == {"rollout": 3.0 + 2.5, "update": 1.0, "recompute": 0.0}
    assert card["extra"]["processes"] == 2
    assert card["extra"]["rebuilt_from"] == ["ledger.rank0.jsonl", "ledger.rank1.jsonl"]
    notes = " ".join(card["extra"]["rebuild_notes"])
    assert "steps [3]" in notes and "torn last line" in notes
    assert (d / "ledger.rank1.jsonl").read_text() == r1  # read, never modified
    assert "(64.0% used)" in (d / "report_card.md").read_text()


def test_a_directory_without_ledgers_is_refused_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    for target, needle in ((tmp_path / "empty", "no RACE ledger here"), (tmp_path / "nope", "not a directory")):
        code, printed = _invoke(target)
        assert code == 2 and printed.startswith("error: ") and needle in printed, printed
        assert len(printed.strip().splitlines()) == 1 and "Traceback" not in printed
    (tmp_path / "empty" / "ledger.jsonl").write_text("")
    code, printed = _invoke(tmp_path / "empty")
    assert code == 2 and "hold no records" in printed
    code, printed = _invoke(tmp_path / "empty", "--budget", "-1")
    assert code == 2 and "--budget" in printed
