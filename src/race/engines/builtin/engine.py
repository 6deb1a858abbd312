"""RACE's built-in GRPO engine: a lean loop that charges every phase to the FLOP ledger.

One step reads top to bottom as named stages over one batch:

    prompts -> rollout (shared-prefix prefill + KV-cache decode, G samples per prompt)
            -> reward -> group-relative advantages (zero-variance groups dropped)
            -> old-policy log-probs (if num_iterations > 1 or several optimizer steps per generation)
            -> reference log-probs (if beta != 0; the base with the adapter off)
            -> clipped policy update: num_iterations passes, each of
               steps_per_generation / gradient_accumulation_steps optimizer steps

The log-prob passes and the update run in micro-batches of ``per_device_train_batch_size``
sequences with gradients accumulated (TRL's ``gradient_accumulation_steps``; the ledger is
the one-batch step's), and ``gradient_checkpointing`` recomputes the decoder layers in the
update's backward, recorded as uncounted ``recompute`` (``race.engines.builtin.micro_batch``).

Prompts are shared across their group in every pass, as in the rollout's prefill: the
log-prob passes and the update run each group's prompt once per micro-batch and its G
completions over that prompt's keys and values (``fast_forward.shared_prompt_logits``,
charged as ``learning_components(prompt_groups=...)``: the same log-probs and gradients,
fewer FLOPs). A model the functional forward does not support (or a gradient-checkpointing
one) runs HF's unshared forward and is charged for that.

Each stage charges what it executed (padded tensors included) under the run's FLOP
conventions. Before a step the engine bounds its cost (this step's prompts, completions at
``max_completion_length``, no group dropped, a reward model reading the full prompts) and
stops when the bound does not fit the budget, so the ledger total never exceeds the
budget. Should a bound ever be low, the step's exact cost is known before its update runs:
when it does not fit, the update is skipped, the rollout and reward FLOPs already executed
go to the uncounted ``overrun`` phase, and the run ends as a clean ``budget`` stop (the
model is the one the budget paid for). Evaluation is charged to the ``eval`` phase, never
to the budget.

Determinism: every step seeds its own random streams from (seed, step), so a run resumed
from a checkpoint continues exactly as an uninterrupted one.

Kept whole (about 390 lines): one engine, its stages in the order of ``EngineLifecycle`` and
``StepMember``.
"""

from __future__ import annotations

import copy
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from race.accounting import BudgetGuard, FlopLedger, ReportCard
from race.accounting.guard import BUDGET_STOP, plan_step_bound
from race.cards import write_card
from race.engines.checkpoint import cut_lines, find_checkpoint, load_checkpoint, save_checkpoint
from race.engines.common import (
    DivergedError,
    EvalSchedule,
    Progress,
    RunDir,
    default_torch_threads,
    make_task,
    run_evaluator,
    start_policy,
)
from race.engines.builtin import micro_batch
from race.engines.kernels import fast_forward
from race.engines.builtin.state import BuiltinState, RunBooks
from race.engines.builtin.step_parts import StepStages
from race.engines.grpo_math import grpo_loss
from race.engines.run_io import MetricsLog
from race.engines.sampling import Rollout, encode_prompts, sample
from race.estimate import run_step_plan
from race.models.timing import device_clock
from race.rewards.base import reward_bound
from race.spec.run import RunConfig
from race.tasks import step_seed

__all__ = ["BuiltinEngine", "DivergedError", "default_torch_threads", "run_builtin"]


class BuiltinEngine(StepStages):
    """The GRPO loop (see module docstring). ``run()`` returns the run.json dict. One run's
    stages of a step are :class:`race.engines.builtin.step_parts.StepStages`' (what a gang
    step asks of its members: ``race.engines.StepMember``)."""

    name = "builtin"

    def __init__(self, cfg: RunConfig, run_dir: Path, progress: Progress | None = None) -> None:
        self.cfg, self.run_dir, self.progress = cfg, Path(run_dir), progress
        self.out = RunDir(self.run_dir, cfg)
        self.schedule = EvalSchedule.of(cfg)
        # the lifecycle (race.engines.builtin.state): start() builds the state (not for a run
        # already complete), open_books() opens the records once the run knows where it starts
        self.state: BuiltinState
        self.books: RunBooks
        self._warned_cut = False

    # -- setup ------------------------------------------------------------------------
    def setup(self) -> BuiltinState:
        """Build and return the run's state (loads the models: see :class:`BuiltinState`)."""
        from race.models import wrap_lora
        from race.rewards import make_reward

        cfg = self.cfg
        policy = start_policy(cfg, self.schedule)
        model, tok = policy.model, policy.tok
        ref_model = None
        if cfg.lora is not None:
            model = wrap_lora(model, cfg.lora)
        elif cfg.beta != 0:
            ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        early_stop = micro_batch.enable_checkpointing(model) if cfg.gradient_checkpointing else True
        share = fast_forward.supports(model)  # prefix-shared passes (module docstring)
        task = make_task(cfg, tok)
        reward = make_reward(cfg.reward, seed=cfg.seed, device=str(policy.device), conventions=cfg.conventions,
                             task=task, tokenizer=tok)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        evaluator = run_evaluator(cfg, task, policy)
        # the rollout shares prompts always, the learning passes where supported
        step_plan = run_step_plan(cfg, policy.shape, engine="builtin", share_learning=share,
                                  recompute_early_stop=early_stop)
        return BuiltinState(model=model, ref_model=ref_model, tok=tok, lora=policy.lora, shape=policy.shape,
                            device=policy.device, task=task, reward=reward, optimizer=optimizer, evaluator=evaluator,
                            step_plan=step_plan, share_prompts=share, recompute_early_stop=early_stop)

    def start(self) -> None:
        """The run's state, built once (:meth:`setup`)."""
        self.state = self.setup()

    def open_books(self, resumed_from: int | None, total_steps: int | None = None, *, ledger: Any = None,
                   metrics: Any = None) -> RunBooks:
        """Open the run's records where the run directory stands (after a resume cut it back):
        its ledger and metrics (``ledger``/``metrics`` in their place where given), its
        ``BudgetGuard``, and the lr schedule's length: ``total_steps`` (a gang checkpoint's),
        else the steps the budget buys at step 1's bound, a function of the config alone, so
        a resumed run keeps the schedule of an uninterrupted one."""
        cfg = self.cfg
        ledger = FlopLedger(self.run_dir / "ledger.jsonl", budget=cfg.budget_flops) if ledger is None else ledger
        metrics = MetricsLog(self.run_dir / "metrics.jsonl") if metrics is None else metrics
        guard = BudgetGuard(ledger)
        if total_steps is None:
            problems1, ids1, _ = self.prompts_at(1)
            total_steps = guard.steps_bought(self.step_bound(ids1.shape[1], problems1), cfg.max_steps, run=cfg.name)
        self.books = RunBooks(ledger, guard, metrics, total_steps, resumed_from)
        return self.books

    def prompts_at(self, step: int) -> tuple[list[Any], torch.Tensor, torch.Tensor]:
        cfg, st = self.cfg, self.state
        problems = st.task.problems("train", cfg.prompts_per_step, seed=step_seed(cfg.seed, step))
        ids, mask = encode_prompts(st.tok, [p.prompt for p in problems], st.device)
        if ids.shape[1] > cfg.max_prompt_length:  # keep the end of over-long prompts (TRL does the same)
            if not self._warned_cut and (cfg.task.prompt_template or cfg.task.chat_template):
                self._warned_cut = True
                warnings.warn(f"templated prompts of up to {ids.shape[1]} tokens are cut to their last "
                              f"max_prompt_length={cfg.max_prompt_length}: the template's start (a system turn) is "
                              "lost; raise max_prompt_length", stacklevel=2)
            ids, mask = ids[:, -cfg.max_prompt_length:], mask[:, -cfg.max_prompt_length:]
        return problems, ids, mask

    def step_bound(self, prompt_len: int, problems: list[Any] | None = None) -> int:
        """Upper bound of one step's counted FLOPs: completions at max length, no group
        dropped; a reward model reads the full prompts of ``problems`` (not the policy's
        prompts cut to ``max_prompt_length``)."""
        cfg, st = self.cfg, self.state
        return plan_step_bound(st.step_plan, cfg.prompts_per_step, prompt_len, cfg.max_completion_length,
                               lambda n, p, t: reward_bound(st.reward, n, p, t, problems))

    # -- stages -----------------------------------------------------------------------
    def rollout(self, step: int, ids: torch.Tensor, mask: torch.Tensor) -> Rollout:
        return sample(self.state.model, ids, mask, **self.start_rollout(step).kwargs())

    def _logprobs(self, model: Any, ro: Rollout) -> torch.Tensor:
        return micro_batch.logprobs(model, ro, self.cfg.micro_batch_size, self.cfg.temperature,
                                    share=self.state.share_prompts)

    def update(self, batch: Rollout, adv: torch.Tensor, step: int) -> dict[str, float]:
        """Old/reference log-probs, then ``num_iterations`` passes over the batch, each of
        ``steps_per_generation / gradient_accumulation_steps`` clipped optimizer steps over
        the next ``gradient_accumulation_steps`` micro-batches of ``per_device_train_batch_size``
        sequences (``race.engines.builtin.micro_batch``). The statistics are the last pass's
        (loss: the mean of its optimizer steps'; clip fraction and KL: token means)."""
        from race.models import reference_policy

        st, plan = self.state, self.update_plan(batch)
        timings: dict[str, float] = {}
        t0 = device_clock(st.device)
        old = None
        if plan.old:
            st.model.eval()
            with torch.no_grad():
                old = self._logprobs(st.model, batch)
        timings["old_logprobs"] = device_clock(st.device) - t0
        t0 = device_clock(st.device)
        ref = None
        if plan.ref:
            if st.ref_model is not None:
                with torch.no_grad():
                    ref = self._logprobs(st.ref_model, batch)
            else:
                with reference_policy(st.model) as base:
                    ref = self._logprobs(base, batch)
        timings["reference"] = device_clock(st.device) - t0
        t0 = device_clock(st.device)
        lr = self.start_update(step)
        stats = None
        chunks = plan.chunks
        for _ in range(plan.iterations):
            acc = micro_batch.Accumulator()
            for slices in chunks:
                self.zero_grad()
                stats = micro_batch.accumulate_gradients(st.model, batch, adv, plan.mask, old, ref, size=plan.size,
                                                         temperature=plan.temperature, loss_fn=grpo_loss,
                                                         loss_kwargs=plan.loss_kwargs, step=step,
                                                         share=st.share_prompts, slices=slices)
                self.optimizer_step()
                acc.add(stats, 1.0 / len(chunks), float(plan.mask[micro_batch.span(slices)].sum()))
            if len(chunks) > 1:
                stats = acc.stats()
        timings["update"] = device_clock(st.device) - t0
        assert stats is not None
        return {"loss": stats.loss, "clip_frac": stats.clip_frac, "kl": stats.kl, "lr": lr, **{
            f"seconds_{k}": v for k, v in timings.items()}}

    # -- bookkeeping --------------------------------------------------------------------
    def evaluate(self, step: int) -> list[dict[str, Any]]:
        st, books = self.state, self.books
        return self.schedule.evaluate(st.evaluator, st.model, books.ledger, books.metrics, step)

    def checkpoint(self, step: int) -> None:
        self.write_checkpoint(self.run_dir, step, self.save_meta())

    # -- the lifecycle in stages (race.engines.EngineLifecycle: what the gang drives) -----------
    @property
    def total_steps(self) -> int:
        return self.books.total_steps

    @property
    def model(self) -> Any:
        """The policy being trained (once set up)."""
        return self.state.model

    @property
    def last_eval_step(self) -> int:
        """The step of the run's last evaluation."""
        return self.schedule.last_step

    def prepare(self) -> None:
        """Setup: the run directory opened for writing, the run's state built."""
        self.out.begin()
        self.start()

    def begin(self) -> None:
        """A fresh run: the run directory started over, its books opened."""
        self.out.start_over()
        self.open_books(None)

    def resume_from(self, meta: dict[str, Any], step: int, total_steps: int) -> None:
        """Continue at ``step`` from a checkpoint's ``meta`` (the weights already restored):
        the run directory's files cut back to it, the books reopened with ``total_steps``."""
        self._restore_files(meta)
        self.open_books(step, total_steps)

    def _restore_files(self, meta: dict[str, Any]) -> None:
        self.out.resume(meta, self.schedule, self.state.reward)
        if "ledger_records" in meta:  # back to exactly what was written when the checkpoint was taken
            cut_lines(self.run_dir / "ledger.jsonl", int(meta["ledger_records"]))
            cut_lines(self.run_dir / "metrics.jsonl", int(meta["metrics_rows"]))

    def may_step(self, step: int, bound: int) -> bool:
        """Before step ``step + 1`` of at most ``bound`` FLOPs: evaluate at the smaller budgets
        this run passes (``eval.at_budgets``), then whether the guard lets the step start."""
        st, books = self.state, self.books
        self.schedule.reach_budgets(st.evaluator, st.model, books.ledger, books.metrics, step, bound)
        return books.guard.may_start(bound)

    def eval_due(self) -> bool:
        """Whether the evaluation schedule is due at the FLOPs spent so far."""
        return self.schedule.due(self.books.ledger.total)

    def save_meta(self) -> dict[str, Any]:
        """What a checkpoint records of the run: its files' state and the record counts."""
        return dict(self.out.checkpoint_meta(self.schedule, self.state.reward), ledger_records=len(self.books.ledger),
                    metrics_rows=len(self.books.metrics.rows))

    def write_checkpoint(self, directory: Path, step: int, meta: dict[str, Any]) -> None:
        """The policy's trainable weights and the optimizer's state at ``step``, with ``meta``,
        written to ``directory`` as ``race.engines.checkpoint`` writes a run's checkpoint."""
        save_checkpoint(directory, model=self.state.model, optimizer=self.state.optimizer, step=step, meta=meta)

    def read_checkpoint(self, ckpt: Path) -> dict[str, Any]:
        """Checkpoint ``ckpt``'s weights and optimizer state restored; returns its meta."""
        return load_checkpoint(ckpt, model=self.state.model, optimizer=self.state.optimizer)

    def _resume(self) -> int | None:
        """The checkpoint's step (its state restored, the files cut back to it), else None."""
        ckpt = find_checkpoint(self.run_dir)
        if ckpt is None:
            self.out.start_over()
            return None
        meta = self.read_checkpoint(ckpt)
        self._restore_files(meta)
        return int(meta["step"])

    # -- the run --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        done = self.out.completed()
        if done is not None:
            return done
        t_start = time.perf_counter()
        self.out.begin()
        self.start()
        resumed_from = self._resume()
        step = resumed_from or 0
        books = self.open_books(resumed_from)
        if step:  # a checkpoint without record counts (older runs): drop the steps after it
            books.ledger.truncate_after(step)
            books.metrics.truncate_after(step)
        if resumed_from is None:
            self.evaluate(0)
        status, stop_reason, error = "complete", BUDGET_STOP, None
        try:
            while True:
                if cfg.max_steps and step >= cfg.max_steps:
                    stop_reason = "max_steps"
                    break
                problems, ids, mask = self.prompts_at(step + 1)
                bound = self.step_bound(ids.shape[1], problems)
                self.schedule.reach_budgets(self.state.evaluator, self.state.model, books.ledger, books.metrics, step,
                                            bound)
                if not books.guard.may_start(bound):
                    break
                step += 1
                if not self._train_step(step, problems, ids, mask):  # the budget could not take it: stop
                    step -= 1
                    break
                if self.schedule.due(books.ledger.total):
                    self.evaluate(step)
                if step % cfg.checkpoint_every == 0:
                    self.checkpoint(step)
        except DivergedError as e:
            status, stop_reason, error = "diverged", "diverged", f"{e}; kept the last good checkpoint"
        if status == "complete" and self.schedule.last_step != step:
            self.evaluate(step)
        if status == "complete":
            self.checkpoint(step)
        return self.finish(step, status, stop_reason, error, time.perf_counter() - t_start)

    def _train_step(self, step: int, problems: list[Any], ids: torch.Tensor, mask: torch.Tensor) -> bool:
        """One step, charged to the ledger; False (nothing charged, what ran recorded as
        ``overrun``) when its exact cost does not fit the budget."""
        cfg, st = self.cfg, self.state
        torch.manual_seed(step_seed(cfg.seed, step, "torch"))  # LoRA dropout etc.
        # 1. rollout
        t0 = device_clock(st.device)
        ro = self.rollout(step, ids, mask)
        t_roll = device_clock(st.device) - t0
        roll = self.rollout_charge(ro)
        # 2-3. reward and advantages; groups whose rewards are all equal carry no signal
        sc = self.score(problems, ro, step)
        if not self.may_continue(step, roll, sc, t_roll):  # the bound was low: no update, ran recorded as overrun
            return False
        upd: dict[str, float] = {}
        if sc.batch is not None:
            # 4-6. old/ref log-probs and the update
            upd = self.update(sc.batch, sc.adv[sc.rows].to(st.device), step)
        # charge the ledger: what executed
        learning_seconds = {"old_logprobs/forward": upd.get("seconds_old_logprobs", 0.0),
                            "reference/forward": upd.get("seconds_reference", 0.0),
                            "update/forward": upd.get("seconds_update", 0.0)}
        return self.charge(step, ro, roll, sc, upd, t_roll, learning_seconds)

    def finish(self, step: int, status: str, stop_reason: str, error: str | None, wall: float) -> dict[str, Any]:
        cfg, st, books = self.cfg, self.state, self.books
        if status == "complete":
            st.model.save_pretrained(self.run_dir / "adapter", safe_serialization=True)
        card = ReportCard.from_ledger(books.ledger, conventions=cfg.conventions, model=cfg.model,
                                      model_params=st.shape.num_params(),
                                      lora_rank=cfg.lora.r if cfg.lora is not None else None,
                                      num_generations=cfg.num_generations, extra={"engine": self.name,
                                                                                  "reward": str(cfg.reward)})
        write_card(card, self.run_dir)
        return self.out.finish(engine=self.name, ledger=books.ledger, metrics=books.metrics, steps=step, status=status,
                               stop_reason=stop_reason, error=error, wall=wall, shape=st.shape,
                               resumed_from=books.resumed_from, budget_points=self.schedule.budget_points)


def run_builtin(cfg: RunConfig, run_dir: Path, progress: Progress | None = None) -> dict[str, Any]:
    """Train ``cfg`` with the built-in engine into ``run_dir``; returns run.json."""
    return BuiltinEngine(cfg, run_dir, progress).run()
