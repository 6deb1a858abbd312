"""FLOPs of what TRL's ``GRPOTrainer`` executes, seen from the model's side: the pure rules
(standard library only; ``race.engines.trl`` records the calls and charges them).

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

Kept whole (about 390 lines): TRL's step priced call by call; its bounds and token counts read
the same calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from . import terms
from .conventions import Conventions, resolve
from .errors import AccountingError
from .grpo import StepPlan, rollout_components
from .guard import counted, step_bound  # what the budget is charged: the one rule (re-exported here)
from .passes import Work, backward_components, forward_components, recompute_flops, sequence_work
from .policy import PolicyCost

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


def calls_components(policy: PolicyCost, calls: Iterable[ModelCall]) -> dict[str, int]:
    """``phase/component`` FLOPs of executed calls of ``policy`` (FLOPs are linear in the
    work, so calls with the same flags are summed first). Its adapter is charged only on
    calls that ran with the adapter on."""
    shape, lora, conv = policy.shape, policy.lora, policy.conv
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


def generation_components(plan: TrlStepPlan, policy: PolicyCost, *, n_seqs: int, prompt_len: int,
                          completion_len: int, reference_lora: bool = False) -> dict[str, int]:
    """Counted FLOPs of one TRL generation of ``n_seqs`` rows at these padded lengths:
    rollout (no shared prefix), old-policy log-probs (if the plan needs them) and reference
    log-probs (if beta != 0; adapter off unless ``reference_lora``).

    Tools (``plan.tool_iterations`` = k): TRL's ``_tool_call_loop`` re-generates a row up to k
    more times from its history (within ``P + T`` tokens), decoding up to ``T``: each turn is
    bounded as every row at prompt ``P + T``, completion ``T`` (log-prob passes: ``P + T``)."""
    shape, lora, conv = policy.shape, policy.lora, policy.conv
    P = round_up(prompt_len, plan.pad_to_multiple_of)
    T = round_up(completion_len, plan.pad_to_multiple_of)
    comps = rollout_components(policy, [P] * n_seqs, [completion_len] * n_seqs, share_prompt=False)
    if plan.tool_iterations:
        turn = rollout_components(policy, [P + T] * n_seqs, [completion_len] * n_seqs, share_prompt=False)
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


def update_components(plan: TrlStepPlan, policy: PolicyCost, *, n_seqs: int, seq_len: int, completion_len: int,
                      inputs_require_grad: bool = True, recompute: str | None = None) -> dict[str, int]:
    """FLOPs of one update micro-batch of ``policy`` (forward + backward over ``n_seqs`` rows
    of ``seq_len`` padded tokens); ``recompute/*`` keys are hardware FLOPs."""
    head = plan.head_positions(seq_len, completion_len)
    step = StepPlan.of(policy, plan.num_generations, needs_old_logprobs=False, recompute=recompute is not None,
                       recompute_early_stop=recompute != "full", train_logits=head,
                       inputs_require_grad=inputs_require_grad)
    comps = step.learning([seq_len] * n_seqs, [completion_len] * n_seqs)
    comps["recompute/lm_head"] = terms.head_flops(n_seqs * head, policy.shape.head_matrices())
    return comps


# -- the bounds ---------------------------------------------------------------------------------
def trl_batch_bound(plan: TrlStepPlan, policy: PolicyCost, *, prompt_len: int, completion_len: int) -> int:
    """Counted policy FLOPs of one generation batch at its maximum lengths (the reward's
    apart): its generation (and log-prob passes) over ``plan.generation_batch_size`` rows,
    plus ``plan.num_iterations`` updates over them at ``prompt_len + completion_len`` (FLOPs are
    linear in rows, so the micro-batches of a step sum to this). The TRL engine's lr
    schedule length is the steps a budget buys at this bound plus the reward's."""
    n = plan.generation_batch_size
    gen = counted(generation_components(plan, policy, n_seqs=n, prompt_len=prompt_len, completion_len=completion_len))
    upd = counted(update_components(plan, policy, n_seqs=n, seq_len=prompt_len + completion_len,
                                    completion_len=completion_len))
    return gen + plan.num_iterations * upd


def trl_batch_floor(plan: TrlStepPlan, policy: PolicyCost, *, n_seqs: int, prompt_width: int) -> int:
    """Counted FLOPs a batch costs at least: its ``plan.num_iterations`` updates over
    ``n_seqs`` rows of its prompt width plus one token (the TRL engine stops building its
    dataset once the batches' floors reach the budget)."""
    return plan.num_iterations * counted(update_components(plan, policy, n_seqs=n_seqs, seq_len=prompt_width + 1,
                                                           completion_len=1, inputs_require_grad=False))


def trl_step_bound(plan: TrlStepPlan, policy: PolicyCost, micro_step: int, *, prompt_len: int, completion_len: int,
                   reference_lora: bool,
                   last_generation: tuple[int, int, int] | None, reward_bound: Callable[[int, int, int], int],
                   reward_models: Any, buffered: bool | None = None) -> int:
    """Upper bound of the counted FLOPs of the optimizer step whose first micro-step is
    ``micro_step``: completions at ``completion_len`` (``max_completion_length``), prompts
    at ``prompt_len`` (the longest prompt), every old/reference pass TRL would run, the
    reward functions' bound ``reward_bound(sequences, prompt_len, completion_len)`` and
    the reward models' (``reward_models.bound``). A micro-step generates when TRL's counter
    says so or when no generated batch is buffered (``buffered``; default: whether a
    generation was seen, ``last_generation``: the tracker's last (rows, prompt width,
    completion width))."""
    P, T = prompt_len, completion_len
    pad = plan.pad_to_multiple_of
    total = 0
    last = last_generation
    if buffered is None:
        buffered = last is not None
    width = None if last is None or not buffered else (
        round_up(last[1], pad) + round_up(last[2], pad), round_up(last[2], pad))

    def rewards(n: int, p: int, t: int) -> int:  # a generation's reward bound: the functions' and the models'
        return int(reward_bound(n, p, t)) + reward_models.bound(n, p + t)

    for i in range(plan.gradient_accumulation_steps):
        m = micro_step + i
        if plan.generates(m) or width is None:
            gen = generation_components(plan, policy, n_seqs=plan.generation_batch_size, prompt_len=P,
                                        completion_len=T, reference_lora=reference_lora)
            total += step_bound(counted(gen), rewards, plan.generation_batch_size, P, T)  # the guard's rule
            width = (round_up(P, pad) + round_up(T, pad), round_up(T, pad))
        total += counted(update_components(plan, policy, n_seqs=plan.per_device_train_batch_size,
                                           seq_len=width[0], completion_len=width[1], inputs_require_grad=True))
    return total


# -- a run trained elsewhere, charged from the token counts its logs keep --------------------------
def even_lengths(total: int, rows: int) -> tuple[int, int]:
    """``total`` tokens over ``rows`` rows as evenly as integers allow: ``(length, longer)``,
    every row ``length`` tokens and the first ``longer`` rows one more."""
    if rows < 1 or total < rows:
        raise AccountingError(f"{total} tokens cannot fill {rows} rows of at least one token each")
    base, longer = divmod(int(total), int(rows))
    return base, longer


def trl_tokens_components(plan: TrlStepPlan, policy: PolicyCost, *, n_seqs: int, prompt_tokens: int,
                          completion_tokens: int, recompute: str | None = None) -> dict[str, int]:
    """FLOPs of ``n_seqs`` rows of TRL generations and their ``plan.num_iterations`` updates,
    charged from the rows' token totals only (what TRL's logs keep: ``num_tokens`` and
    ``completions/mean_length``; a verl or W&B export's prompt and response token counts).

    Convention: each row's prompt and completion lengths are as even as integers allow
    (:func:`even_lengths`: the first rows carry the longer prompts, and the longer
    completions), and every pass runs each row at its own lengths, without padding: rollout
    per row (no shared prompt: :func:`generation_components`), the old-policy and reference
    passes where ``plan`` runs them, and ``plan.num_iterations`` updates
    (:func:`update_components`; ``recompute``: gradient checkpointing, ``None``,
    ``"early_stop"`` (non-reentrant, TRL's default) or ``"full"``; with it the layer-0 input
    gradients run). Attention grows faster than linearly in a row's length and padded rows
    run longer, so this is at most what TRL executed for the same rows; it equals it when
    every row of a generation has the same lengths (tests/protocol/test_import_trl.py)."""
    n = int(n_seqs)
    p, p_long = even_lengths(prompt_tokens, n)
    c, c_long = even_lengths(completion_tokens, n)
    both, either = min(p_long, c_long), max(p_long, c_long)
    mixed = (p + 1, c) if p_long > c_long else (p, c + 1)
    groups = [((p + 1, c + 1), both), (mixed, either - both), ((p, c), n - either)]
    out: dict[str, int] = {}
    for (plen, clen), k in groups:
        if not k:
            continue
        upd = update_components(plan, policy, n_seqs=k, seq_len=plen + clen, completion_len=clen,
                                inputs_require_grad=recompute is not None, recompute=recompute)
        for comps, times in ((generation_components(plan, policy, n_seqs=k, prompt_len=plen, completion_len=clen), 1),
                             (upd, plan.num_iterations)):
            for key, v in comps.items():
                out[key] = out.get(key, 0) + times * int(v)
    return out

__all__ = [
    "ModelCall", "TrlStepPlan", "TRL_CONVENTIONS_NOTE", "TRL_EXECUTION_NOTE", "calls_components",
    "calls_tokens_seconds", "counted", "round_up", "generation_components", "trl_batch_bound", "trl_batch_floor",
    "trl_step_bound", "trl_tokens_components", "update_components", "even_lengths",
]
