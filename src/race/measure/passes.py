"""Measured FLOPs of whole passes of a real model, under the ledger's keys.

Each helper runs the model under ``Counter`` (``FlopCounterMode`` with the CPU blind spots
filled) and returns counts keyed like ``race.accounting``'s analytic ledger
(``PhaseFlops.components``): ``rollout/prefill``, ``rollout/decode``,
``old_logprobs/forward``, ``reference/forward``, ``update/forward``, ``update/backward``,
``recompute/forward``, ``reward/forward``, ``reward/head``.

Works on CPU tensors and on the meta device (shapes only, no memory: a 72B layer at full
width costs nothing), except ``measure_generate(use_generate=True)``, whose stopping
checks need real values; use ``use_generate=False`` (a greedy KV-cache loop that executes
what HF ``generate`` does) on meta models.

Attention: ``eager`` and ``sdpa`` models both measure exactly (see ``counter``); other
implementations (flash_attention_2, flex, custom kernels) may run ops the counter does not
know; ``ensure_countable`` switches a model to one that it does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Union

import torch

from .counter import Counter, FlopMeter, SdpaBackward

#: Attention implementations whose FLOPs ``Counter`` sees exactly on CPU.
COUNTABLE_ATTENTION = ("eager", "sdpa")

LogitsToKeep = Union[int, torch.Tensor]


# -- model plumbing -------------------------------------------------------------------------
def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The module ``generate`` calls once per step: the HF model under a PEFT wrapper."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _configs(model: torch.nn.Module) -> list[Any]:
    out, seen = [], set()
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and id(cfg) not in seen:
            seen.add(id(cfg))
            out.append(cfg)
    return out


def attention_implementation(model: torch.nn.Module) -> str | None:
    """The attention implementation the model's config names (``None`` if it names none)."""
    cfgs = _configs(model)
    return cfgs[0]._attn_implementation if cfgs else None


def ensure_countable(model: torch.nn.Module, attn_implementation: str | None = None) -> torch.nn.Module:
    """Make every attention call of ``model`` one the counter measures exactly.

    With ``attn_implementation=None`` a model already on ``eager`` or ``sdpa`` is left as it
    is and any other is switched to ``eager``; pass ``"eager"`` or ``"sdpa"`` to force one.
    Returns the model. (Equivalent by hand: ``config._attn_implementation = "eager"``
    before building the model, or ``model.set_attn_implementation("eager")``.)"""
    if attn_implementation is not None and attn_implementation not in COUNTABLE_ATTENTION:
        raise ValueError(f"attn_implementation={attn_implementation!r}: the counter measures "
                         f"{' and '.join(COUNTABLE_ATTENTION)} attention exactly; choose one of them")
    cfgs = _configs(model)
    if not cfgs:
        raise ValueError(f"{type(model).__name__} has no config with an attention implementation; "
                         "pass a transformers model (or a PEFT model around one)")
    cur = cfgs[0]._attn_implementation
    want = attn_implementation or (cur if cur in COUNTABLE_ATTENTION else "eager")
    setter = getattr(_causal_lm(model), "set_attn_implementation", None)
    if cur != want and callable(setter):
        try:
            setter(want)  # transformers' public switch (validates, updates sub-configs)
        except (ValueError, ImportError, NotImplementedError, AttributeError):
            pass  # models without the switch: the config field below is what attention reads
    for cfg in cfgs:
        if cfg._attn_implementation != want:
            cfg._attn_implementation = want
    return model


def _call_kwargs(attention_mask: torch.Tensor | None, logits_to_keep: LogitsToKeep, extra: dict) -> dict:
    kw = dict(extra)
    if attention_mask is not None:
        kw["attention_mask"] = attention_mask
    if isinstance(logits_to_keep, torch.Tensor) or logits_to_keep != 0:
        kw["logits_to_keep"] = logits_to_keep
    return kw


# -- forward --------------------------------------------------------------------------------
def measure_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    logits_to_keep: LogitsToKeep = 0, *, sdpa_backward: SdpaBackward = "model",
                    **model_kwargs: Any) -> int:
    """FLOPs of one no-grad forward (a log-prob pass). ``logits_to_keep`` as in HF: 0 keeps
    every position, an int k the last k, a 1D index tensor those positions, a 2D bool mask
    the ``True`` positions per sequence."""
    kw = _call_kwargs(attention_mask, logits_to_keep, model_kwargs)
    with torch.no_grad(), Counter(sdpa_backward) as c:
        model(input_ids, **kw)
    return c.total


# -- training -------------------------------------------------------------------------------
def _default_loss(output: Any) -> torch.Tensor:
    logits = output.logits if hasattr(output, "logits") else output[0]
    return torch.logsumexp(logits.float(), dim=-1).mean()


@dataclass
class TrainMeasurement:
    """One measured forward + backward. ``recompute`` is the activation-checkpointing
    forward repeated inside the backward (hardware FLOPs), already taken out of
    ``backward``."""

    forward: int
    backward: int
    recompute: int
    phase: str = "update"
    loss: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Model FLOPs (recompute excluded)."""
        return self.forward + self.backward

    @property
    def hardware_total(self) -> int:
        return self.forward + self.backward + self.recompute

    @property
    def components(self) -> dict[str, int]:
        out = {f"{self.phase}/forward": self.forward, f"{self.phase}/backward": self.backward}
        if self.recompute:
            out["recompute/forward"] = self.recompute
        return out


def measure_train_step(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       *, logits_to_keep: LogitsToKeep = 0, loss_fn: Callable[[Any], torch.Tensor] | None = None,
                       phase: str = "update", sdpa_backward: SdpaBackward = "model",
                       **model_kwargs: Any) -> TrainMeasurement:
    """Forward and backward of one training pass, counted apart.

    The forward (model call and ``loss_fn(output)``; default: mean logsumexp of the logits,
    no matmuls) is counted in one counter; ``loss.backward()`` in another, whose ops run
    with grad mode on (activation checkpointing's recompute) are reported as
    ``recompute``. Gradients accumulate into ``.grad`` as usual; no optimizer step runs.
    Put the model in ``train()`` mode yourself where gradient checkpointing should act."""
    kw = _call_kwargs(attention_mask, logits_to_keep, model_kwargs)
    loss_fn = loss_fn or _default_loss
    t0 = time.perf_counter()
    with torch.enable_grad(), Counter(sdpa_backward) as cf:
        loss = loss_fn(model(input_ids, **kw))
    t1 = time.perf_counter()
    if not loss.requires_grad:
        raise ValueError("the loss does not require grad: nothing in the model is trainable "
                         "(enable requires_grad on the weights or the LoRA adapter)")
    with Counter(sdpa_backward) as cb:
        loss.backward()
    t2 = time.perf_counter()
    rec = cb.grad_enabled_flops
    loss_val = None if loss.device.type == "meta" else float(loss.detach())
    return TrainMeasurement(forward=cf.total, backward=cb.total - rec, recompute=rec, phase=phase, loss=loss_val,
                            seconds={f"{phase}/forward": t1 - t0, f"{phase}/backward": t2 - t1})


# -- generation -----------------------------------------------------------------------------
@dataclass
class GenerateMeasurement:
    """Measured KV-cache generation: the first model call is the prefill; every later call
    (one new token each) is decode."""

    prefill: int
    decode: int
    forward_calls: int
    prompt_len: int
    new_tokens: int
    sequences: torch.Tensor
    phase: str = "rollout"
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.prefill + self.decode

    @property
    def components(self) -> dict[str, int]:
        return {f"{self.phase}/prefill": self.prefill, f"{self.phase}/decode": self.decode}


def _greedy_loop(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 max_new_tokens: int) -> torch.Tensor:
    """Greedy KV-cache decoding as HF ``generate`` executes it: prefill with logits at the
    last position, then one 1-token forward per further token (the last token is never fed
    back). Runs on meta tensors too."""
    import inspect

    from transformers import DynamicCache

    # transformers 5.x renames ``past_key_values`` to ``cache`` (the old name is deprecated).
    params = inspect.signature(_causal_lm(model).forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    cache = {cache_kw: DynamicCache()}
    mask = attention_mask
    pos = None
    if mask is not None:
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **cache)
    tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(max_new_tokens - 1):
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            pos = pos[:, -1:] + 1
        out = model(tokens[-1], attention_mask=mask, position_ids=pos, use_cache=True, **cache)
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat([input_ids, *tokens], dim=1)


def measure_generate(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                     attention_mask: torch.Tensor | None = None, *, exact_length: bool = True,
                     use_generate: bool = True, phase: str = "rollout", sdpa_backward: SdpaBackward = "model",
                     **generate_kwargs: Any) -> GenerateMeasurement:
    """FLOPs of KV-cache generation, split into prefill (the first model call) and decode.

    ``use_generate``: call ``model.generate`` (greedy unless ``generate_kwargs`` say
    otherwise; ``exact_length`` sets ``min_new_tokens = max_new_tokens`` so every
    sequence runs the full length); else a greedy DynamicCache loop (works on meta).
    ``new_tokens`` is the number of generated positions (every row of a batch runs them)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    lm = _causal_lm(model)
    marks: list[tuple[int, float]] = []
    with torch.no_grad(), Counter(sdpa_backward) as c:
        handle = lm.register_forward_hook(lambda mod, args, out: marks.append((c.total, time.perf_counter())))
        t0 = time.perf_counter()
        try:
            if use_generate:
                kw = dict(generate_kwargs)
                kw.setdefault("do_sample", False)
                if exact_length:
                    kw["min_new_tokens"] = max_new_tokens
                gc = getattr(lm, "generation_config", None)
                if gc is not None and gc.pad_token_id is None and "pad_token_id" not in kw:
                    eos = gc.eos_token_id
                    kw["pad_token_id"] = (eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else 0
                if attention_mask is not None:
                    kw["attention_mask"] = attention_mask
                seqs = model.generate(input_ids=input_ids, max_new_tokens=max_new_tokens, **kw)
            else:
                if generate_kwargs:
                    raise ValueError(f"use_generate=False takes no generate kwargs, got {sorted(generate_kwargs)}")
                seqs = _greedy_loop(model, input_ids, attention_mask, max_new_tokens)
        finally:
            handle.remove()
        total = c.total
    if not marks:
        raise RuntimeError(f"no forward call of {type(lm).__name__} was seen during generation")
    prefill = marks[0][0]
    seconds = {f"{phase}/prefill": marks[0][1] - t0, f"{phase}/decode": marks[-1][1] - marks[0][1]}
    return GenerateMeasurement(prefill=prefill, decode=total - prefill, forward_calls=len(marks),
                               prompt_len=int(input_ids.shape[1]), new_tokens=int(seqs.shape[1] - input_ids.shape[1]),
                               sequences=seqs, phase=phase, seconds=seconds)


# -- reward model ---------------------------------------------------------------------------
def _head_module(model: torch.nn.Module) -> torch.nn.Module:
    lm = _causal_lm(model)
    for name in ("score", "v_head", "classifier"):
        m = getattr(lm, name, None)
        if isinstance(m, torch.nn.Module):
            return m
    get = getattr(lm, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        raise ValueError(f"cannot find the output head of {type(lm).__name__}; pass head=<module>")
    return head


def measure_reward_forward(model: torch.nn.Module, input_ids: torch.Tensor,
                           attention_mask: torch.Tensor | None = None, *, head: torch.nn.Module | None = None,
                           sdpa_backward: SdpaBackward = "model", **model_kwargs: Any) -> dict[str, int]:
    """A reward model's no-grad forward as ``{"reward/forward": body, "reward/head": head}``
    (the head module's FLOPs, found as ``score``/``v_head``/``classifier`` or the output
    embeddings, or given). Note that HF ``*ForSequenceClassification`` models run their
    score head at every position and then pick the last one."""
    head = head if head is not None else _head_module(model)
    spans: list[int] = []
    with torch.no_grad(), Counter(sdpa_backward) as c:
        h1 = head.register_forward_pre_hook(lambda mod, args: spans.append(-c.total))
        h2 = head.register_forward_hook(lambda mod, args, out: spans.append(c.total))
        try:
            model(input_ids, **_call_kwargs(attention_mask, 0, model_kwargs))
        finally:
            h1.remove()
            h2.remove()
    head_flops = sum(spans)
    return {"reward/forward": c.total - head_flops, "reward/head": head_flops}


# -- a GRPO-like step -----------------------------------------------------------------------
TrainLogits = Union[Literal["completion", "completion+1", "all"], int]


def _keep(train_logits: TrainLogits, prompt_len: int, new_tokens: int) -> LogitsToKeep:
    if train_logits == "completion":  # the T positions that predict completion tokens
        return torch.arange(prompt_len - 1, prompt_len + new_tokens - 1)
    if train_logits == "completion+1":  # TRL: logits_to_keep = T + 1
        return new_tokens + 1
    if train_logits == "all":
        return 0
    if isinstance(train_logits, int) and not isinstance(train_logits, bool) and train_logits >= 0:
        return train_logits
    raise ValueError(f"train_logits must be 'completion', 'completion+1', 'all' or an int, got {train_logits!r}")


def measure_grpo_step(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None, *,
                      num_generations: int, max_new_tokens: int, beta: float = 0.0, num_iterations: int = 1,
                      needs_old_logprobs: bool | None = None, ref_model: torch.nn.Module | None = None,
                      train_logits: TrainLogits = "completion+1", use_generate: bool = True,
                      sdpa_backward: SdpaBackward = "model",
                      generate_kwargs: dict[str, Any] | None = None) -> FlopMeter:
    """Measure the passes of one GRPO step the way ``grpo_step_flops`` accounts them:
    rollout (each prompt repeated ``num_generations`` times, contiguous groups, generated
    to exactly ``max_new_tokens``), old-policy log-probs (when ``num_iterations > 1`` or
    asked), reference log-probs when ``beta != 0`` (``ref_model``, or the PEFT model with
    its adapter disabled), and ``num_iterations`` forward+backward updates over
    prompt+completion with the head at ``train_logits`` positions. No optimizer step runs
    (its elementwise work is 0 FLOPs). Returns the ``FlopMeter`` holding the counts."""
    if num_generations < 1:
        raise ValueError(f"num_generations={num_generations}: must be >= 1")
    if needs_old_logprobs is None:
        needs_old_logprobs = num_iterations > 1
    meter = FlopMeter(sdpa_backward)
    ids = prompt_ids.repeat_interleave(num_generations, dim=0)
    mask = prompt_mask.repeat_interleave(num_generations, dim=0) if prompt_mask is not None else None
    gen = measure_generate(model, ids, max_new_tokens, mask, use_generate=use_generate, sdpa_backward=sdpa_backward,
                           **(generate_kwargs or {}))
    meter.add(gen.components, gen.seconds)
    seqs = gen.sequences
    full_mask = None
    if mask is not None:
        full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], gen.new_tokens)], dim=1)
    keep = _keep(train_logits, gen.prompt_len, gen.new_tokens)
    kw = _call_kwargs(full_mask, keep, {})
    if needs_old_logprobs:
        with torch.no_grad(), meter.phase("old_logprobs/forward"):
            model(seqs, **kw)
    if beta != 0:
        if ref_model is not None:
            with torch.no_grad(), meter.phase("reference/forward"):
                ref_model(seqs, **kw)
        elif callable(getattr(model, "disable_adapter", None)):
            with torch.no_grad(), model.disable_adapter(), meter.phase("reference/forward"):
                model(seqs, **kw)
        else:
            raise ValueError("beta != 0 needs a reference: pass ref_model, or a PEFT model (adapter disabled)")
    for _ in range(num_iterations):
        tm = measure_train_step(model, seqs, full_mask, logits_to_keep=keep, sdpa_backward=sdpa_backward)
        meter.add(tm.components, tm.seconds)
    return meter


__all__ = [
    "COUNTABLE_ATTENTION", "GenerateMeasurement", "TrainMeasurement", "attention_implementation", "ensure_countable",
    "measure_forward", "measure_generate", "measure_grpo_step", "measure_reward_forward",
    "measure_train_step",
]
