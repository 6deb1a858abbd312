"""Drop-in FLOP accounting for your own TRL ``GRPOTrainer`` script.

Two lines give a TRL run RACE's ledger, the budget stop and the compute report card::

    from race.engines.trl_callback import add_race_accounting

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), ...)
    add_race_accounting(trainer, budget_flops=2e15)      # ledger.jsonl + report card in args.output_dir
    trainer.train()

or pass ``RaceFlopCallback(budget_flops=...)`` in ``callbacks=[...]`` (then the reference model of a
full fine-tuning run with ``beta != 0`` is not visible to the callback: use ``add_race_accounting``,
which attaches it).

What it records: every call of the policy (and reference) model, turned into ``phase/component``
FLOPs as ``race.accounting.trl_step`` describes, one ledger record per key per optimizer step
(``step`` = ``state.global_step``). Rollouts that bypass the hooked model (vLLM colocate or server,
continuous batching, a ``rollout_func``) are charged from the token ids they return
(``race.engines.trl.rollouts``); reward models passed as modules in ``reward_funcs`` from their
shape (``race.engines.trl.reward_models``). With several processes each rank keeps its own ledger
and the budget is charged and decided globally (``race.engines.trl.distributed``). Calls outside
training steps (TRL's own evaluation) go to the uncounted ``eval`` phase. Before each step it bounds
the step's counted FLOPs from the maximum lengths (the longest prompt of the dataset,
``max_completion_length``) and stops training when the bound does not fit the budget, so the counted
total never exceeds it. FLOPs your reward FUNCTIONS spend on models are not visible to the hooks:
report them with :meth:`RaceFlopCallback.charge` and bound them with ``reward_step_bound`` (without
it the bound takes the largest reward charge seen so far per generation, and warns once). Should a
step still cost more than the budget has left (its bound was low), its FLOPs go to the uncounted
``overrun`` phase and training stops with ``stop_reason = "budget"``: the counted total stays within
the budget (TRL has applied that step's update; the ledger says so).

TRL's logs carry the ledger too: each ``on_log`` adds ``race/flops``, ``race/flops/<phase>``,
``race/budget_fraction`` and ``race/split/{search,learning,feedback}``
(:func:`race.accounting.log_values`) to the ``logs`` dict and to the trainer's
``state.log_history``, so whatever ``report_to`` reports shows them. ``add_race_accounting`` places
the callback before the reporting callbacks (W&B, TensorBoard, ...; passed in ``callbacks=[...]``
only the log history and later callbacks see the values), with the utilisation keys of
``race.engines.trl.usage``; ``state.total_flos`` is the ledger's counted total. A budget stop saves
and evaluates as TRL's ``max_steps`` stop does. Timing and devices: ``race.engines.trl.hooks``.

Kept whole (about 400 lines): one TrainerCallback, its hooks in the order TRL calls them."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

from race.accounting import AccountingError, BudgetGuard, FlopLedger, LoRA, ModelShape, ReportCard, check_budget, \
    counted, log_values
from race.accounting.conventions import resolve
from race.accounting.guard import is_counted
from race.accounting.policy import PolicyCost
from race.accounting.trl_step import TrlStepPlan, calls_components, calls_tokens_seconds, trl_step_bound
from race.cards import write_card
from race.engines.trl import internals, wiring
from race.engines.trl.distributed import RunLedgers
from race.engines.trl.hooks import FlopTracker, causal_lm, lora_of
from race.engines.trl.internals import compact_head
from race.engines.trl.reward_models import RewardModelMeter
from race.engines.trl.rollouts import GenerationWatch
from race.engines.trl.usage import WEIGHT_SYNC
from race.models.refs import model_shape
from race.models.timing import device_clock

RewardBound = Callable[[int, int, int], int]  # (sequences, max prompt len, max completion len) -> FLOPs


class RaceFlopCallback(TrainerCallback):
    """FLOP ledger, budget stop and report card for a TRL ``GRPOTrainer`` (see module
    docstring).

    Args:
        budget_flops: counted (model) FLOPs the run may spend; ``None`` records without a
            budget.
        output_dir: where ``ledger.jsonl`` and ``report_card.*`` go (default: the
            trainer's ``args.output_dir``).
        conventions: FLOP conventions (``race``, ``torch``, ... or a ``Conventions``).
        max_prompt_length: the longest prompt in tokens, for the step bound; default: the
            longest prompt of the training dataset, tokenised as TRL does.
        reward_step_bound: ``f(sequences, max_prompt_len, max_completion_len)``, an upper
            bound of the FLOPs your reward functions charge per generation (default: the
            largest counted charge seen so far in one call of :meth:`charge`, which is no
            guarantee: a warning says so the first time a charge is bounded that way).
        model_name: the name the report card shows.
        report_card: write ``report_card.{json,md,tex}`` when training ends.
        card_extra: more entries for the report card's ``extra``.
        sync_calls: synchronize around every hooked call (exact per-phase seconds); ``False``
            times whole generations and steps only (``race.engines.trl.hooks``). Default:
            on, off under ``torch_compile=True``.
        peak_flops: one device's peak FLOP/s for ``race/mfu/*`` (default: the table of
            ``race.engines.trl.utilisation``; no entry: MFU omitted, noted once).
    """

    def __init__(self, budget_flops: float | None = None, output_dir: str | Path | None = None, *,
                 conventions: Any = "race", max_prompt_length: int | None = None,
                 reward_step_bound: RewardBound | None = None, model_name: str | None = None,
                 report_card: bool = True, card_extra: dict[str, Any] | None = None, sync_calls: bool | None = None,
                 peak_flops: float | None = None) -> None:
        if peak_flops is not None and not peak_flops > 0:
            raise AccountingError(f"peak_flops must be > 0 (one device's peak FLOP/s), got {peak_flops!r}")
        if budget_flops is not None:
            check_budget(budget_flops, "budget_flops")
        self.budget_flops = budget_flops
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.conventions = resolve(conventions)
        self.max_prompt_length = max_prompt_length
        self.reward_step_bound = reward_step_bound
        self.model_name = model_name
        self.write_card = report_card
        self.card_extra = dict(card_extra or {})
        self.sync_calls, self.peak_flops = sync_calls, peak_flops
        self.tracker = FlopTracker(sync=sync_calls is not False)
        self.reward_models = RewardModelMeter(self.conventions, clock=lambda device: self.tracker.clock(device))
        self.micro_steps = 0  # training_step calls seen (on_substep_end + on_step_end), TRL's _step
        self.watch: GenerationWatch | None = None
        self.ledgers: RunLedgers | None = None
        self.ledger: FlopLedger | None = None  # the global ledger (the run's, on one process)
        self.guard: BudgetGuard | None = None  # the budget decisions over it (race.accounting.guard)
        self.shape: ModelShape | None = None
        self.lora: LoRA | None = None
        self.policy: PolicyCost | None = None  # shape, lora and conventions: every charge's cost context
        self.plan: TrlStepPlan | None = None
        self.stop_reason: str | None = None
        self.reference_lora = False
        self._models: list[tuple[Any, str]] = []
        self._attached = self._has_ref_model = False
        self._undo: list[Callable[[], None]] = []
        self._pending: list[tuple[dict[str, int], dict[str, int], dict[str, float]]] = []
        self._outside: dict[str, int] = {}  # charges between steps (TRL's evaluation): uncounted eval
        self._in_step, self._t_step = False, None
        self._device: Any = None  # the policy's: per-phase seconds synchronize it when it is CUDA
        self._max_completion, self._trainer = 0, None
        self._reward_seen = 0  # largest counted FLOPs of one charge() call (the bound without reward_step_bound)
        self._warned_bound = False
        self.overrun_flops = 0  # FLOPs of a step the budget could not take (recorded uncounted)
        self.rollout_location = "policy"  # policy (hooked generate) | vllm_colocate | vllm_server | ...
        self.table_peak = wiring.TablePeak()  # the table's peak for the policy (wiring.utilisation_logs), read once

    def attach(self, trainer: Any) -> "RaceFlopCallback":
        """Hook the trainer's policy and, when TRL keeps one, its reference model."""
        import weakref

        internals.check_trl(trainer)
        self._trainer = weakref.ref(trainer)
        self.micro_steps = 0
        self._models = [(trainer.model, "policy")]
        ref = getattr(trainer, "ref_model", None)
        if ref is not None:
            self._models.append((ref, "reference"))
            self._has_ref_model = True
        self._install()
        return self

    def _install(self) -> None:
        if self._attached:
            return
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is not None:  # first: a reward model it cannot read is refused before any hook is in place
            self.reward_models.attach(getattr(trainer, "reward_funcs", None))
        for model, role in self._models:
            self.tracker.attach(model, role=role)
        if trainer is not None:
            args = trainer.args
            vllm = bool(getattr(trainer, "use_vllm", getattr(args, "use_vllm", False)))
            bypass = vllm or bool(getattr(args, "use_transformers_continuous_batching", False))
            lora = lora_of(self._models[0][0], model_shape(self._models[0][0])) is not None
            self.watch = GenerationWatch(self.tracker, lora=lora and not vllm, bypass=bypass, executed=vllm,
                                         device=self._policy_device)
            self._undo.append(internals.wrap_generation(trainer, self.watch.single_turn))
            rollout_func = getattr(trainer, "rollout_func", None)
            self.rollout_location = wiring.rollout_location(trainer, args)
            sync = getattr(trainer, "vllm_generation", None) if vllm else None  # timed apart: rollout/weight_sync
            self._undo += [u for u in [wiring.time_weight_sync(sync, self.tracker, self._policy_device)] if u]
            if rollout_func is not None:
                trainer.rollout_func = self.watch.wrap_rollout_func(rollout_func)
                self._undo.append(lambda: setattr(trainer, "rollout_func", rollout_func))
        self._attached = True

    def _policy_device(self) -> Any:  # now: the trainer may move the model after attach
        return next(self._models[0][0].parameters()).device

    def _uninstall(self) -> None:
        if self._attached:
            self.tracker.detach()
            self.reward_models.detach()
            while self._undo:
                self._undo.pop()()
            self._attached = False

    def charge(self, components: dict[str, int], *, tokens: dict[str, int] | None = None,
               seconds: dict[str, float] | None = None) -> None:
        """Add ``phase/component`` FLOPs the hooks cannot see (e.g. a reward model) to the
        current step's records (between steps, e.g. in TRL's evaluation, to the uncounted
        ``eval`` phase)."""
        for k in components:
            phase, sep, comp = k.partition("/")
            if not sep or not comp:
                raise ValueError(f"component key {k!r} must be 'phase/component', e.g. 'reward/forward'")
        if not self._in_step:
            for k, v in components.items():
                key = f"eval/{k.replace('/', '_')}"
                self._outside[key] = self._outside.get(key, 0) + int(v)
            return
        self._pending.append((dict(components), dict(tokens or {}), dict(seconds or {})))
        charged = counted(components)
        if charged and self.reward_step_bound is None:
            self._reward_seen = max(self._reward_seen, charged)
            if self.budget_flops is not None and not self._warned_bound:
                self._warned_bound = True
                warnings.warn("RaceFlopCallback.charge() got counted FLOPs but no reward_step_bound was given: the "
                              "step bound uses the largest charge seen so far, which is no guarantee; pass "
                              "reward_step_bound=f(sequences, max_prompt_len, max_completion_len) (a step that "
                              "overruns the budget ends training as a budget stop, its FLOPs recorded uncounted)",
                              stacklevel=2)

    # -- the step bound -----------------------------------------------------------------
    def step_bound(self, micro_step: int, *, buffered: bool | None = None) -> int:
        """Upper bound of the counted FLOPs of the optimizer step whose first micro-step
        (``training_step`` call) is ``micro_step``: completions at ``max_completion_length``,
        prompts at the longest prompt, every old/reference pass TRL would run. A micro-step
        generates when TRL's counter says so or when no generated batch is buffered
        (``buffered``; default: whether a generation was seen)."""
        assert self.plan is not None and self.policy is not None and self.max_prompt_length is not None
        given = self.reward_step_bound
        return trl_step_bound(self.plan, self.policy, micro_step, prompt_len=self.max_prompt_length,
                              completion_len=self._max_completion, reference_lora=self.reference_lora, last_generation=self.tracker.last_generation,
                              reward_bound=given if given is not None else lambda n, p, t: self._reward_seen,
                              reward_models=self.reward_models, buffered=buffered)

    def next_step_bound(self, state: Any) -> int:
        """``step_bound`` of the next optimizer step: the micro-step counted from the
        callback events (``training_step`` calls, as TRL's own counter, which restarts with
        the trainer on resume) and TRL's generation buffer when the trainer is attached."""
        assert self.plan is not None
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is not None:
            return self.step_bound(self.micro_steps, buffered=internals.has_buffered_batch(trainer))
        return self.step_bound(self.micro_steps)

    # -- TrainerCallback events ---------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, processing_class: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        if self._trainer is None and (getattr(args, "use_vllm", False) or
                                      getattr(args, "use_transformers_continuous_batching", False)):
            raise AccountingError("generation runs outside the hooked model (use_vllm / continuous batching): the "
                                  "callback must see the trainer to charge it from the token ids; use "
                                  "add_race_accounting(trainer, ...) instead of passing it in callbacks=[...]")
        if not self._models:
            if model is None:
                raise AccountingError("RaceFlopCallback got no model: use add_race_accounting(trainer, ...)")
            self._models = [(model, "policy")]
        policy = self._models[0][0]
        self._device = None  # read at each step begin: accelerate may move the model after this
        if self.sync_calls is None:
            self.tracker.sync = not bool(getattr(args, "torch_compile", False))
        self.shape = model_shape(policy)
        self.lora = lora_of(policy, self.shape)
        self.policy = PolicyCost(self.shape, self.lora, self.conventions)
        peft_ref = hasattr(policy, "peft_config") and "ref" in getattr(policy, "peft_config", {})
        self.reference_lora = bool(peft_ref)
        if float(getattr(args, "beta", 0.0)) != 0 and self.lora is None and not self._has_ref_model:
            raise AccountingError(
                "beta != 0 with full fine-tuning: TRL computes reference log-probs with a separate model the callback "
                "cannot see; use add_race_accounting(trainer, ...) (or callback.attach(trainer)) instead of "
                "passing the callback in callbacks=[...]")
        self._install()
        self.plan = TrlStepPlan.from_args(args, compact_head=compact_head(causal_lm(policy)))
        trainer = self._trainer() if self._trainer is not None else None
        self.plan = wiring.trainer_plan(self.plan, trainer, args)  # vLLM's IS correction, the tool loop
        self._max_completion = int(args.max_completion_length)
        if self.watch is not None:
            self.watch.num_generations = self.plan.num_generations
        if self.max_prompt_length is None:
            self.max_prompt_length = wiring.dataset_prompt_bound(trainer, train_dataloader, processing_class, args)
        out = self.output_dir or Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.output_dir = out
        self.ledgers = RunLedgers(out, self.budget_flops, resume_step=int(state.global_step), args=args)
        self.ledger = self.ledgers.ledger
        self.guard = BudgetGuard(self.ledger)
        self.stop_reason = None
        self.tracker.drain()
        self._pending.clear()
        self._outside.clear()
        self._in_step = False
        try:
            self.guard.check_first_step(self.ledgers.global_bound(self.next_step_bound(state)), step="one TRL step",
                                        shrink="batch, num_generations, max_completion_length")
        except AccountingError:
            self._uninstall()
            raise

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush_outside(int(state.global_step))
        self._in_step = True
        self._device = self._policy_device()
        self._t_step = device_clock(self._device)

    def _flush_outside(self, step: int) -> None:
        """Calls and charges between steps (TRL's evaluation loop) go to the uncounted eval phase."""
        calls = self.tracker.drain()
        comps = dict(self._outside)
        self._outside.clear()
        for k, v in self.reward_models.drain()[0].items():
            key = f"eval/{k.replace('/', '_')}"
            comps[key] = comps.get(key, 0) + v
        if calls:
            for k, v in calls_components(self.policy, calls).items():  # type: ignore[arg-type]
                if is_counted(k):  # model FLOPs only: hardware recompute is not evaluation
                    key = f"eval/{k.replace('/', '_')}"
                    comps[key] = comps.get(key, 0) + v
        if self.ledgers is not None:
            self.ledgers.record_uncounted(step, comps)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self.ledger is not None and self.policy is not None and self.plan is not None
        self.micro_steps += 1
        self._in_step = False
        now = device_clock(self._device)
        wall = now - (self._t_step or now)
        calls = self.tracker.drain()
        comps = calls_components(self.policy, calls)
        tokens, seconds = calls_tokens_seconds(calls)
        if any(c.phase == "rollout" for c in calls):  # the generate loop's own time, split like its calls
            roll = seconds.get("rollout/prefill", 0.0) + seconds.get("rollout/decode", 0.0)
            extra = max(0.0, self.tracker.generate_seconds - roll)
            seconds["rollout/decode"] = seconds.get("rollout/decode", 0.0) + extra
        self.tracker.generate_seconds = 0.0
        if self.tracker.weight_sync_seconds:  # seconds only: the sync moves weights, it runs no model FLOPs
            comps[WEIGHT_SYNC] = 0
            seconds[WEIGHT_SYNC] = self.tracker.weight_sync_seconds
            self.tracker.weight_sync_seconds = 0.0
        for c, t, s in [*self._pending, self.reward_models.drain()]:
            for k, v in c.items():
                comps[k] = comps.get(k, 0) + int(v)
            for k, v in t.items():
                tokens[k] = tokens.get(k, 0) + int(v)
            for k, v in s.items():
                seconds[k] = seconds.get(k, 0.0) + float(v)
        self._pending.clear()
        if "update/forward" in comps:
            seconds["update/backward"] = max(0.0, wall - sum(seconds.values()))
        assert self.ledgers is not None
        assert self.guard is not None
        # an overrun (the bound was low: the FLOPs are on record, uncounted) stops on every rank, as does a
        # next step whose bound does not fit; a budget stop saves and evaluates as TRL's max_steps stop does
        over = self.ledgers.commit(int(state.global_step), comps, tokens, seconds, self.guard)
        state.total_flos = float(self.ledger.total)  # saved with each checkpoint: the ledger's counted total
        self.overrun_flops += over
        if self.guard.stop_after(over, lambda: self.ledgers.global_bound(self.next_step_bound(state)), control):
            wiring.keep_work(args, control)
            self.stop_reason = self.guard.stop_reason

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.micro_steps += 1  # a training_step call that did not end an optimizer step

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Add the ledger's values (:func:`race.accounting.log_values`) to TRL's ``logs`` and
        to the history entry the trainer just appended for them."""
        if self.ledger is None or logs is None:
            return
        trainer = self._trainer() if self._trainer is not None else None
        values = {**log_values(self.ledger), **wiring.utilisation_logs(self, args, state, self._models[0][0], trainer)}
        logs.update(values)
        hist = getattr(state, "log_history", None)
        # Trainer.log appended {**logs, "step": ...} just before on_log: the same value objects
        if hist and hist[-1].get("step") == state.global_step and all(
                hist[-1].get(k, hist) is v for k, v in logs.items() if k not in values):
            hist[-1].update(values)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.ledger is not None:
            self._flush_outside(int(state.global_step))
            if self.write_card and self.output_dir is not None and self.ledgers is not None and self.ledgers.is_main:
                write_card(self.report_card(), self.output_dir)
        self._uninstall()

    def report_card(self, **meta: Any) -> ReportCard:
        """The run's compute report card from the ledger so far."""
        return wiring.report_card(self, meta)


def add_race_accounting(trainer: Any, budget_flops: float | None = None, output_dir: str | Path | None = None,
                        **kwargs: Any) -> RaceFlopCallback:
    """Add a :class:`RaceFlopCallback` to ``trainer`` (hooking its policy and reference
    model) and return it. ``kwargs`` go to the callback. It is placed before the reporting
    callbacks (``report_to``), so they log the FLOPs it adds to TRL's logs."""
    from transformers import DefaultFlowCallback

    cb = RaceFlopCallback(budget_flops, output_dir, **kwargs).attach(trainer)
    trainer.add_callback(cb)
    callbacks = trainer.callback_handler.callbacks
    callbacks.remove(cb)
    first = next((i for i, c in enumerate(callbacks) if not isinstance(c, DefaultFlowCallback)), len(callbacks))
    callbacks.insert(first, cb)
    return cb


__all__ = ["RaceFlopCallback", "add_race_accounting"]
