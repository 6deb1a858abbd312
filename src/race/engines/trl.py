"""RACE's TRL engine: a run spec trained by TRL's ``GRPOTrainer``, charged to RACE's ledger.

The ``RunConfig`` maps onto ``GRPOConfig`` field by field (the names are TRL's already):
``per_device_train_batch_size = prompts_per_step * num_generations`` with one generation per
optimizer step (``gradient_accumulation_steps = steps_per_generation = 1``), LoRA through
``peft_config``, ``gradient_checkpointing`` from the config, no reporting, no hub. The
task's training problems become a ``datasets.Dataset`` of prompts (batch b holds the
problems the built-in engine draws for its step b) and the reward is a TRL reward function
around ``race.rewards``. What TRL executes is recorded by ``RaceFlopCallback``
(``race.engines.trl_callback``); this module adds the run directory every engine writes
(docs/run-format.md): config, ledger, metrics with evaluation rows, report card, adapter
and ``run.json``.

Where TRL and the built-in engine differ (see ``race.engines.trl_flops``): TRL prefills each
row (no shared prompt prefix), runs its fused head at every position but the last of each
row on CPU, recomputes logits (and, with checkpointing, the layers) in the backward, keeps
zero-variance groups in the update, and counts a step per optimizer step (a batch spans
``num_iterations`` steps). The report card's ``extra`` says so, with the FLOPs the built-in
engine would have charged for the same batches.

Resume: TRL checkpoints (``trl/checkpoint-N``) every ``checkpoint_every`` optimizer steps;
calling the engine again resumes from the last one (ledger and metrics are cut back to it).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable

from race.accounting import AccountingError, steps_in_budget
from race.spec import ConfigError, RunConfig
from race.engines.run_io import MetricsLog, read_run, write_config, write_json_atomic

Progress = Callable[[dict[str, Any]], None]
RACE_STATE = "race_state.json"
MAX_DATASET_BATCHES = 10_000  # prompts repeat (TRL starts a new epoch) past this many batches


def check_trl_config(cfg: RunConfig) -> None:
    """Refuse settings the TRL engine cannot run as specified, saying what to change."""
    if cfg.engine != "trl":
        raise ConfigError(f"engine={cfg.engine!r}: run_trl runs engine: trl specs")
    if cfg.drop_zero_variance_groups:
        raise ConfigError(
            "drop_zero_variance_groups: true is not available with engine: trl (TRL keeps groups whose rewards are "
            "all equal in the update, with advantage 0, and spends their FLOPs); set drop_zero_variance_groups: false")
    if cfg.max_completion_length + cfg.max_prompt_length < 2:
        raise ConfigError("max_prompt_length + max_completion_length must be >= 2")


def grpo_args(cfg: RunConfig, output_dir: Path, *, use_cpu: bool, max_steps: int) -> Any:
    """The ``GRPOConfig`` of a run spec (TRL names map one to one)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir), use_cpu=use_cpu, bf16=False, fp16=False,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations,
        gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=cfg.num_generations, max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature, learning_rate=cfg.learning_rate, beta=cfg.beta,
        num_iterations=cfg.num_iterations, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high,
        loss_type=cfg.loss_type, scale_rewards="group" if cfg.scale_rewards else "none",
        mask_truncated_completions=cfg.mask_truncated_completions, seed=cfg.seed, data_seed=cfg.seed,
        max_steps=max_steps, max_grad_norm=cfg.max_grad_norm, weight_decay=cfg.weight_decay,
        optim="adamw_torch", activation_checkpointing=cfg.gradient_checkpointing,
        report_to="none", push_to_hub=False, logging_steps=1, logging_nan_inf_filter=False,
        save_strategy="steps", save_steps=cfg.checkpoint_every, save_total_limit=1,
        shuffle_dataset=False, disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )


class RaceReward:
    """A TRL reward function around a ``race.rewards`` system: looks the problems up by the
    dataset's ``problem_idx`` column, scores the completions, charges the reward's FLOPs
    to the ledger and keeps the batch's statistics for the metrics row."""

    def __init__(self, reward: Any, problems: list[Any], num_generations: int, charge: Callable[..., None],
                 eos_ids: set[int]) -> None:
        self.reward, self.problems, self.G = reward, problems, num_generations
        self.charge, self.eos_ids = charge, eos_ids
        self.__name__ = f"race_{reward.name}".replace(":", "_")
        self.last: dict[str, Any] = {}

    def __call__(self, prompts: list[Any], completions: list[str], completion_ids: list[list[int]],
                 problem_idx: list[int], **_: Any) -> list[float]:
        probs = [self.problems[i] for i in problem_idx]
        out = self.reward.score(probs, list(completions))
        comps = dict(out.components) if out.components else {"reward/score": 0}
        key = next(iter(comps))
        self.charge(comps, tokens={key: out.tokens} if out.tokens else None, seconds={key: out.seconds})
        r = out.rewards
        groups = [r[i:i + self.G] for i in range(0, len(r), self.G)]
        mean = sum(r) / len(r)
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1)) if len(r) > 1 else 0.0
        self.last = {
            "reward_mean": mean, "reward_std": std,
            "verified_mean": sum(out.verified) / max(1, len(out.verified)),
            "zero_var_frac": sum(1 for g in groups if max(g) == min(g)) / len(groups),
            "trunc_rate": sum(1 for ids in completion_ids if not ids or ids[-1] not in self.eos_ids) / len(r),
            "completion_len": sum(len(ids) for ids in completion_ids) / len(r),
            "kept_sequences": len(r), **out.extra,
        }
        return list(r)


def _trainer_class() -> Any:
    from torch.optim.lr_scheduler import LambdaLR
    from trl import GRPOTrainer

    class RaceGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with the built-in engine's learning-rate schedule (warmup, then
        constant/cosine/linear over the steps the budget buys, per batch of prompts)."""

        race_lr_factor: Callable[[int], float] = staticmethod(lambda i: 1.0)  # type: ignore[assignment]

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None:
                self.lr_scheduler = LambdaLR(optimizer or self.optimizer, self.race_lr_factor)
                self._created_lr_scheduler = True
            return self.lr_scheduler

    return RaceGRPOTrainer


class TrlEngine:
    """Runs a ``RunConfig`` with TRL (see module docstring). ``run()`` returns run.json."""

    name = "trl"

    def __init__(self, cfg: RunConfig, run_dir: Path, progress: Progress | None = None) -> None:
        self.cfg, self.run_dir, self.progress = cfg, Path(run_dir), progress

    # -- setup ---------------------------------------------------------------------------
    def _dataset(self, tok: Any) -> tuple[Any, list[Any], int]:
        """Prompts of batches 1..N (batch b = the built-in engine's step-b problems), cut to
        their last ``max_prompt_length`` tokens; N stops once even the cheapest possible
        steps would spend the budget. Returns (dataset, problems, longest prompt)."""
        from datasets import Dataset

        from race.engines.trl_flops import counted, update_components

        cfg = self.cfg
        n = cfg.prompts_per_step * cfg.num_generations
        limit = min(cfg.max_steps or MAX_DATASET_BATCHES, MAX_DATASET_BATCHES)
        problems: list[Any] = []
        texts: list[str] = []
        floor = 0.0
        longest = 0
        for b in range(1, limit + 1):
            batch = self.task.problems("train", cfg.prompts_per_step, seed=cfg.seed * 1_000_003 + b)
            width = 0
            for p in batch:
                ids = tok(p.prompt, add_special_tokens=False)["input_ids"]
                text = p.prompt if len(ids) <= cfg.max_prompt_length else tok.decode(ids[-cfg.max_prompt_length:])
                width = max(width, len(tok(text=text)["input_ids"]))
                problems.append(p)
                texts.append(text)
            longest = max(longest, width)
            # a batch costs at least its updates over rows of (its prompt width + 1 token)
            floor += cfg.num_iterations * counted(update_components(
                self.shape, self.plan, n_seqs=n, seq_len=width + 1, completion_len=1, lora=self.lora,
                inputs_require_grad=False, conventions=cfg.conventions))
            if floor >= cfg.budget_flops:
                break
        ds = Dataset.from_dict({"prompt": texts, "problem_idx": list(range(len(texts)))})
        return ds, problems, longest

    def _setup(self) -> None:
        from peft import LoraConfig

        from race.engines.builtin import load_run_policy, make_task, run_evaluator
        from race.engines.trl_callback import RaceFlopCallback
        from race.engines.trl_flops import TrlStepPlan
        from race.engines.trl_hooks import _compact_head
        from race.models import validate_lora
        from race.rewards import make_reward

        cfg = self.cfg
        policy = load_run_policy(cfg)
        model, tok, self.lora, self.shape, self.device = policy.model, policy.tok, policy.lora, policy.shape, policy.device
        self.tok = tok
        peft_config = None
        if cfg.lora is not None:
            validate_lora(model, cfg.lora)
            peft_config = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.lora_alpha, lora_dropout=cfg.lora.lora_dropout,
                                     target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM", bias="none")
        self.plan = TrlStepPlan(per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations,
                                num_generations=cfg.num_generations, num_iterations=cfg.num_iterations, beta=cfg.beta,
                                compact_head=_compact_head(model))
        self.task = make_task(cfg)
        self.reward = make_reward(cfg.reward, seed=cfg.seed, device=str(self.device), conventions=cfg.conventions,
                                  task=self.task)
        dataset, problems, self.max_prompt = self._dataset(tok)
        self.flops = RaceFlopCallback(
            cfg.budget_flops, self.run_dir, conventions=cfg.conventions, max_prompt_length=self.max_prompt,
            reward_step_bound=lambda n, p, t: int(self.reward.step_bound(n, p, t)), model_name=cfg.model)
        eos_ids = {int(tok.eos_token_id)}
        gen_eos = getattr(model.generation_config, "eos_token_id", None)
        eos_ids |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
        eos_ids.add(int(tok.pad_token_id))
        self.reward_fn = RaceReward(self.reward, problems, cfg.num_generations, self.flops.charge, eos_ids)
        self.total_steps = self._schedule_steps()
        mu = cfg.num_iterations
        args = grpo_args(cfg, self.run_dir / "trl", use_cpu=self.device.type == "cpu",
                         max_steps=cfg.max_steps * mu if cfg.max_steps else 10 ** 9)
        trainer_cls = _trainer_class()
        from race.engines.grpo_math import lr_at

        total, warm, sched, base = self.total_steps, cfg.warmup_steps, cfg.lr_scheduler_type, cfg.learning_rate
        trainer_cls.race_lr_factor = staticmethod(  # type: ignore[assignment]
            lambda i: lr_at(i // mu + 1, base_lr=base, schedule=sched, warmup_steps=warm, total_steps=total) / base)
        self.run_cb = _run_callback(self)
        self.trainer = trainer_cls(model=model, reward_funcs=self.reward_fn, args=args, train_dataset=dataset,
                                   processing_class=tok, peft_config=peft_config, callbacks=[self.flops, self.run_cb])
        self.flops.attach(self.trainer)
        from transformers import PrinterCallback, ProgressCallback

        for quiet in (PrinterCallback, ProgressCallback):  # the engine reports progress itself
            self.trainer.remove_callback(quiet)
        self.model = self.trainer.model
        self.evaluator = run_evaluator(cfg, self.task, policy)

    def _schedule_steps(self) -> int:
        """Batches of prompts the budget buys at the first batch's maximum cost (the
        built-in engine's ``total_steps``; used by warmup/cosine/linear schedules)."""
        from race.engines.trl_flops import counted, generation_components, update_components

        cfg, plan = self.cfg, self.plan
        n = plan.per_device_train_batch_size
        T = cfg.max_completion_length
        bound = counted(generation_components(self.shape, plan, n_seqs=n, prompt_len=self.max_prompt,
                                              completion_len=T, lora=self.lora, conventions=cfg.conventions))
        bound += int(self.reward.step_bound(n, self.max_prompt, T))
        bound += cfg.num_iterations * counted(update_components(
            self.shape, plan, n_seqs=n, seq_len=self.max_prompt + T, completion_len=T, lora=self.lora,
            conventions=cfg.conventions))
        try:
            steps = steps_in_budget(cfg.budget_flops, bound)
        except AccountingError as e:
            raise AccountingError(f"run {cfg.name!r}: {e}") from None
        return min(steps, cfg.max_steps) if cfg.max_steps else steps

    # -- bookkeeping (called from the run callback) -----------------------------------------------
    def evaluate(self, step: int) -> None:
        with self.flops.tracker.paused():
            res = self.evaluator.evaluate(self.model)
        led = self.flops.ledger
        assert led is not None
        led.add(step, "eval", "generate", res.flops, tokens=res.tokens, seconds=res.seconds, counted=False)
        self.metrics.append([dict(r, kind="eval", step=step, flops=led.total) for r in res.rows])
        self.last_eval_step = step
        self.next_eval_at = led.total + self.eval_every

    def on_train_begin(self, state: Any) -> None:
        step = int(state.global_step)
        self.steps = step
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.metrics.truncate_after(step)
        self.eval_every = self.cfg.eval.every_flops or self.cfg.budget_flops / self.cfg.eval.num_points
        if step == 0:
            self.last_eval_step, self.next_eval_at = -1, 0.0
            self.evaluate(0)

    def on_log(self, state: Any, control: Any, logs: dict[str, Any]) -> None:
        led = self.flops.ledger
        assert led is not None
        step = int(state.global_step)
        loss = float(logs["loss"])
        row = {"kind": "train", "step": step, "flops": led.total, **self.reward_fn.last, "loss": loss,
               "clip_frac": float(logs.get("clip_ratio/region_mean", 0.0)), "kl": float(logs.get("kl", 0.0)),
               "lr": float(logs.get("learning_rate", 0.0))}
        self.metrics.append([row])
        if not math.isfinite(loss):
            self.diverged = f"non-finite loss ({loss}) at step {step}; kept the last good checkpoint"
            control.should_training_stop = True
            control.should_save = False  # keep the last good checkpoint (save_total_limit=1 would drop it)
            return
        if led.total >= self.next_eval_at:
            self.evaluate(step)
        self.steps = step
        if self.progress:
            self.progress({"step": step, "flops": led.total, "budget": self.cfg.budget_flops, **row})

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.cfg.run_id(), "next_eval_at": self.next_eval_at, "last_eval_step": self.last_eval_step,
                "reward_calls": getattr(self.reward, "_calls", 0)}

    # -- the run ---------------------------------------------------------------------------------
    def _resume_point(self) -> str | None:
        from transformers.trainer_utils import get_last_checkpoint

        out = self.run_dir / "trl"
        ckpt = get_last_checkpoint(str(out)) if out.is_dir() else None
        if ckpt is None:
            for f in ("ledger.jsonl", "metrics.jsonl"):
                (self.run_dir / f).unlink(missing_ok=True)  # a crash before the first checkpoint: start over
            return None
        meta_path = Path(ckpt) / RACE_STATE
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if meta.get("run_id") != self.cfg.run_id():
            raise RuntimeError(f"{self.run_dir} holds a checkpoint of another run ({meta.get('run_id')}); "
                               "use a new output directory")
        self.next_eval_at, self.last_eval_step = float(meta["next_eval_at"]), int(meta["last_eval_step"])
        if hasattr(self.reward, "set_call_index"):
            self.reward.set_call_index(int(meta.get("reward_calls", 0)))
        self.resumed_from = int(Path(ckpt).name.rsplit("-", 1)[-1])
        return ckpt

    def run(self) -> dict[str, Any]:
        cfg, run_dir = self.cfg, self.run_dir
        check_trl_config(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        done = read_run(run_dir)
        if done is not None and done.get("status") == "complete" and done.get("run_id") == cfg.run_id():
            return done
        t_start = time.perf_counter()
        write_config(run_dir, cfg)
        self.resumed_from: int | None = None
        self.diverged: str | None = None
        self.steps = 0
        self._setup()
        ckpt = self._resume_point()
        if ckpt is not None:
            self.run_cb.restore = (self.next_eval_at, self.last_eval_step)
        self.trainer.train(resume_from_checkpoint=ckpt)
        step = int(self.trainer.state.global_step)
        self.steps = step
        status = "diverged" if self.diverged else "complete"
        stop_reason = "diverged" if self.diverged else ("budget" if self.flops.stop_reason == "budget" else "max_steps")
        if status == "complete" and self.last_eval_step != step:
            self.evaluate(step)
        return self._finish(step, status, stop_reason, self.diverged, time.perf_counter() - t_start)

    def _finish(self, step: int, status: str, stop_reason: str, error: str | None, wall: float) -> dict[str, Any]:
        from race.engines.trl_flops import builtin_same_shapes

        cfg, led = self.cfg, self.flops.ledger
        assert led is not None
        if status == "complete":
            self.model.save_pretrained(self.run_dir / "adapter", safe_serialization=True)
        gens = self.flops.tracker.generations
        same = builtin_same_shapes(self.shape, gens, num_generations=cfg.num_generations,
                                   num_iterations=cfg.num_iterations, beta=cfg.beta, lora=self.lora,
                                   conventions=cfg.conventions)
        trl_phases = led.totals_by_phase()
        vs = {p: {"trl": int(trl_phases.get(p, 0)), "builtin_same_shapes": int(same.get(p, 0))}
              for p in ("rollout", "old_logprobs", "reference", "update", "recompute")}
        card = self.flops.report_card(model=cfg.model, model_params=self.shape.num_params(), extra={
            "reward": cfg.reward, "generations": len(gens), "vs_builtin": vs,
            "vs_builtin_note": "FLOPs the built-in engine charges for the same batches (prompt prefix shared, head "
                               "at completion positions, no checkpointing, no group dropped); a resumed run "
                               "counts the generations since the resume"})
        card.write(self.run_dir)
        evals = self.metrics.evals()
        first = {r["target"]: r["score"] for r in evals if r["step"] == 0}
        last_step = max((r["step"] for r in evals), default=0)
        final = {r["target"]: r["score"] for r in evals if r["step"] == last_step}
        trains = [r for r in self.metrics.rows if r.get("kind") == "train"]

        def mean(key: str) -> float:
            vals = [r[key] for r in trains if key in r]
            return sum(vals) / len(vals) if vals else 0.0

        phases = {p: 0 for p in ("rollout", "old_logprobs", "reference", "reward", "update", "recompute", "eval")}
        phases.update(led.totals_by_phase())
        out = {
            "run_id": cfg.run_id(), "name": cfg.name, "engine": self.name, "status": status,
            "stop_reason": stop_reason, "error": error, "budget_flops": cfg.budget_flops,
            "total_flops": led.total, "phase_flops": phases, "steps": step,
            "wall_s": round(wall, 3),
            "phase_seconds": {k: round(v, 3) for k, v in led.seconds_by_phase().items()},
            "model_params": self.shape.num_params(), "non_embedding_params": self.shape.non_embedding_params(),
            "initial": first, "final": final,
            "diagnostics": {"zero_var_frac": mean("zero_var_frac"), "trunc_rate": mean("trunc_rate"),
                            "reward_mean": mean("reward_mean"), "verified_mean": mean("verified_mean")},
            "resumed_from": self.resumed_from, "conventions": cfg.conventions,
            "config": cfg.model_dump(mode="json"),
        }
        write_json_atomic(self.run_dir / "run.json", out)
        return out


def _run_callback(engine: TrlEngine) -> Any:
    """Metrics rows, evaluation and resumable state for ``TrlEngine``, called after the
    ledger callback has charged the step."""
    from transformers import TrainerCallback

    class RunCallback(TrainerCallback):
        def __init__(self) -> None:
            self.restore: tuple[float, int] | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            engine.on_train_begin(state)
            if self.restore is not None:
                engine.next_eval_at, engine.last_eval_step = self.restore
                self.restore = None

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if logs and "loss" in logs and state.global_step > engine.steps:
                engine.on_log(state, control, logs)

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                write_json_atomic(ckpt / RACE_STATE, engine.state_dict())

    return RunCallback()


def run_trl(cfg: RunConfig, run_dir: Path, progress: Progress | None = None) -> dict[str, Any]:
    """Train ``cfg`` with TRL into ``run_dir`` (docs/run-format.md); returns run.json."""
    if not math.isfinite(cfg.budget_flops):
        raise ValueError("budget_flops must be finite")
    return TrlEngine(cfg, Path(run_dir), progress).run()


__all__ = ["RaceReward", "TrlEngine", "check_trl_config", "grpo_args", "run_trl"]
