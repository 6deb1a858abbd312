"""Rollouts that do not run through the hooked model, charged from the token ids TRL gets
back.

With ``use_vllm=True`` (colocate or server), ``use_transformers_continuous_batching=True``
or a ``rollout_func``, TRL's generation never calls the hooked ``model.generate``. What
those generators execute is ragged, not padded: every row is prefilled at its own prompt
length, with the head at its last position, and decoded one token at a time until its
own completion ends (the EOS token included). :class:`RolloutBlock` charges exactly that
through ``race.accounting.generate_work`` (``share_prompt=False``: no prompt prefix is
assumed shared across the G samples; vLLM's prefix cache can only save on it), under the
run's conventions and the same ``rollout/prefill`` / ``rollout/decode`` keys as the
measured path. It is what the hooks record for the same tokens generated row by row
through ``model.generate`` (tests/engines/test_trl_vllm_tokens.py checks it).

LoRA: TRL merges the adapter into the weights it sends to vLLM, so vLLM rollouts carry no
adapter FLOPs; continuous batching runs the PEFT model itself, adapter on.

:class:`GenerationWatch` wraps TRL's ``_generate_single_turn`` (through
``race.engines.trl.internals``) and a ``rollout_func``. When a call produced no
``rollout`` call in the tracker (the generation bypassed ``model.generate``), whatever the
hooks saw during it (a paged continuous-batching forward is no training pass) is dropped
and the generated rows are charged as :class:`RolloutBlock` records. Seconds: the call's
wall time, under ``rollout/decode``, less the vLLM weight sync inside it (TRL syncs the
weights at the first generation of a step; the callback books that time as
``rollout/weight_sync``, no FLOPs).

Charged and executed prefill (vLLM): the counted ``rollout/prefill`` charges every row (the
budget's bound: safe). vLLM executes less: in server mode TRL sends each prompt once with
``n=G``; in colocate mode every row is sent and vLLM's prefix cache (reset at each weight
sync) serves the repeats. With ``executed=True`` the watch also records the prefill of each
run of identical consecutive prompts once (at most ``num_generations`` rows per run) as the
uncounted ``executed/rollout_prefill``: what ran (colocate: an estimate, the cache works in
whole blocks; a group split across ranks is counted on each rank that holds part of it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from race.accounting import Work, generate_work
from race.accounting.conventions import Conventions, resolve
from race.accounting.errors import AccountingError
from race.models.timing import device_clock


#: How those rows are charged, for the report card.
ROLLOUT_NOTE = ("charged from their token ids: each row prefilled at its own prompt length and decoded to its own "
                "completion length (no padding, no prompt prefix shared across the G samples)")


@dataclass(frozen=True)
class RolloutBlock:
    """Rows generated outside the hooked model (see module docstring): a record the
    tracker holds beside its ``ModelCall``s, with the same interface."""

    component: str  # prefill | decode
    prompt_lens: tuple[int, ...]
    completion_lens: tuple[int, ...]
    lora: bool
    seconds: float = 0.0
    phase: str = "rollout"
    fused_head: bool = False
    inputs_require_grad: bool = False
    recompute: str | None = None
    recompute_layers: int = 0

    def __post_init__(self) -> None:
        if self.component not in ("prefill", "decode"):
            raise AccountingError(f"RolloutBlock component must be prefill or decode, got {self.component!r}")

    def work(self, conventions: Conventions | str | None = None) -> Work:
        prefill, decode = generate_work(self.prompt_lens, self.completion_lens, conventions=resolve(conventions))
        return prefill if self.component == "prefill" else decode

    @property
    def tokens(self) -> int:
        if self.component == "prefill":
            return sum(self.prompt_lens)
        return sum(t - 1 for t in self.completion_lens)

    @property
    def head_positions(self) -> int:
        return len(self.prompt_lens) if self.component == "prefill" else self.tokens

    def key(self) -> tuple:
        return (self.phase, self.component, self.lora, False, False, None, 0)


def rollout_blocks(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], *, lora: bool,
                   seconds: float = 0.0) -> list[RolloutBlock]:
    """Prefill and decode records of rows generated outside the hooked model. A row with
    no completion token still ran its prefill (and its head at the last position)."""
    if len(prompt_ids) != len(completion_ids):
        raise AccountingError(f"the generator returned {len(completion_ids)} completions for {len(prompt_ids)} "
                              "prompts: cannot charge its rollouts")
    if not prompt_ids:
        return []
    plens = tuple(len(p) for p in prompt_ids)
    if min(plens) < 1:
        raise AccountingError("a generated row has an empty prompt: cannot charge its prefill")
    clens = tuple(max(1, len(c)) for c in completion_ids)
    return [RolloutBlock("prefill", plens, clens, lora), RolloutBlock("decode", plens, clens, lora, seconds)]


def prompt_runs(prompt_ids: Sequence[Sequence[int]], num_generations: int) -> list[int]:
    """Index of the first row of each run of identical consecutive prompts, a run holding
    at most ``num_generations`` rows (TRL lays out each prompt's G rows side by side)."""
    firsts: list[int] = []
    run = 0
    for i, p in enumerate(prompt_ids):
        if i and run < num_generations and list(p) == list(prompt_ids[i - 1]):
            run += 1
            continue
        firsts.append(i)
        run = 1
    return firsts


class GenerationWatch:
    """Charges generation that bypasses the hooked model (see module docstring).

    Args:
        tracker: the callback's ``FlopTracker``.
        lora: whether the generator runs the policy's LoRA adapter (not under vLLM).
        bypass: the run is known to generate outside ``model.generate`` (vLLM,
            continuous batching): the hooks are paused during generation.
        device: the policy's device (synchronized for the timing), or a function that
            returns it (read at each generation: the model may move after attach).
    """

    def __init__(self, tracker: Any, *, lora: bool, bypass: bool, device: Any = None, executed: bool = False,
                 num_generations: int = 1) -> None:
        self.tracker, self.lora, self.bypass, self._device = tracker, lora, bypass, device
        self.executed, self.num_generations = executed, num_generations
        self.charged_rows = 0  # rows charged from token ids so far (0: every rollout was measured)

    @property
    def device(self) -> Any:
        return self._device() if callable(self._device) else self._device

    def _run(self, fn: Callable[[], Any], prompt_ids_of: Callable[[Any], Any],
             completion_ids_of: Callable[[Any], Any], num_generations: int | None = None) -> Any:
        tr = self.tracker
        if tr.is_paused:
            return fn()
        start = len(tr.calls)
        synced = tr.weight_sync_seconds
        device = self.device
        t0 = device_clock(device)
        with tr.paused() if self.bypass else contextlib.nullcontext():
            out = fn()
        seconds = max(0.0, device_clock(device) - t0 - (tr.weight_sync_seconds - synced))
        if any(c.phase == "rollout" for c in tr.calls[start:]):
            return out  # generation ran through the hooked model.generate: measured
        del tr.calls[start:]
        prompts, completions = prompt_ids_of(out), completion_ids_of(out)
        blocks = rollout_blocks(prompts, completions, lora=self.lora, seconds=seconds)
        tr.calls.extend(blocks)
        if self.executed and blocks:
            firsts = prompt_runs(prompts, num_generations or self.num_generations)
            tr.calls.append(RolloutBlock("prefill", tuple(len(prompts[i]) for i in firsts),
                                         tuple(blocks[0].completion_lens[i] for i in firsts), self.lora,
                                         phase="executed"))
        if blocks:
            shape = (len(prompts), max(blocks[0].prompt_lens), max(blocks[0].completion_lens))
            tr.last_generation = shape
            tr.generations.append(shape)
            self.charged_rows += len(prompts)
        return out

    def single_turn(self, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Observer for ``internals.wrap_generation``: TRL's
        ``_generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, ...)``
        returns ``(completion_ids, logprobs)``."""
        prompt_ids = args[0] if args else kwargs["prompt_ids"]
        n = args[3] if len(args) > 3 else kwargs.get("num_generations", 1)
        return self._run(lambda: original(*args, **kwargs), lambda out: prompt_ids, lambda out: out[0],
                         num_generations=int(n or 1))

    def wrap_rollout_func(self, rollout_func: Callable[..., Any]) -> Callable[..., Any]:
        """A ``rollout_func(prompts, trainer)`` (TRL's public hook) whose returned
        ``prompt_ids`` / ``completion_ids`` are charged when it bypassed the hooks."""

        def watched(*args: Any, **kwargs: Any) -> Any:
            return self._run(lambda: rollout_func(*args, **kwargs), lambda out: out["prompt_ids"],
                             lambda out: out["completion_ids"])

        watched.__wrapped__ = rollout_func  # type: ignore[attr-defined]
        return watched


__all__ = ["GenerationWatch", "ROLLOUT_NOTE", "RolloutBlock", "prompt_runs", "rollout_blocks"]
