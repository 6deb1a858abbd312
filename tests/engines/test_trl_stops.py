"""The TRL drop-in's budget stop at real-run settings: it keeps its work (a checkpoint and
an evaluation, as TRL's own ``max_steps`` stop does)."""

from __future__ import annotations

PROMPTS = ["Q:1+2\nA:", "Q:12+30-4\nA:"]


def _step_bound(tok, T: int, rows: int) -> int:
    """Counted FLOPs of one full fine-tuning step (tiny-xs, no checkpointing) at the maximum lengths."""
    from race.accounting import PolicyCost
    from race.accounting.trl_step import TrlStepPlan, trl_batch_bound
    from race.models.refs import tiny_shape

    P = max(len(tok(text=p)["input_ids"]) for p in PROMPTS)
    plan = TrlStepPlan(per_device_train_batch_size=rows, num_generations=4)
    return trl_batch_bound(plan, PolicyCost(tiny_shape("tiny-xs")), prompt_len=P, completion_len=T)


def test_budget_stop_saves_a_checkpoint_and_evaluates(tiny_model_dir, tmp_path):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(str(tiny_model_dir), device="cpu", attn_implementation="eager")
    ds = Dataset.from_dict({"prompt": PROMPTS * 8})
    args = GRPOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=4, max_steps=50, report_to="none", disable_tqdm=True,
                      activation_checkpointing=False, seed=0, logging_steps=1, save_strategy="steps",
                      save_steps=1000, eval_strategy="steps", eval_steps=1000, per_device_eval_batch_size=4)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                          args=args, train_dataset=ds, eval_dataset=Dataset.from_dict({"prompt": PROMPTS[:1]}),
                          processing_class=tok)
    budget = 2.5 * _step_bound(tok, 4, 4)
    cb = add_race_accounting(trainer, budget_flops=budget)
    trainer.train()
    step = trainer.state.global_step
    assert cb.stop_reason == "budget" and 2 <= step < 50 and cb.ledger.total <= budget
    # neither save_steps nor eval_steps came due: the budget stop itself saved and evaluated
    assert sorted(p.name for p in (tmp_path / "o").glob("checkpoint-*")) == [f"checkpoint-{step}"]
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert [h["step"] for h in evals] == [step]
    # the evaluation's model calls are on record, uncounted
    assert cb.ledger.totals_by_phase().get("eval", 0) > 0


def test_keep_work_follows_the_run_s_save_and_eval_strategies():
    import types

    from transformers import TrainerControl
    from transformers.trainer_utils import IntervalStrategy, SaveStrategy

    from race.engines.trl.wiring import keep_work

    for save, ev, want in ((SaveStrategy.NO, IntervalStrategy.NO, (False, False)),
                           (SaveStrategy.STEPS, IntervalStrategy.NO, (True, False)),
                           ("epoch", "steps", (True, True)), ("no", IntervalStrategy.EPOCH, (False, True))):
        control = TrainerControl()
        keep_work(types.SimpleNamespace(save_strategy=save, eval_strategy=ev), control)
        assert (control.should_save, control.should_evaluate) == want, (save, ev)
