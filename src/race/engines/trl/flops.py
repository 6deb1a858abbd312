"""FLOPs of what TRL's ``GRPOTrainer`` executes, seen from the model's side.

:class:`race.engines.trl.hooks.FlopTracker` hooks the policy (and TRL's separate reference model, when there is
one) and records every call of the causal LM: its padded input shape, the KV cache it
extends, the positions where the output head runs, whether autograd records it, whether
the LoRA adapter is on and whether gradient checkpointing will recompute it. Each call
becomes ``phase/component`` FLOPs under the run's conventions through
``race.accounting``'s pure functions (:func:`calls_components`):

=============================  ==============================================================
call                           charged to
=============================  ==============================================================
inside ``generate``            ``rollout/prefill`` (its first call), ``rollout/decode`` (the rest)
no grad, adapter on            ``old_logprobs/forward``
no grad, adapter off / "ref"   ``reference/forward`` (also every call of a separate ref model)
grad                           ``update/forward`` + ``update/backward``; ``recompute/forward``
                               when the decoder layers are checkpointed; ``recompute/lm_head``
                               for TRL's fused head (below)
=============================  ==============================================================

TRL 1.16 behaviour followed here (trl/trainer/grpo_trainer.py, trl/trainer/utils.py,
trl/kernels/chunked_logprob.py):

- rollout: ``model.generate`` over the left-padded prompts of the generation batch, one row
  per completion (no prefix shared across the G samples); prefill with the head at the last
  position, then one 1-token call per step until every row has ended (finished rows keep
  running, padded);
- log-prob passes (old policy, reference, update) run the backbone over the padded
  prompt+completion and TRL's fused LM head (``add_fused_lm_head``) over the positions
  whose next-token label is kept: with Triton on CUDA/XPU only the real completion tokens
  ("compact"); elsewhere (CPU) every position but the last of each row;
- the fused head's backward recomputes the logits tile by tile (hardware FLOPs:
  ``recompute/lm_head``, not counted), then runs the input gradient (and the weight
  gradient of a trainable head) as in-place ``addmm_``;
- old-policy log-probs run only when ``gradient_accumulation_steps % (steps_per_generation
  * num_iterations) != 0`` or under vLLM's importance-sampling correction; reference log-probs only when ``beta != 0``;
- gradient checkpointing (TRL's default) recomputes each decoder layer in the backward:
  non-reentrant by default (torch's early stop skips each layer's last matmul), reentrant
  when ``gradient_checkpointing_kwargs={"use_reentrant": True}``; with it transformers
  (and TRL, for PEFT) make the embedding output require grad, so layer 0's q/k/v input
  gradients run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from race.accounting import (
    LoRA,
    ModelShape,
    Work,
    backward_components,
    forward_components,
    learning_components,
    prompt_groups,
    recompute_flops,
    rollout_components,
    sequence_work,
    shared_prompt_work,
)
from race.accounting import terms
from race.accounting.conventions import Conventions, resolve
from race.accounting.errors import AccountingError
from race.accounting.guard import counted  # what the budget is charged: the one rule (re-exported here)

ConvLike = Conventions | str | None

#: What a TRL run executes differently from the built-in engine, for the report card.
TRL_EXECUTION_NOTE = (
    "TRL engine (TRL GRPOTrainer): generation through model.generate over left-padded prompts, one row per "
    "completion (no prompt prefix shared across the G samples: prefill costs G times the built-in engine's); "
    "decode runs until the longest row ends. Log-prob and update passes run the backbone over the padded "
    "prompt+completion and TRL's fused LM head at every position but the last of each row on CPU "
    "(only the real completion tokens with Triton on CUDA/XPU); the built-in engine runs each prompt once for "
    "its group in these passes too (its completions over the prompt's keys and values, the last token not run) "
    "and the head at the completion predictions. The fused head's backward recomputes the logits (recompute/lm_head) and gradient "
    "checkpointing recomputes the decoder layers (recompute/forward): hardware FLOPs, recorded, not charged. "
    "With checkpointing, layer-0 q/k/v input gradients run (embedding output requires grad). Zero-variance "
    "groups stay in the update (advantage 0). A TRL step is one optimizer step: with num_iterations=mu a batch of "
    "prompts spans mu steps. Where execution is the same (decode over equal padded shapes) both engines charge "
    "the same FLOPs."
)

#: The same in one line, appended to the report card's conventions text.
TRL_CONVENTIONS_NOTE = ("executed by TRL: prefill and log-prob passes per row (no shared prompt prefix), "
                        "fused LM head at "
                        "S-1 positions per row on CPU (completion tokens with Triton), its logit recompute and "
                        "checkpointing recompute as hardware FLOPs")


# -- one model call ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelCall:
    """One executed call of the causal LM (all rows of the batch)."""

    phase: str  # rollout | old_logprobs | reference | update
    component: str  # prefill | decode (rollout); forward otherwise
    batch: int
    new_tokens: int  # columns of this call's input (padded)
    cached: int  # KV-cache length it extends
    head_positions: int  # rows x positions where the output head ran
    lora: bool  # adapter active
    fused_head: bool = False  # TRL's chunked log-prob head (its backward recomputes the logits)
    inputs_require_grad: bool = False  # layer 0 saw an input that requires grad
    recompute: str | None = None  # None | "early_stop" (non-reentrant) | "full" (reentrant)
    recompute_layers: int = 0  # decoder layers checkpointed (all, or every n-th)
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    def work(self, conventions: ConvLike = None) -> Work:
        conv = resolve(conventions)
        pairs = self.batch * terms.attention_pairs(self.new_tokens, self.cached, conv.attention)
        pos = self.tokens if conv.logits == "all" else self.head_positions
        return Work(self.tokens, pairs, pos)

    def key(self) -> tuple:
        return (self.phase, self.component, self.lora, self.fused_head, self.inputs_require_grad, self.recompute,
                self.recompute_layers)


def calls_components(shape: ModelShape, calls: Iterable[ModelCall], *, lora: LoRA | None,
                     conventions: ConvLike = None) -> dict[str, int]:
    """``phase/component`` FLOPs of executed calls (FLOPs are linear in the work, so calls
    with the same flags are summed first). ``lora`` describes the adapter; it is charged
    only on calls that ran with the adapter on."""
    conv = resolve(conventions)
    groups: dict[tuple, tuple[ModelCall, Work, int]] = {}
    for c in calls:
        w = c.work(conv)
        if c.key() in groups:
            first, acc, head = groups[c.key()]
            groups[c.key()] = (first, acc + w, head + c.head_positions)
        else:
            groups[c.key()] = (c, w, c.head_positions)
    out: dict[str, int] = {}

    def add(k: str, v: int) -> None:
        out[k] = out.get(k, 0) + int(v)

    for c, w, head_positions in groups.values():
        lo = lora if c.lora else None
        fwd = sum(forward_components(shape, w, lora=lo, conventions=conv).values())
        if c.phase == "rollout":
            add(f"rollout/{c.component}", fwd)
            continue
        if c.phase == "executed":  # what vLLM executed of a charged rollout (race.engines.trl.rollouts)
            add(f"executed/rollout_{c.component}", fwd)
            continue
        add(f"{c.phase}/forward", fwd)
        if c.phase != "update":
            continue
        add("update/backward", sum(backward_components(shape, w, lora=lo, conventions=conv,
                                                       inputs_require_grad=c.inputs_require_grad).values()))
        if c.recompute and c.recompute_layers:
            add("recompute/forward", recompute_flops(shape.with_layers(c.recompute_layers), w, lora=lo,
                                                     conventions=conv, early_stop=c.recompute == "early_stop"))
        if c.fused_head:
            add("recompute/lm_head", terms.head_flops(head_positions, shape.head_matrices()))
    return out


def calls_tokens_seconds(calls: Iterable[ModelCall]) -> tuple[dict[str, int], dict[str, float]]:
    """Tokens processed and wall seconds per ledger key (``update/forward`` holds the
    update's forward time; its backward time is measured by the caller)."""
    tokens: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for c in calls:
        k = {"rollout": f"rollout/{c.component}", "executed": f"executed/rollout_{c.component}"}.get(
            c.phase, f"{c.phase}/forward")
        tokens[k] = tokens.get(k, 0) + c.tokens
        seconds[k] = seconds.get(k, 0.0) + c.seconds
    return tokens, seconds


# -- what TRL runs: plan and uniform-shape components (bounds, cross-checks) -------------------
def round_up(n: int, k: int | None) -> int:
    """``n`` rounded up to a multiple of ``k`` (TRL's ``pad_to_multiple_of``; ``None``: ``n``)."""
    return n if not k else -(-n // k) * k


@dataclass(frozen=True)
class TrlStepPlan:
    """How TRL batches optimizer steps on one process, and how its log-prob head runs."""

    per_device_train_batch_size: int
    num_generations: int
    gradient_accumulation_steps: int = 1
    steps_per_generation: int = 1
    num_iterations: int = 1
    beta: float = 0.0
    compact_head: bool = False  # fused head on Triton devices: completion tokens only
    pad_to_multiple_of: int | None = None
    vllm_is_correction: bool = False  # use_vllm with importance-sampling correction: old log-probs every generation
    num_processes: int = 1  # data-parallel ranks: TRL's generation batch is global
    tool_iterations: int = 0  # tool-calling turns after the first (0: no tools)

    def __post_init__(self) -> None:
        if min(self.per_device_train_batch_size, self.gradient_accumulation_steps, self.num_processes) < 1 or \
                self.tool_iterations < 0:
            raise AccountingError("per_device_train_batch_size, gradient_accumulation_steps and num_processes must "
                                  f"be >= 1 and tool_iterations >= 0, got {self}")
        # TRL (grpo_config.py) requires full prompt groups in the GLOBAL generation batch only: one rank may hold
        # part of a group (8 GPUs, per-device 4, G=16 is valid)
        if self.global_generation_batch_size % self.num_generations:
            raise AccountingError(
                f"global generation batch {self.global_generation_batch_size} (per_device_train_batch_size x "
                f"num_processes x steps_per_generation) is not a multiple of num_generations={self.num_generations}")

    @classmethod
    def from_args(cls, args: Any, *, compact_head: bool = False) -> "TrlStepPlan":
        """From a ``GRPOConfig`` (after its ``__post_init__``)."""
        pad = args.pad_to_multiple_of if isinstance(args.pad_to_multiple_of, int) else None
        return cls(per_device_train_batch_size=int(args.per_device_train_batch_size),
                   num_generations=int(args.num_generations),
                   gradient_accumulation_steps=int(args.gradient_accumulation_steps),
                   steps_per_generation=int(args.steps_per_generation or args.gradient_accumulation_steps),
                   num_iterations=int(args.num_iterations), beta=float(args.beta), compact_head=compact_head,
                   pad_to_multiple_of=pad, vllm_is_correction=bool(getattr(args, "use_vllm", False)) and bool(
                       getattr(args, "vllm_importance_sampling_correction", False)),
                   num_processes=int(getattr(args, "world_size", 1) or 1))

    @property
    def generate_every(self) -> int:
        """Micro-steps (``training_step`` calls) between generations."""
        return self.steps_per_generation * self.num_iterations

    @property
    def generation_batch_size(self) -> int:  # rows one rank generates at a time
        return self.per_device_train_batch_size * self.steps_per_generation

    @property
    def global_generation_batch_size(self) -> int:  # all ranks together: TRL's generation_batch_size
        return self.generation_batch_size * self.num_processes

    @property
    def needs_old_logprobs(self) -> bool:
        """TRL computes old-policy log-probs when a generation's batches are not all used
        inside one optimizer step, and always under vLLM's importance-sampling correction."""
        return self.gradient_accumulation_steps % self.generate_every != 0 or self.vllm_is_correction

    def generates(self, micro_step: int) -> bool:
        return micro_step % self.generate_every == 0

    def head_positions(self, seq_len: int, completion_len: int) -> int:
        """Per row, where the fused head runs in a log-prob pass."""
        return completion_len if self.compact_head else seq_len - 1


def generation_components(shape: ModelShape, plan: TrlStepPlan, *, n_seqs: int, prompt_len: int,
                          completion_len: int, lora: LoRA | None = None, conventions: ConvLike = None,
                          reference_lora: bool = False) -> dict[str, int]:
    """Counted FLOPs of one TRL generation of ``n_seqs`` rows at these padded lengths:
    rollout (no shared prefix), old-policy log-probs (if the plan needs them) and reference
    log-probs (if beta != 0; adapter off unless ``reference_lora``).

    Tools (``plan.tool_iterations`` = k): TRL's ``_tool_call_loop`` re-generates a row up to k
    more times from its history (within ``P + T`` tokens), decoding up to ``T``: each turn is
    bounded as every row at prompt ``P + T``, completion ``T`` (log-prob passes: ``P + T``)."""
    conv = resolve(conventions)
    P = round_up(prompt_len, plan.pad_to_multiple_of)
    T = round_up(completion_len, plan.pad_to_multiple_of)
    comps = rollout_components(shape, [P] * n_seqs, [completion_len] * n_seqs, lora=lora, share_prompt=False,
                               conventions=conv)
    if plan.tool_iterations:
        turn = rollout_components(shape, [P + T] * n_seqs, [completion_len] * n_seqs, lora=lora, share_prompt=False,
                                  conventions=conv)
        for k, v in turn.items():
            comps[k] = comps.get(k, 0) + plan.tool_iterations * v
    S = P + T
    work = sequence_work([S] * n_seqs, plan.head_positions(S, T), conv)
    if plan.needs_old_logprobs:
        comps["old_logprobs/forward"] = sum(forward_components(shape, work, lora=lora, conventions=conv).values())
    if plan.beta != 0:
        comps["reference/forward"] = sum(forward_components(shape, work, lora=lora if reference_lora else None,
                                                            conventions=conv).values())
    return comps


def update_components(shape: ModelShape, plan: TrlStepPlan, *, n_seqs: int, seq_len: int, completion_len: int,
                      lora: LoRA | None = None, inputs_require_grad: bool = True, recompute: str | None = None,
                      conventions: ConvLike = None) -> dict[str, int]:
    """FLOPs of one update micro-batch (forward + backward over ``n_seqs`` rows of
    ``seq_len`` padded tokens); ``recompute/*`` keys are hardware FLOPs."""
    conv = resolve(conventions)
    head = plan.head_positions(seq_len, completion_len)
    comps = learning_components(shape, [seq_len] * n_seqs, [completion_len] * n_seqs, lora=lora,
                                needs_old_logprobs=False, recompute=recompute is not None,
                                recompute_early_stop=recompute != "full", train_logits=head,
                                inputs_require_grad=inputs_require_grad, conventions=conv)
    comps["recompute/lm_head"] = terms.head_flops(n_seqs * head, shape.head_matrices())
    return comps


# -- the built-in engine on the same shapes ----------------------------------------------------
def _split(c: dict[str, int]) -> tuple[int, int]:
    return sum(v for k, v in c.items() if k != "head"), c.get("head", 0)


def compare_with_builtin(shape: ModelShape, *, prompts: int, num_generations: int, prompt_len: int,
                         completion_len: int, lora: LoRA | None = None, num_iterations: int = 1,
                         beta: float = 0.0, gradient_checkpointing: bool = False, compact_head: bool = False,
                         conventions: ConvLike = None) -> list[dict[str, Any]]:
    """Per-phase FLOPs the built-in engine and TRL charge for ONE batch of ``prompts`` x G
    sequences at the same padded lengths, with no group dropped (the built-in engine's
    ``drop_zero_variance_groups`` is a difference of what runs, not of shapes).

    Each row: ``key``, ``builtin``, ``trl``, ``same`` (bool) and ``why`` where they differ.
    Passes are split into the layers (``.../layers``: every matrix, LoRA and attention) and
    the output head (``.../head``): the layers agree wherever both run the same pass; the
    head runs at T positions per row in the built-in engine and at TRL's fused-head
    positions (S-1 on CPU, the real completion tokens with Triton)."""
    conv = resolve(conventions)
    G, P, T = num_generations, prompt_len, completion_len
    n, S = prompts * G, prompt_len + completion_len
    mu = num_iterations
    plan = TrlStepPlan(per_device_train_batch_size=n, num_generations=G, num_iterations=mu, beta=beta,
                       compact_head=compact_head)
    needs_old = mu > 1  # both engines: the policy moves between the passes over one batch
    b_roll = rollout_components(shape, [P] * prompts, [T] * n, lora=lora, share_prompt=True, conventions=conv)
    t_roll = rollout_components(shape, [P] * n, [T] * n, lora=lora, share_prompt=False, conventions=conv)
    rows: list[dict[str, Any]] = []

    def row(key: str, b: int, t: int, why: str = "") -> None:
        rows.append({"key": key, "builtin": int(b), "trl": int(t), "same": b == t, "why": "" if b == t else why})

    row("rollout/prefill", b_roll["rollout/prefill"], t_roll["rollout/prefill"],
        f"built-in prefills each prompt once and shares the KV cache across the G={G} samples; TRL prefills every row")
    row("rollout/decode", b_roll["rollout/decode"], t_roll["rollout/decode"], "")
    # built-in: each prompt once for its group, completions over its keys (the last token not run)
    w_b = shared_prompt_work([P] * prompts, [T] * n, [G] * prompts, conventions=conv)
    w_t = sequence_work([S] * n, [plan.head_positions(S, T)] * n, conv)
    head_why = (f"head positions: built-in {w_b.logit_positions} (each prompt's last position once, then the "
                f"first T-1={T - 1} completion positions per row), TRL {plan.head_positions(S, T)} per row "
                f"({'completion tokens' if compact_head else 'S-1: fused head on CPU'})")
    layers_why = (f"the built-in engine runs each prompt once for its G={G} completions and not the last completion "
                  f"token ({w_b.tokens} tokens through the layers against TRL's {w_t.tokens})")
    lo = lora
    fb, ft = _split(forward_components(shape, w_b, lora=lo, conventions=conv)), \
        _split(forward_components(shape, w_t, lora=lo, conventions=conv))
    ref_b, ref_t = _split(forward_components(shape, w_b, lora=None, conventions=conv)), \
        _split(forward_components(shape, w_t, lora=None, conventions=conv))
    irg_t = gradient_checkpointing and lora is not None
    bb = _split(backward_components(shape, w_b, lora=lo, conventions=conv, inputs_require_grad=False))
    bt = _split(backward_components(shape, w_t, lora=lo, conventions=conv, inputs_require_grad=irg_t))
    if needs_old:
        row("old_logprobs/layers", fb[0], ft[0], layers_why)
        row("old_logprobs/head", fb[1], ft[1], head_why)
    if beta != 0:
        row("reference/layers", ref_b[0], ref_t[0], layers_why)
        row("reference/head", ref_b[1], ref_t[1], head_why)
    row("update/forward/layers", mu * fb[0], mu * ft[0], layers_why)
    row("update/forward/head", mu * fb[1], mu * ft[1], head_why)
    row("update/backward/layers", mu * bb[0], mu * bt[0], layers_why + (
        "; with gradient checkpointing the embedding output requires grad, so TRL also runs layer-0 q/k/v input "
        "gradients" if irg_t else ""))
    row("update/backward/head", mu * bb[1], mu * bt[1], head_why)
    rec = 0
    if gradient_checkpointing:
        rec = mu * recompute_flops(shape, w_t, lora=lo, conventions=conv, early_stop=True)
    row("recompute/forward", 0, rec, "TRL checkpoints the decoder layers (hardware FLOPs, not charged); "
        "the built-in engine does not checkpoint")
    row("recompute/lm_head", 0, mu * terms.head_flops(w_t.logit_positions, shape.head_matrices()),
        "TRL's fused head recomputes the logits in its backward (hardware FLOPs, not charged)")
    return rows


def builtin_same_shapes(shape: ModelShape, generations: Iterable[tuple[int, int, int]], *, num_generations: int,
                        num_iterations: int = 1, beta: float = 0.0, lora: LoRA | None = None,
                        conventions: ConvLike = None) -> dict[str, int]:
    """Per-phase FLOPs the built-in engine would charge for the same batches: each
    generation ``(rows, padded prompt length, generated width)`` prefilled once per prompt,
    decoded to the same width, and trained ``num_iterations`` times with each prompt run
    once per group and the head at the completion predictions (no group dropped, no
    checkpointing, one micro-batch)."""
    conv = resolve(conventions)
    out: dict[str, int] = {}
    for rows, P, W in generations:
        comps = rollout_components(shape, [P] * (rows // num_generations), [W] * rows, lora=lora, share_prompt=True,
                                   conventions=conv)
        comps.update(learning_components(shape, [P + W] * rows, [W] * rows, lora=lora, num_iterations=num_iterations,
                                         beta=beta, needs_old_logprobs=num_iterations > 1, train_logits="completion",
                                         prompt_groups=prompt_groups(rows, num_generations, rows),
                                         conventions=conv))
        for k, v in comps.items():
            phase = k.split("/", 1)[0]
            out[phase] = out.get(phase, 0) + v
    return out


__all__ = [
    "ModelCall", "TrlStepPlan", "TRL_CONVENTIONS_NOTE", "TRL_EXECUTION_NOTE", "builtin_same_shapes", "calls_components",
    "calls_tokens_seconds", "compare_with_builtin", "counted", "round_up", "generation_components", "update_components",
]
