"""The TRL ledger equals what executes: FlopCounterMode (race.measure.Counter, which also
counts TRL's in-place ``addmm_``) around TRL's own stages, on a tiny random Qwen2 model
with eager attention, under ``conventions="torch"``.

Covers every FLOP-relevant TRL path at once: left-padded prompts of different lengths,
LoRA on all seven matrices, gradient checkpointing (non-reentrant recompute; embedding
output requiring grad), old-policy log-probs (num_iterations=2), reference log-probs with
the adapter off (beta != 0), and TRL's fused LM head (logits at S-1 positions on CPU,
recomputed in its backward)."""

from __future__ import annotations

from race.accounting import PolicyCost
from collections import defaultdict

import pytest


def _measured_trainer_class():
    import torch
    from trl import GRPOTrainer

    from race.measure import Counter

    class Measured(GRPOTrainer):
        """GRPOTrainer with a FlopCounterMode around each stage it runs."""

        def _count(self, key: str, fn, *args, **kwargs):
            with Counter() as c:
                out = fn(*args, **kwargs)
            self.measured[self.state.global_step + 1][key] += c.total
            return out

        def _generate_single_turn(self, *args, **kwargs):
            return self._count("rollout", super()._generate_single_turn, *args, **kwargs)

        def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
            if torch.is_grad_enabled():
                return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
            lora = [m for m in model.modules() if hasattr(m, "disable_adapters") and hasattr(m, "lora_A")]
            ref = model is self.ref_model or (lora and lora[0].disable_adapters)
            key = "reference" if ref else "old_logprobs"
            return self._count(key, super()._get_per_token_logps_and_entropies, model, *args, **kwargs)

        def training_step(self, *args, **kwargs):
            if not hasattr(self, "measured"):
                self.measured = defaultdict(lambda: defaultdict(int))
                backward = self.accelerator.backward

                def counted_backward(loss, **kw):
                    with Counter() as c:
                        backward(loss, **kw)
                    m = self.measured[self.state.global_step + 1]
                    m["backward"] += c.total - c.grad_enabled_flops  # gradients (grad mode off)
                    m["recompute"] += c.grad_enabled_flops  # checkpointing re-runs the layers with grad on

                self.accelerator.backward = counted_backward
            return self._count("step", super().training_step, *args, **kwargs)

    return Measured


def _prompts_dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["Q:1+2\nA:", "Q:12+30-4\nA:", "Q:3+4-5+6\nA:", "Q:9-1\nA:"] * 3})


def _reward(prompts, completions, **kw):
    return [float(len(c) % 3) for c in completions]


def _run_measured(model_dir, out, *, peft: bool, **grpo):
    """Train 3 steps under the measuring trainer with the RACE callback attached; return
    (trainer, callback, ledger by step and key)."""
    import torch
    from peft import LoraConfig
    from trl import GRPOConfig

    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(str(model_dir), device="cpu", attn_implementation="eager")
    kw = dict(output_dir=str(out / "trl"), use_cpu=True, bf16=False, per_device_train_batch_size=8,
              num_generations=4, max_completion_length=6, max_steps=3, learning_rate=1e-2, report_to="none",
              logging_steps=1, save_strategy="no", shuffle_dataset=False, seed=0, disable_tqdm=True)
    kw.update(grpo)
    lora = LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    trainer = _measured_trainer_class()(model=model, reward_funcs=_reward, args=GRPOConfig(**kw),
                                        train_dataset=_prompts_dataset(), processing_class=tok,
                                        peft_config=lora if peft else None)
    cb = add_race_accounting(trainer, budget_flops=1e15, output_dir=out / "race", conventions="torch")
    trainer.train()
    ledger = defaultdict(lambda: defaultdict(int))
    for r in cb.ledger:
        ledger[r.step][r.key] += r.flops
    return trainer, cb, ledger


def _assert_ledger_equals_measured(trainer, cb, ledger):
    assert sorted(ledger) == [1, 2, 3] == sorted(trainer.measured)
    for step in (1, 2, 3):
        led, m = ledger[step], trainer.measured[step]
        got = {
            "rollout": led["rollout/prefill"] + led["rollout/decode"],
            "old_logprobs": led["old_logprobs/forward"],
            "reference": led["reference/forward"],
            "update/forward": led["update/forward"],
            "update/backward": led["update/backward"] + led["recompute/lm_head"],
            "recompute/forward": led["recompute/forward"],
        }
        want = {
            "rollout": m["rollout"], "old_logprobs": m["old_logprobs"], "reference": m["reference"],
            "update/forward": m["step"] - m["rollout"] - m["old_logprobs"] - m["reference"] - m["backward"]
            - m["recompute"],
            "update/backward": m["backward"], "recompute/forward": m["recompute"],
        }
        assert got == want, (step, got, want)
        assert led["recompute/lm_head"] > 0 and got["update/forward"] > 0
    assert cb.ledger.total == sum(v for s in ledger.values() for k, v in s.items() if not k.startswith("recompute/"))
    return got


def test_trl_ledger_equals_measured_flops(tiny_model_dir, tmp_path):
    """LoRA, non-reentrant checkpointing, num_iterations=2, beta != 0 (adapter off)."""
    from race.engines.trl_flops import TrlStepPlan, generation_components, update_components

    trainer, cb, ledger = _run_measured(tiny_model_dir, tmp_path, peft=True, beta=0.1, num_iterations=2,
                                        gradient_checkpointing=True)
    _assert_ledger_equals_measured(trainer, cb, ledger)
    for step in (1, 2, 3):  # generation, old/ref log-probs on steps 1 and 3 only (num_iterations=2)
        gen = step != 2
        assert (ledger[step]["rollout/decode"] > 0) == gen and (ledger[step]["reference/forward"] > 0) == gen
        assert (ledger[step]["old_logprobs/forward"] > 0) == gen and ledger[step]["recompute/forward"] > 0
    # the uniform-shape functions (step bound, cross-check) reproduce the executed steps at their shapes
    plan = TrlStepPlan.from_args(trainer.args)
    assert plan.needs_old_logprobs and len(cb.tracker.generations) == 2
    for step, (rows, P, W) in zip((1, 3), cb.tracker.generations):
        cost = PolicyCost(cb.shape, cb.lora, "torch")
        comps = generation_components(plan, cost, n_seqs=rows, prompt_len=P, completion_len=W)
        upd = update_components(plan, cost, n_seqs=rows, seq_len=P + W, completion_len=W,
                                inputs_require_grad=True, recompute="early_stop")
        comps.update(upd)
        assert {k: v for k, v in ledger[step].items() if not k.startswith("reward/")} == comps
        if step == 1:
            assert {k: v for k, v in ledger[2].items() if k.startswith(("update/", "recompute/"))} == upd


@pytest.mark.slow
def test_trl_ledger_equals_measured_flops_full_finetuning(tiny_model_dir, tmp_path):
    """Full fine-tuning (trainable head and embedding), a separate reference model (beta != 0),
    steps_per_generation=2 (old log-probs; the second step trains on the buffered half),
    reentrant checkpointing (the whole layer recomputed)."""
    trainer, cb, ledger = _run_measured(tiny_model_dir, tmp_path, peft=False, beta=0.1, steps_per_generation=2,
                                        per_device_train_batch_size=4, gradient_checkpointing=True,
                                        gradient_checkpointing_kwargs={"use_reentrant": True})
    _assert_ledger_equals_measured(trainer, cb, ledger)
    assert cb.lora is None and cb._has_ref_model
    assert [ledger[s]["rollout/decode"] > 0 for s in (1, 2, 3)] == [True, False, True]
    assert [ledger[s]["reference/forward"] > 0 for s in (1, 2, 3)] == [True, False, True]
