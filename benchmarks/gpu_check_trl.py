"""gpu_check.py's exactness checks: the TRL drop-in's ledger (``conventions="torch"``) against
what ``FlopCounterMode`` counts (``race.measure.Counter``) around TRL's own stages, and the
built-in engine's ledger against its measured step. The trainer's setup that
``gpu_check_perf.py`` times too (trainer arguments, the dataset, the reward) lives here;
this module imports nothing of ``gpu_check_perf.py`` (the peak table is ``gpu_check_base``'s).

How the measured side splits a step (as tests/engines/test_trl_measured.py does): a
``GRPOTrainer`` subclass counts ``_generate_single_turn`` (rollout), the grad-free
``_get_per_token_logps_and_entropies`` calls (old-policy or reference log-probs, told apart
by the model or the adapter state), ``_calculate_rewards`` (reward models), the
``accelerator.backward`` call (gradients; the FLOPs run with grad enabled inside it are
checkpointing's recompute) and the whole ``training_step``; the update's forward is the
step minus the rest. The ledger's ``recompute/lm_head`` (TRL's fused head recomputes its
logits in its backward) belongs to the measured backward.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from gpu_check_base import TOLERANCE, Ctx, NotTested, peak_flops

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = ["Q:1+2\nA:", "Q:12+30-4\nA:", "Q:3+4-5+6\nA:", "Q:9-1\nA:", "Q:25+17\nA:", "Q:8-3+40\nA:",
           "Q:6+6+6\nA:", "Q:49-2-7\nA:"]


# -- what every TRL check shares -------------------------------------------------------------
def dataset(n: int = 64) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [PROMPTS[i % len(PROMPTS)] for i in range(n)]})


def reward(prompts: list, completions: list, **kw: Any) -> list[float]:
    return [float(len(c) % 3) for c in completions]


def grpo_args(ctx: Ctx, out: Path, **over: Any) -> Any:
    """A ``GRPOConfig`` at the context's sizes (no saving, logging every step)."""
    from trl import GRPOConfig

    s = ctx.sizes
    kw: dict[str, Any] = dict(output_dir=str(out), use_cpu=not ctx.cuda, bf16=ctx.dtype == "bfloat16",
                              per_device_train_batch_size=s.batch, num_generations=s.group,
                              max_completion_length=s.completion, max_steps=s.steps, learning_rate=1e-5,
                              report_to="none", logging_steps=1, save_strategy="no", shuffle_dataset=False, seed=0,
                              disable_tqdm=True, gradient_checkpointing=False, dataloader_num_workers=0)
    kw.update(over)
    return GRPOConfig(**kw)


def quiet(trainer: Any) -> Any:
    """No per-step log dicts on stdout (the progress lines and the table stay readable)."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer


def lora_config() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=LORA_TARGETS)


def ledger_by_step(cb: Any) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in cb.ledger:
        out[r.step][r.key] += r.flops
    return out


def compact_head_in_use(trainer: Any) -> bool:
    from race.engines.trl.hooks import causal_lm
    from race.engines.trl.internals import compact_head

    return bool(compact_head(causal_lm(trainer.model)))


# -- the measuring trainer -------------------------------------------------------------------
def measured_trainer_class() -> type:
    import torch
    from trl import GRPOTrainer

    from race.measure import Counter

    class Measured(GRPOTrainer):
        """GRPOTrainer with a FlopCounterMode around each stage it runs (module docstring)."""

        def _count(self, key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
            with Counter() as c:
                out = fn(*args, **kwargs)
            self.measured[self.state.global_step + 1][key] += c.total
            return out

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            return self._count("rollout", super()._generate_single_turn, *args, **kwargs)

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            return self._count("reward", super()._calculate_rewards, *args, **kwargs)

        def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
            lora = [m for m in model.modules() if hasattr(m, "disable_adapters") and hasattr(m, "lora_A")]
            ref = model is self.ref_model or (lora and lora[0].disable_adapters)
            return self._count("reference" if ref else "old_logprobs", super()._get_per_token_logps_and_entropies,
                               model, *args, **kwargs)

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            if not hasattr(self, "measured"):
                self.measured = defaultdict(lambda: defaultdict(int))
                backward = self.accelerator.backward

                def counted_backward(loss: Any, **kw: Any) -> Any:
                    with Counter() as c:
                        out = backward(loss, **kw)
                    m = self.measured[self.state.global_step + 1]
                    m["backward"] += c.total - c.grad_enabled_flops
                    m["recompute"] += c.grad_enabled_flops
                    return out

                self.accelerator.backward = counted_backward
            return self._count("step", super().training_step, *args, **kwargs)

    return Measured


def compare(trainer: Any, cb: Any) -> dict[str, Any]:
    """Per step and phase group: ledger vs measured, and the worst relative difference."""
    led, meas = ledger_by_step(cb), trainer.measured
    steps: dict[str, Any] = {}
    worst = 0.0
    unknown: set[str] = set()
    for step in sorted(set(led) | set(meas)):
        lg, m = led.get(step, {}), meas.get(step, {})
        by_prefix: dict[str, int] = defaultdict(int)
        for k, v in lg.items():
            group = {"rollout": "rollout", "old_logprobs": "old_logprobs", "reference": "reference",
                     "reward": "reward"}.get(k.split("/")[0])
            if group is None:
                group = {"update/forward": "update/forward", "update/backward": "update/backward",
                         "recompute/lm_head": "update/backward", "recompute/forward": "recompute/forward"}.get(k)
            if group is None:
                unknown.add(k)
                continue
            by_prefix[group] += v
        got = {g: by_prefix.get(g, 0) for g in ("rollout", "old_logprobs", "reference", "reward", "update/forward",
                                                 "update/backward", "recompute/forward")}
        want = {"rollout": m.get("rollout", 0), "old_logprobs": m.get("old_logprobs", 0),
                "reference": m.get("reference", 0), "reward": m.get("reward", 0),
                "update/backward": m.get("backward", 0), "recompute/forward": m.get("recompute", 0)}
        want["update/forward"] = m.get("step", 0) - sum(want.values())
        rel = {g: (0.0 if got[g] == want[g] else abs(got[g] - want[g]) / max(abs(want[g]), 1)) for g in got}
        worst = max([worst, *rel.values()])
        steps[str(step)] = {"ledger": got, "measured": want, "max_rel": max(rel.values())}
    return {"steps": steps, "max_rel": worst, "unknown_keys": sorted(unknown), "n_steps": len(steps)}


def eos_bias(vocab: int, p: float = 0.03) -> float:
    """Logit bias that gives EOS a probability of about ``p`` per token in a random model
    (near-uniform logits over ``vocab``): ``log(p * vocab / (1 - p))``. Some completions
    end early and some are truncated, so the batches are ragged and
    ``mask_truncated_completions`` masks some rows, not all."""
    return math.log(p * vocab / (1 - p))


def run_measured(ctx: Ctx, name: str, *, peft: bool, reward_funcs: Any = None, **grpo: Any) -> tuple[Any, Any]:
    """Train ``sizes.steps`` steps under the measuring trainer with RACE attached (torch
    conventions); returns (trainer, callback)."""
    import torch

    from race.engines.trl_callback import add_race_accounting

    torch.manual_seed(0)
    model, tok = ctx.load_policy()
    out = ctx.work / name
    grpo.setdefault("generation_kwargs", {"sequence_bias": [[[tok.eos_token_id], eos_bias(ctx.shape().vocab)]]})
    kw: dict[str, Any] = {}
    if reward_funcs is not None:
        kw["reward_processing_classes"] = [tok] * len(reward_funcs)
    trainer = quiet(measured_trainer_class()(model=model, reward_funcs=reward_funcs or reward,
                                             args=grpo_args(ctx, out / "trl", **grpo), train_dataset=dataset(),
                                             processing_class=tok, peft_config=lora_config() if peft else None,
                                             **kw))
    cb = add_race_accounting(trainer, budget_flops=1e21, output_dir=out / "race", conventions="torch")
    trainer.train()
    return trainer, cb


def verdict(trainer: Any, cb: Any, **extra: Any) -> dict[str, Any]:
    cmp = compare(trainer, cb)
    ok = cmp["max_rel"] <= TOLERANCE and cmp["n_steps"] == trainer.state.global_step and not cmp["unknown_keys"]
    head = "compact (completion tokens, Triton)" if compact_head_in_use(trainer) else "every position but the last"
    return {"ok": ok, "headline": f"max rel. diff {cmp['max_rel']:.2e} over {cmp['n_steps']} steps; fused head: {head}",
            "fused_head": head, "ledger_total": cb.ledger.total, **cmp, **extra}


# -- the checks ------------------------------------------------------------------------------
def check_lora_beta0_mask_on(ctx: Ctx) -> dict[str, Any]:
    """LoRA (all seven matrices), beta 0, mask_truncated_completions on, non-reentrant
    gradient checkpointing (TRL's default checkpointing)."""
    trainer, cb = run_measured(ctx, "lora-mask-on", peft=True, beta=0.0, mask_truncated_completions=True,
                               gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False})
    out = verdict(trainer, cb, truncated_share=_truncated_share(trainer))
    ctx.shared["recompute_non_reentrant"] = out
    return out


def check_lora_beta0_mask_off(ctx: Ctx) -> dict[str, Any]:
    """LoRA, beta 0, mask_truncated_completions off, num_iterations=2 (old log-probs), no
    checkpointing."""
    trainer, cb = run_measured(ctx, "lora-mask-off", peft=True, beta=0.0, mask_truncated_completions=False,
                               num_iterations=2)
    return verdict(trainer, cb, truncated_share=_truncated_share(trainer))


def check_full_beta004(ctx: Ctx) -> dict[str, Any]:
    """Full fine-tuning, beta 0.04 (TRL's separate reference model), steps_per_generation=2
    (old log-probs, a buffered half-batch), reentrant checkpointing, mask off."""
    s = ctx.sizes
    trainer, cb = run_measured(ctx, "full-beta004", peft=False, beta=0.04, mask_truncated_completions=False,
                               steps_per_generation=2, per_device_train_batch_size=s.batch // 2,
                               gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True})
    out = verdict(trainer, cb, truncated_share=_truncated_share(trainer))
    out["ok"] = out["ok"] and cb.lora is None and bool(cb._has_ref_model)
    ctx.shared["recompute_reentrant"] = out
    return out


def _recompute(ctx: Ctx, key: str, run: str) -> dict[str, Any]:
    res = ctx.shared.get(key)
    if res is None:
        raise RuntimeError(f"its run ({run}) did not finish: see that check")
    pairs = [(st["ledger"]["recompute/forward"], st["measured"]["recompute/forward"]) for st in res["steps"].values()]
    ok = all(a == b or abs(a - b) <= TOLERANCE * b for a, b in pairs) and any(b > 0 for _, b in pairs)
    return {"ok": ok, "headline": f"recompute/forward ledger vs measured per step: {pairs}", "pairs": pairs,
            "from_run": run}


def check_recompute_non_reentrant(ctx: Ctx) -> dict[str, Any]:
    return _recompute(ctx, "recompute_non_reentrant", "trl_lora_beta0_mask_on")


def check_recompute_reentrant(ctx: Ctx) -> dict[str, Any]:
    return _recompute(ctx, "recompute_reentrant", "trl_full_beta0.04_mask_off")


def reward_model(ctx: Ctx) -> Any:
    """A random ``Qwen2ForSequenceClassification`` of the policy's width (``sizes.rm_layers`` layers)."""
    import torch
    from transformers import Qwen2ForSequenceClassification

    from race.measure import qwen2_config

    cfg = qwen2_config(ctx.shape(), num_layers=ctx.sizes.rm_layers, num_labels=1, pad_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    with torch.device(ctx.device):
        rm = Qwen2ForSequenceClassification(cfg)
    return rm.to(getattr(torch, ctx.dtype)).eval()


def check_reward_model(ctx: Ctx) -> dict[str, Any]:
    """A reward model in ``reward_funcs``: its ledger charge equals what TRL's reward
    computation executes, and the whole step still matches."""
    trainer, cb = run_measured(ctx, "reward-model", peft=True, beta=0.0, reward_funcs=[reward_model(ctx)])
    out = verdict(trainer, cb)
    rewards = [(st["ledger"]["reward"], st["measured"]["reward"]) for st in out["steps"].values()]
    out["ok"] = out["ok"] and all(m > 0 for _, m in rewards)
    out["headline"] = f"reward ledger vs measured per step {rewards}; " + out["headline"]
    return out


def _truncated_share(trainer: Any) -> float | None:
    vals = [h["completions/clipped_ratio"] for h in trainer.state.log_history if "completions/clipped_ratio" in h]
    return sum(vals) / len(vals) if vals else None


def check_builtin_step(ctx: Ctx) -> dict[str, Any]:
    """The built-in engine's first step at the same shapes (LoRA r=16, G groups of
    ``batch/G`` prompts, torch conventions): ledger vs FlopCounterMode, rollout and
    learning (log-prob passes, update, recompute) apart, in the run's dtype (bf16 on a GPU:
    the base in bf16, PEFT's LoRA adapters and their AdamW state in fp32; an earlier version
    ran float32 because the fast decoder refused that mix). FLOPs do not depend on the dtype.
    Also reports each phase's tokens per second and FLOP/s from the ledger's seconds, and
    its MFU where the device's peak at the dtype is known."""
    from race.accounting import FlopLedger
    from race.engines.builtin import BuiltinEngine
    from race.measure import Counter
    from race.spec import run_config_from_dict

    s = ctx.sizes
    cfg = run_config_from_dict(dict(
        engine="builtin", model=str(ctx.model_dir()), budget_flops=1e21, prompts_per_step=s.batch // s.group,
        num_generations=s.group, max_completion_length=s.completion, reward="random", learning_rate=1e-5, seed=0,
        device=ctx.device, dtype=ctx.dtype, conventions="torch", lora={"r": 16}, gradient_checkpointing=True,
        drop_zero_variance_groups=False, eval={"n_problems": 2, "n_hard_problems": 0, "n_pass_problems": 0}))
    eng = BuiltinEngine(cfg, ctx.work / "builtin")
    eng.start()

    class _Rows:
        def append(self, rows: list) -> None:
            pass

    eng.open_books(None, ledger=FlopLedger(budget=cfg.budget_flops), metrics=_Rows())  # as BuiltinEngine.run does
    measured: dict[str, int] = defaultdict(int)
    for name, key in (("rollout", "rollout"), ("update", "learning")):
        orig = getattr(eng, name)

        def counted(*a: Any, _orig: Any = orig, _key: str = key, **k: Any) -> Any:
            with Counter() as c:
                out = _orig(*a, **k)
            measured[_key] += c.total
            return out

        setattr(eng, name, counted)
    problems, ids, mask = eng.prompts_at(1)
    if not eng._train_step(1, problems, ids, mask):
        raise RuntimeError("the built-in step did not charge the ledger (recorded as overrun)")
    keys = eng.books.ledger.totals_by_key()
    ledger = {"rollout": sum(v for k, v in keys.items() if k.startswith("rollout/")),
              "learning": sum(v for k, v in keys.items() if not k.startswith(("rollout/", "reward/")))}
    rel = {k: 0.0 if ledger[k] == measured[k] else abs(ledger[k] - measured[k]) / max(measured[k], 1) for k in ledger}
    worst = max(rel.values())
    rates = _phase_rates(eng.books.ledger.records, ctx)
    adapters = sorted({str(p.dtype) for p in eng.state.model.parameters() if p.requires_grad})
    return {"ok": worst <= TOLERANCE and all(measured.values()), "headline": f"max rel. diff {worst:.2e} "
            f"(rollout {ledger['rollout']:.4g} vs {measured['rollout']:.4g}, learning {ledger['learning']:.4g} vs "
            f"{measured['learning']:.4g}), {ctx.dtype} base, adapters {'/'.join(adapters)}", "ledger": ledger,
            "measured": dict(measured), "rel": rel, "keys": keys, "dtype": ctx.dtype, "adapter_dtypes": adapters,
            "rates": rates}


def _phase_rates(records: Any, ctx: Ctx) -> dict[str, dict[str, float | None]]:
    """Per ledger phase: FLOPs, seconds, FLOP/s, tokens/s and MFU (FLOP/s over the device's
    dense peak at the run's dtype; None on a CPU or an unknown device)."""
    peak = None
    if ctx.cuda:
        import torch

        peak = peak_flops(torch.cuda.get_device_name(), ctx.dtype)[0]
    out: dict[str, dict[str, float | None]] = {}
    for r in records:
        row = out.setdefault(r.phase, {"flops": 0, "seconds": 0.0, "tokens": 0})
        row["flops"] += r.flops
        row["seconds"] += r.seconds
        row["tokens"] += r.tokens or 0
    for row in out.values():
        sec = row["seconds"] or 0.0
        row["flop_per_s"] = row["flops"] / sec if sec else None
        row["tokens_per_s"] = row["tokens"] / sec if sec and row["tokens"] else None
        row["mfu"] = row["flop_per_s"] / peak if peak and row["flop_per_s"] else None
    return out


def check_continuous_batching(ctx: Ctx) -> dict[str, Any]:
    raise NotTested("transformers continuous batching runs paged attention that FlopCounterMode does not count as "
                    "eager matmuls; its rollouts are charged from the returned token ids "
                    "(tests/engines/test_trl_vllm_tokens.py, CPU only)")


TRL_CHECKS = [
    ("trl_lora_beta0_mask_on", check_lora_beta0_mask_on, 40.0, 10.0),
    ("trl_lora_beta0_mask_off", check_lora_beta0_mask_off, 40.0, 8.0),
    ("trl_full_beta0.04_mask_off", check_full_beta004, 60.0, 10.0),
    ("recompute_non_reentrant", check_recompute_non_reentrant, 0.0, 0.0),
    ("recompute_reentrant", check_recompute_reentrant, 0.0, 0.0),
    ("trl_reward_model", check_reward_model, 40.0, 8.0),
    ("builtin_measured_vs_analytic", check_builtin_step, 40.0, 8.0),
    ("continuous_batching", check_continuous_batching, 0.0, 0.0),
]
