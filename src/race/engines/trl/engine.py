"""RACE's TRL engine: a run spec trained by TRL's ``GRPOTrainer``, charged to RACE's ledger.

The ``RunConfig`` maps onto ``GRPOConfig`` field by field (the names are TRL's already):
one generation of ``prompts_per_step * num_generations`` sequences per batch, in
``steps_per_generation`` micro-batches of ``per_device_train_batch_size``, trained in
optimizer steps of ``gradient_accumulation_steps`` micro-batches (default TRL's:
``steps_per_generation = gradient_accumulation_steps``, one optimizer step per generation;
``RunConfig.generation_steps``), LoRA through
``peft_config``, ``gradient_checkpointing`` from the config, no reporting, no hub. The
task's training problems become a ``datasets.Dataset`` of prompts (batch b holds the
problems the built-in engine draws for its step b) and the reward is a TRL reward function
around ``race.rewards``. What TRL executes is recorded by ``RaceFlopCallback``
(``race.engines.trl.callback``); this module adds the run directory every engine writes
(docs/run-format.md): config, ledger, metrics with evaluation rows, report card, adapter
and ``run.json``.

Where TRL and the built-in engine differ (see ``race.accounting.trl_step``): TRL prefills and
runs its log-prob and update passes over each row (no shared prompt prefix), runs its fused head at every position but the last of each
row on CPU, recomputes logits (and, with checkpointing, the layers) in the backward, keeps
zero-variance groups in the update, and counts a step per optimizer step (a batch spans
``num_iterations x steps_per_generation / gradient_accumulation_steps`` steps). The report card's ``extra`` says so, with the FLOPs the built-in
engine would have charged for the same batches.

Resume: TRL checkpoints (``trl/checkpoint-N``) every ``checkpoint_every`` optimizer steps
and at the budget stop; calling the engine again resumes from the last one (ledger and
metrics are cut back to it). Racing extends a run the same way: a directory seeded with a
shorter run's last checkpoint (``race.engines.run_io.seed_extension``) resumes it with the
larger budget (``RunDir.resume`` checks the trajectory), and ``eval.at_budgets`` evaluates
where a run of each smaller budget stops (``RunCallback.reach_budgets``); docs/trl.md.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from race.accounting import PHASES, LoRA, ModelShape, PolicyCost
from race.accounting.guard import BUDGET_STOP, reaches, step_bound, steps_in_budget
from race.cards import write_card
from race.engines.common import EvalSchedule, Progress, RunDir, make_task, run_evaluator, start_policy
from race.engines.grpo_math import lr_at
from race.engines.trl import trainer as _trainer
from race.engines.trl.config import check_trl_config, grpo_args
from race.engines.trl.reward import RaceReward
from race.rewards.base import reward_bound
from race.spec.run import RunConfig
from race.tasks import step_seed

MAX_DATASET_BATCHES = 10_000  # prompts repeat (TRL starts a new epoch) past this many batches


@dataclass(frozen=True)
class TrlState:
    """What ``TrlEngine.setup()`` builds for a run: the trainer and what RACE wraps around it."""

    tok: Any  # the policy's tokenizer
    lora: LoRA | None  # the accounting's LoRA (rank, targets)
    shape: ModelShape  # the policy's shape
    cost: PolicyCost  # shape, lora and conventions: what every FLOP rule of the run takes
    device: Any  # where the policy was loaded
    plan: Any  # the TrlStepPlan of the config (race.accounting.trl_step)
    task: Any  # the run's task
    reward: Any  # the run's reward system (race.rewards)
    problems: list[Any]  # the dataset's problems, in order (problem_idx)
    max_prompt: int  # the longest prompt of the dataset, in tokens (cut to max_prompt_length)
    total_steps: int  # batches the budget buys at the first batch's bound: the lr schedule's length
    flops: Any  # the RaceFlopCallback: ledger, budget guard, report card
    reward_fn: Any  # the RaceReward TRL calls
    run_cb: Any  # the RunCallback: metrics, evaluations, divergence, resume state
    trainer: Any  # TRL's GRPOTrainer (race.engines.trl.trainer)
    model: Any  # the trainer's model (PEFT-wrapped with LoRA)


class TrlEngine:
    """Runs a ``RunConfig`` with TRL (see module docstring). ``run()`` returns run.json."""

    name = "trl"

    def __init__(self, cfg: RunConfig, run_dir: Path, progress: Progress | None = None) -> None:
        self.cfg, self.run_dir, self.progress = cfg, Path(run_dir), progress
        self.out = RunDir(self.run_dir, cfg)
        self.schedule = EvalSchedule.of(cfg)
        self.state: TrlState  # built by setup() (not for a run already complete)

    # -- setup ---------------------------------------------------------------------------
    def _dataset(self, tok: Any, task: Any, plan: Any, cost: PolicyCost) -> tuple[Any, list[Any], int]:
        """Prompts of batches 1..N (batch b = the built-in engine's step-b problems), cut to
        their last ``max_prompt_length`` tokens; N stops once even the cheapest possible
        steps would spend the budget. Returns (dataset, problems, longest prompt)."""
        from datasets import Dataset

        from race.accounting.trl_step import trl_batch_floor

        cfg = self.cfg
        n = cfg.prompts_per_step * cfg.num_generations
        limit = min(cfg.max_steps or MAX_DATASET_BATCHES, MAX_DATASET_BATCHES)
        problems: list[Any] = []
        texts: list[str] = []
        floor = 0.0
        longest = 0
        for b in range(1, limit + 1):
            batch = task.problems("train", cfg.prompts_per_step, seed=step_seed(cfg.seed, b))
            width = 0
            for p in batch:
                ids = tok(p.prompt, add_special_tokens=False)["input_ids"]
                text = p.prompt if len(ids) <= cfg.max_prompt_length else tok.decode(ids[-cfg.max_prompt_length:])
                width = max(width, len(tok(text=text)["input_ids"]))
                problems.append(p)
                texts.append(text)
            longest = max(longest, width)
            floor += trl_batch_floor(plan, cost, n_seqs=n, prompt_width=width)
            if reaches(floor, cfg.budget_flops):
                break
        ds = Dataset.from_dict({"prompt": texts, "problem_idx": list(range(len(texts)))})
        return ds, problems, longest

    def setup(self) -> TrlState:
        """Build and return the run's state: the policy, the dataset, the reward, RACE's two
        callbacks and the trainer (see :class:`TrlState`)."""
        from transformers import PrinterCallback, ProgressCallback

        from race.engines.trl.callback import RaceFlopCallback
        from race.accounting.trl_step import TrlStepPlan
        from race.engines.trl.internals import compact_head
        from race.engines.trl.run_callback import RunCallback
        from race.rewards import make_reward

        cfg = self.cfg
        policy = start_policy(cfg, self.schedule)
        model, tok, lora, shape, device = policy.model, policy.tok, policy.lora, policy.shape, policy.device
        peft_config = _peft_config(cfg, model)
        plan = TrlStepPlan(per_device_train_batch_size=cfg.micro_batch_size,
                                gradient_accumulation_steps=cfg.accumulation_steps,
                                steps_per_generation=cfg.generation_steps, num_generations=cfg.num_generations,
                                num_iterations=cfg.num_iterations, beta=cfg.beta, compact_head=compact_head(model))
        task = make_task(cfg)
        reward = make_reward(cfg.reward, seed=cfg.seed, device=str(device), conventions=cfg.conventions,
                             task=task, tokenizer=tok)  # as the built-in engine: what a reward model reads
        cost = PolicyCost(shape, lora, cfg.conventions)
        dataset, problems, max_prompt = self._dataset(tok, task, plan, cost)
        # a reward model reads the full prompts of the dataset's problems, not TRL's cut ones
        flops = RaceFlopCallback(
            cfg.budget_flops, self.run_dir, conventions=cfg.conventions, max_prompt_length=max_prompt,
            reward_step_bound=lambda n, p, t: reward_bound(reward, n, p, t, problems), model_name=cfg.model)
        reward_fn = RaceReward(reward, problems, cfg.num_generations, flops.charge, _eos_ids(tok, model))
        total_steps = self._schedule_steps(plan, cost, reward, max_prompt, problems)
        mu = cfg.num_iterations * cfg.optimizer_steps_per_generation  # optimizer steps per batch
        args = grpo_args(cfg, self.run_dir / "trl", use_cpu=device.type == "cpu",
                         max_steps=cfg.max_steps * mu if cfg.max_steps else 10 ** 9)
        total, warm, sched, base = total_steps, cfg.warmup_steps, cfg.lr_scheduler_type, cfg.learning_rate

        def lr_factor(i: int) -> float:  # TRL's optimizer step i -> the built-in engine's lr at batch i // mu + 1
            return lr_at(i // mu + 1, base_lr=base, schedule=sched, warmup_steps=warm, total_steps=total) / base

        run_cb = RunCallback(self.out, ledger_cb=flops, reward_fn=reward_fn, reward=reward,
                             evaluator=run_evaluator(cfg, task, policy), schedule=self.schedule,
                             progress=self.progress)
        trainer = _trainer.trainer_class()(
            model=model, reward_funcs=reward_fn, args=args, train_dataset=dataset, processing_class=tok,
            peft_config=peft_config, callbacks=[flops, run_cb], lr_factor=lr_factor)
        flops.attach(trainer)
        run_cb.attach(trainer)
        for quiet in (PrinterCallback, ProgressCallback):  # the engine reports progress itself
            trainer.remove_callback(quiet)
        return TrlState(tok=tok, lora=lora, shape=shape, cost=cost, device=device, plan=plan, task=task, reward=reward,
                        problems=problems, max_prompt=max_prompt, total_steps=total_steps, flops=flops,
                        reward_fn=reward_fn, run_cb=run_cb, trainer=trainer, model=trainer.model)

    def _schedule_steps(self, plan: Any, cost: PolicyCost, reward: Any, max_prompt: int,
                        problems: list[Any]) -> int:
        """Batches of prompts the budget buys at the first batch's maximum cost (the
        built-in engine's ``total_steps``; used by warmup/cosine/linear schedules)."""
        from race.accounting.trl_step import trl_batch_bound

        cfg = self.cfg
        T = cfg.max_completion_length
        policy = trl_batch_bound(plan, cost, prompt_len=max_prompt, completion_len=T)
        bound = step_bound(policy, lambda n, p, t: reward_bound(reward, n, p, t, problems), plan.generation_batch_size,
                           max_prompt, T)
        return steps_in_budget(cfg.budget_flops, bound, cfg.max_steps, run=cfg.name)

    # -- the run ---------------------------------------------------------------------------------
    def _resume_point(self) -> str | None:
        """The last TRL checkpoint (its RACE state restored), else ``None``; its step is
        the run's ``resumed_from``."""
        from transformers.trainer_utils import get_last_checkpoint

        from race.engines.trl.run_callback import RACE_STATE

        out = self.run_dir / "trl"
        ckpt = get_last_checkpoint(str(out)) if out.is_dir() else None
        if ckpt is None:
            self.out.start_over()
            return None
        meta_path = Path(ckpt) / RACE_STATE
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        self.out.resume(meta, self.schedule, self.state.reward)
        return ckpt

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        check_trl_config(cfg)
        done = self.out.completed()
        if done is not None:
            return done
        t_start = time.perf_counter()
        self.out.begin()
        self.state = st = self.setup()
        ckpt = self._resume_point()
        resumed_from = None if ckpt is None else int(Path(ckpt).name.rsplit("-", 1)[-1])
        st.trainer.train(resume_from_checkpoint=ckpt)
        step = int(st.trainer.state.global_step)
        diverged = st.run_cb.diverged
        status = "diverged" if diverged else "complete"
        stop_reason = "diverged" if diverged else (BUDGET_STOP if st.flops.stop_reason == BUDGET_STOP else "max_steps")
        if status == "complete" and self.schedule.last_step != step:
            st.run_cb.evaluate(step)
        return self._finish(step, status, stop_reason, diverged, time.perf_counter() - t_start, resumed_from)

    def _finish(self, step: int, status: str, stop_reason: str, error: str | None, wall: float,
                resumed_from: int | None) -> dict[str, Any]:
        from race.accounting.trl_compare import builtin_same_shapes

        cfg, st = self.cfg, self.state
        led = st.flops.ledger
        assert led is not None and st.run_cb.metrics is not None
        if status == "complete":
            st.model.save_pretrained(self.run_dir / "adapter", safe_serialization=True)
        gens = st.flops.tracker.generations
        same = builtin_same_shapes(st.cost, gens, num_generations=cfg.num_generations,
                                   num_iterations=cfg.num_iterations, beta=cfg.beta,
                                   needs_old_logprobs=cfg.needs_old_logprobs)
        trl_phases = led.totals_by_phase()
        vs = {p: {"trl": int(trl_phases.get(p, 0)), "builtin_same_shapes": int(same.get(p, 0))}
              for p in (*(q for q in PHASES if q != "reward"), "recompute")}
        card = st.flops.report_card(model=cfg.model, model_params=st.shape.num_params(), extra={
            "reward": str(cfg.reward), "generations": len(gens), "vs_builtin": vs,
            "vs_builtin_note": "FLOPs the built-in engine charges for the same batches (prompt prefix shared in "
                               "every pass, head at completion predictions, no checkpointing, no group dropped); a resumed run "
                               "counts the generations since the resume"})
        write_card(card, self.run_dir)
        return self.out.finish(engine=self.name, ledger=led, metrics=st.run_cb.metrics, steps=step, status=status,
                               stop_reason=stop_reason, error=error, wall=wall, shape=st.shape,
                               resumed_from=resumed_from, budget_points=self.schedule.budget_points)


def run_trl(cfg: RunConfig, run_dir: Path, progress: Progress | None = None) -> dict[str, Any]:
    """Train ``cfg`` with TRL into ``run_dir`` (docs/run-format.md); returns run.json."""
    return TrlEngine(cfg, Path(run_dir), progress).run()


def _peft_config(cfg: Any, model: Any) -> Any:
    """PEFT's LoraConfig for the run's ``lora`` (checked against the model's modules), None
    for full fine-tuning."""
    if cfg.lora is None:
        return None
    from peft import LoraConfig

    from race.models import validate_lora

    validate_lora(model, cfg.lora)
    return LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.lora_alpha, lora_dropout=cfg.lora.lora_dropout,
                      target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM", bias="none")


def _eos_ids(tok: Any, model: Any) -> set[int]:
    """The token ids that end a completion: the tokenizer's EOS and padding, and the model's
    generation config's EOS (one id or several)."""
    eos_ids = {int(tok.eos_token_id)}
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    eos_ids |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
    eos_ids.add(int(tok.pad_token_id))
    return eos_ids


__all__ = ["TrlEngine", "run_trl"]

