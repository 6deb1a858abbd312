"""TRL's FLOPs beside the built-in engine's on the same shapes (``race.engines.trl_flops``,
documented in docs/trl.md): which phases cost what under each engine, and why. Standard
library only."""

from __future__ import annotations

from typing import Any, Iterable

from . import terms
from .grpo import StepPlan, rollout_components
from .passes import backward_components, forward_components, recompute_flops, sequence_work, shared_prompt_work
from .policy import PolicyCost
from .trl_step import TrlStepPlan


def _split(c: dict[str, int]) -> tuple[int, int]:
    return sum(v for k, v in c.items() if k != "head"), c.get("head", 0)


def compare_with_builtin(policy: PolicyCost, *, prompts: int, num_generations: int, prompt_len: int,
                         completion_len: int, num_iterations: int = 1, beta: float = 0.0,
                         gradient_checkpointing: bool = False, compact_head: bool = False) -> list[dict[str, Any]]:
    """Per-phase FLOPs the built-in engine and TRL charge for ONE batch of ``prompts`` x G
    sequences at the same padded lengths, with no group dropped (the built-in engine's
    ``drop_zero_variance_groups`` is a difference of what runs, not of shapes).

    Each row: ``key``, ``builtin``, ``trl``, ``same`` (bool) and ``why`` where they differ.
    Passes are split into the layers (``.../layers``: every matrix, LoRA and attention) and
    the output head (``.../head``): the layers agree wherever both run the same pass; the
    head runs at T positions per row in the built-in engine and at TRL's fused-head
    positions (S-1 on CPU, the real completion tokens with Triton)."""
    shape, conv = policy.shape, policy.conv
    G, P, T = num_generations, prompt_len, completion_len
    n, S = prompts * G, prompt_len + completion_len
    mu = num_iterations
    plan = TrlStepPlan(per_device_train_batch_size=n, num_generations=G, num_iterations=mu, beta=beta,
                       compact_head=compact_head)
    b_roll = rollout_components(policy, [P] * prompts, [T] * n, share_prompt=True)
    t_roll = rollout_components(policy, [P] * n, [T] * n, share_prompt=False)
    rows = [_row("rollout/prefill", b_roll["rollout/prefill"], t_roll["rollout/prefill"],
                 f"built-in prefills each prompt once and shares the KV cache across the G={G} samples; TRL "
                 "prefills every row"),
            _row("rollout/decode", b_roll["rollout/decode"], t_roll["rollout/decode"], "")]
    # built-in: each prompt once for its group, completions over its keys (the last token not run)
    w_b = shared_prompt_work([P] * prompts, [T] * n, [G] * prompts, conventions=conv)
    w_t = sequence_work([S] * n, [plan.head_positions(S, T)] * n, conv)
    head_why = (f"head positions: built-in {w_b.logit_positions} (each prompt's last position once, then the "
                f"first T-1={T - 1} completion positions per row), TRL {plan.head_positions(S, T)} per row "
                f"({'completion tokens' if compact_head else 'S-1: fused head on CPU'})")
    layers_why = (f"the built-in engine runs each prompt once for its G={G} completions and not the last completion "
                  f"token ({w_b.tokens} tokens through the layers against TRL's {w_t.tokens})")
    rows += _learning_rows(policy, w_b, w_t, mu, beta, gradient_checkpointing, layers_why, head_why)
    rec = 0
    if gradient_checkpointing:
        rec = mu * recompute_flops(shape, w_t, lora=policy.lora, conventions=conv, early_stop=True)
    rows.append(_row("recompute/forward", 0, rec, "TRL checkpoints the decoder layers (hardware FLOPs, not charged); "
                     "the built-in engine does not checkpoint"))
    rows.append(_row("recompute/lm_head", 0, mu * terms.head_flops(w_t.logit_positions, shape.head_matrices()),
                     "TRL's fused head recomputes the logits in its backward (hardware FLOPs, not charged)"))
    return rows


def _row(key: str, b: int, t: int, why: str = "") -> dict[str, Any]:
    """One row of :func:`compare_with_builtin`: ``why`` kept only where the two differ."""
    return {"key": key, "builtin": int(b), "trl": int(t), "same": b == t, "why": "" if b == t else why}


def _learning_rows(policy: PolicyCost, w_b: Any, w_t: Any, mu: int, beta: float, gradient_checkpointing: bool,
                   layers_why: str, head_why: str) -> list[dict[str, Any]]:
    """The old-policy and reference log-probs (where they run: ``mu`` > 1, ``beta`` != 0) and
    the update's forward and backward, layers and head apart, on the built-in engine's work
    ``w_b`` and TRL's ``w_t``."""
    shape, lora, conv = policy.shape, policy.lora, policy.conv
    fb, ft = _split(forward_components(shape, w_b, lora=lora, conventions=conv)), \
        _split(forward_components(shape, w_t, lora=lora, conventions=conv))
    ref_b, ref_t = _split(forward_components(shape, w_b, lora=None, conventions=conv)), \
        _split(forward_components(shape, w_t, lora=None, conventions=conv))
    irg_t = gradient_checkpointing and lora is not None
    bb = _split(backward_components(shape, w_b, lora=lora, conventions=conv, inputs_require_grad=False))
    bt = _split(backward_components(shape, w_t, lora=lora, conventions=conv, inputs_require_grad=irg_t))
    rows = []
    if mu > 1:  # both engines: the policy moves between the passes over one batch
        rows += [_row("old_logprobs/layers", fb[0], ft[0], layers_why),
                 _row("old_logprobs/head", fb[1], ft[1], head_why)]
    if beta != 0:
        rows += [_row("reference/layers", ref_b[0], ref_t[0], layers_why),
                 _row("reference/head", ref_b[1], ref_t[1], head_why)]
    return rows + [
        _row("update/forward/layers", mu * fb[0], mu * ft[0], layers_why),
        _row("update/forward/head", mu * fb[1], mu * ft[1], head_why),
        _row("update/backward/layers", mu * bb[0], mu * bt[0], layers_why + (
            "; with gradient checkpointing the embedding output requires grad, so TRL also runs layer-0 q/k/v input "
            "gradients" if irg_t else "")),
        _row("update/backward/head", mu * bb[1], mu * bt[1], head_why)]


def builtin_same_shapes(policy: PolicyCost, generations: Iterable[tuple[int, int, int]], *, num_generations: int,
                        num_iterations: int = 1, beta: float = 0.0,
                        needs_old_logprobs: bool | None = None) -> dict[str, int]:
    """Per-phase FLOPs the built-in engine would charge for the same batches: each
    generation ``(rows, padded prompt length, generated width)`` prefilled once per prompt,
    decoded to the same width, and trained ``num_iterations`` times with each prompt run
    once per group and the head at the completion predictions (no group dropped, no
    checkpointing, one micro-batch). ``needs_old_logprobs`` (default ``num_iterations > 1``):
    the run's rule (``RunConfig.needs_old_logprobs``: also several optimizer steps per generation)."""
    out: dict[str, int] = {}
    old = num_iterations > 1 if needs_old_logprobs is None else needs_old_logprobs
    for rows, P, W in generations:  # one micro-batch: the generation's rows
        plan = StepPlan.of(policy, num_generations, num_iterations=num_iterations, beta=beta,
                           needs_old_logprobs=old, share_prompt=True, micro_batch=rows)
        comps = plan.rollout([P] * (rows // num_generations), [W] * rows)
        comps.update(plan.learning([P + W] * rows, [W] * rows))
        for k, v in comps.items():
            phase = k.split("/", 1)[0]
            out[phase] = out.get(phase, 0) + v
    return out


__all__ = ["builtin_same_shapes", "compare_with_builtin"]
