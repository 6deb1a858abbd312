"""FLOPs of one GRPO step, split by phase.

Phases and when they run (docs/design.md section 2):

- ``rollout``: always; the prompt is prefilled once per prompt when the engine shares the
  prefix across the G samples (``share_prompt``), else G times; then KV-cache decode.
- ``old_logprobs``: a no-grad forward over every sequence the update trains on, only when
  the engine needs it (``num_iterations > 1`` or off-policy correction).
- ``reference``: a no-grad forward only when ``beta != 0``; with LoRA the reference is the
  base with the adapter off (no LoRA FLOPs), computed once per batch.
- ``reward``: per the reward kind's head rule (``race.accounting.reward_kinds``): a rule
  0; a model one forward with its head where the rule says (an outcome RM's last token, a
  process RM's step markers), or a generative judge's prefill + decode with its own shape.
- ``update``: forward + backward over every sequence it trains on, once per iteration.
- ``recompute``: gradient checkpointing's second forward of the decoder layers, once per
  iteration: hardware FLOPs, reported apart and excluded from ``total`` (model FLOPs).

The rollout and the reward run over all ``num_generations`` sequences of each prompt; the
learning passes (old-policy and reference log-probs, the update, the recompute) over the
``update_generations`` of them the update trains on (``StepPlan.update_generations``: PODS's
m of n, chosen by the rewards; None: all of them).

The formulas take a :class:`StepPlan` (a step's shapes and settings) and the lengths of the
call (:func:`step_flops`, :func:`learning_flops`); the plan holds the policy's
:class:`race.accounting.policy.PolicyCost` (shape, adapter, conventions). The keyword forms
``grpo_step_flops``, ``learning_components`` and ``uniform_step_flops``, which build a plan,
live in :mod:`race.accounting.compat`.

Kept whole (about 400 lines): the phases, a step's FLOPs and the StepPlan that carries their
settings are one job, read together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence, Union

from .conventions import Conventions
from .errors import AccountingError
from .lora import LoRA
from .passes import (
    Work,
    backward_components,
    forward_components,
    generate_components,
    generate_work,
    recompute_flops,
    sequence_work,
    shared_prompt_work,
)
from .policy import PolicyCost
from .phases import PHASES, SPLIT, SPLIT_COLUMNS, split_sums  # the vocabulary, re-exported
from .reward_kinds import RULE, RewardSystem  # the reward kinds' table (re-exported)
from .shapes import ModelShape

TrainLogits = Union[Literal["completion", "completion+1", "all"], int]
HeadPositions = Union[str, Sequence[int], None]  # a reward model's scoring head: "last", "all" or per sequence


@dataclass
class PhaseFlops:
    """Per-phase FLOPs of one step. ``total`` is model FLOPs (recompute excluded);
    ``hardware_total`` adds the recompute. ``components`` holds ``phase/component`` keys
    (the same keys the measured ledger uses)."""

    rollout: int = 0
    old_logprobs: int = 0
    reference: int = 0
    reward: int = 0
    update: int = 0
    recompute: int = 0
    components: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.rollout + self.old_logprobs + self.reference + self.reward + self.update

    @property
    def hardware_total(self) -> int:
        return self.total + self.recompute

    def as_dict(self) -> dict[str, int]:
        d = {p: getattr(self, p) for p in PHASES}
        d["recompute"] = self.recompute
        d["total"] = self.total
        return d

    def __add__(self, other: "PhaseFlops") -> "PhaseFlops":
        comps = dict(self.components)
        for k, v in other.components.items():
            comps[k] = comps.get(k, 0) + v
        return PhaseFlops(*(getattr(self, p) + getattr(other, p) for p in (*PHASES, "recompute")), components=comps)

    def scaled(self, k: int) -> "PhaseFlops":
        return PhaseFlops(*(getattr(self, p) * k for p in (*PHASES, "recompute")),
                          components={n: v * k for n, v in self.components.items()})


def _train_logits(logits: TrainLogits, completion_lens: Sequence[int]) -> Union[str, int, list[int]]:
    if logits == "completion":
        return list(completion_lens)
    if logits == "completion+1":
        return [t + 1 for t in completion_lens]
    return logits  # "all" or an int


def reward_model_flops(reward: RewardSystem, seq_lens: Sequence[int], *, head_positions: "str | Sequence[int]" = "last",
                       judge_completion_lens: Sequence[int] | None = None,
                       conventions: "Conventions | str | None" = None) -> dict[str, int]:
    """Reward-model inference FLOPs as ``reward/component`` keys.

    A scoring model (head rule last / markers / all): one forward over ``seq_lens`` (the
    RM's own tokenisation, padded where the RM runs padded) with the scoring head at
    ``head_positions`` ("last", "all" or one count per sequence: the step markers for a
    PRM). A judge (head rule decode): prefill of ``seq_lens`` and decode of
    ``judge_completion_lens`` with the judge's own shape. A rule: 0."""
    if not reward.is_model:
        return {}
    assert reward.shape is not None
    if reward.row.head == "decode":
        if judge_completion_lens is None:
            raise AccountingError("a judge reward needs judge_completion_lens (tokens the judge generates per sequence)")
        g = generate_components(reward.shape, seq_lens, judge_completion_lens, conventions=conventions)
        return {"reward/prefill": g["prefill"], "reward/decode": g["decode"]}
    logits = list(head_positions) if not isinstance(head_positions, str) else head_positions
    work = sequence_work(seq_lens, logits, conventions)
    c = forward_components(reward.shape, work, conventions=conventions)
    return {"reward/forward": c["dense"] + c["attention"] + c["embedding"], "reward/head": c["head"]}


def rollout_components(policy: PolicyCost, prompt_lens: Sequence[int], completion_lens: Sequence[int], *,
                       share_prompt: bool = False) -> dict[str, int]:
    """``rollout/prefill`` and ``rollout/decode`` FLOPs of ``policy`` (see ``generate_work``).
    With ``share_prompt`` give one prompt length per prompt, else one per sequence."""
    g = generate_components(policy.shape, prompt_lens, completion_lens, lora=policy.lora, share_prompt=share_prompt,
                            conventions=policy.conventions)
    return {"rollout/prefill": g["prefill"], "rollout/decode": g["decode"]}


def learning_flops(plan: "StepPlan", seq_lens: Sequence[int], completion_lens: Sequence[int],
                   prompt_groups: Sequence[int] | None) -> dict[str, int]:
    """FLOPs of the passes over whole sequences under ``plan``'s settings:
    ``old_logprobs/forward`` (if needed: ``needs_old_logprobs``, by default
    ``num_iterations > 1`` or ``optimizer_steps > 1``: ``StepPlan.old_logprobs``), ``reference/forward`` (if beta != 0; adapter off),
    ``update/forward`` and ``update/backward`` (x num_iterations) and
    ``recompute/forward`` (if recompute: hardware FLOPs).

    ``prompt_groups`` (None: unshared): the passes run each prompt once for its group
    (``shared_prompt_work``): consecutive sequences, ``prompt_groups[j]`` of them, share one
    prompt of length ``seq_len - completion_len`` (equal within a group). Needs
    ``train_logits="completion"`` and no recompute (gradient checkpointing runs the
    unshared HF forward). ``plan.num_generations`` is not read: the passes see rows."""
    conv, shape, lora, mu = plan.policy.conv, plan.shape, plan.lora, plan.num_iterations
    needs_old_logprobs = plan.old_logprobs
    if prompt_groups is None:
        work = sequence_work(seq_lens, _train_logits(plan.train_logits, completion_lens), conv)
    else:
        if plan.train_logits != "completion" or plan.recompute:
            raise AccountingError("prompt_groups (prefix-shared passes) needs train_logits='completion' and no "
                                  f"recompute, got train_logits={plan.train_logits!r}, recompute={plan.recompute}")
        work = _shared_work(seq_lens, completion_lens, prompt_groups, conv)
    fwd = sum(forward_components(shape, work, lora=lora, conventions=conv).values())
    comps: dict[str, int] = {}
    if needs_old_logprobs:
        comps["old_logprobs/forward"] = fwd
    if plan.beta != 0:
        comps["reference/forward"] = sum(forward_components(shape, work, lora=None, conventions=conv).values())
    bwd = sum(backward_components(shape, work, lora=lora, conventions=conv,
                                  inputs_require_grad=plan.inputs_require_grad).values())
    comps["update/forward"] = mu * fwd
    comps["update/backward"] = mu * bwd
    if plan.recompute:
        comps["recompute/forward"] = mu * recompute_flops(shape, work, lora=lora, conventions=conv,
                                                          early_stop=plan.recompute_early_stop)
    return comps


def prompt_groups(n: int, group: int, micro_batch: int) -> list[int]:
    """Sizes of the prompt segments a prefix-shared pass runs over ``n`` sequences in whole
    groups of ``group``, ``micro_batch`` sequences at a time (consecutive slices): a group
    split between micro-batches is one segment in each. The ``prompt_groups`` argument of
    ``learning_components`` for the built-in engine's passes."""
    for name, v in (("n", n), ("group", group), ("micro_batch", micro_batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise AccountingError(f"prompt_groups: {name}={v!r} must be an integer >= 1")
    out: list[int] = []
    for start in range(0, n, micro_batch):
        i, stop = start, min(n, start + micro_batch)
        while i < stop:
            j = min(stop, (i // group + 1) * group)
            out.append(j - i)
            i = j
    return out


def _shared_work(seq_lens: Sequence[int], completion_lens: Sequence[int], prompt_groups: Sequence[int],
                 conv: Conventions) -> Work:
    """``shared_prompt_work`` from per-sequence lengths and group sizes (see ``learning_components``)."""
    seqs, comps = list(seq_lens), list(completion_lens)
    if len(seqs) != len(comps):
        raise AccountingError(f"seq_lens has {len(seqs)} entries but completion_lens has {len(comps)}")
    sizes = list(prompt_groups)
    if sum(sizes) != len(seqs) or any(not isinstance(g, int) or g < 1 for g in sizes):
        raise AccountingError(f"prompt_groups {sizes} must be positive counts summing to {len(seqs)} sequences")
    plens, i = [], 0
    for g in sizes:
        ps = {s - t for s, t in zip(seqs[i:i + g], comps[i:i + g])}
        if len(ps) != 1:
            raise AccountingError(f"sequences {i}..{i + g - 1} share a prompt but have prompt lengths {sorted(ps)}")
        plens.append(ps.pop())
        i += g
    return shared_prompt_work(plens, comps, sizes, conventions=conv)


def phase_flops(components: dict[str, int]) -> PhaseFlops:
    """Fold ``phase/component`` keys into a ``PhaseFlops``."""
    def phase(p: str) -> int:
        return sum(v for k, v in components.items() if k.split("/", 1)[0] == p)

    return PhaseFlops(rollout=phase("rollout"), old_logprobs=phase("old_logprobs"), reference=phase("reference"),
                      reward=phase("reward"), update=phase("update"), recompute=phase("recompute"),
                      components=dict(components))


def update_rows(plan: "StepPlan", n: int, rows: Sequence[int] | None = None) -> list[int]:
    """The sequences (indices into a step's ``n``, prompts x ``num_generations`` in whole
    groups) its learning passes run over: ``rows`` where given (distinct, ascending,
    in range), else every sequence when the update trains on all of them, else the first
    ``update_generations`` of each group (which ones does not change the FLOPs when every
    sequence of a group has the same lengths: a uniform step, a bound)."""
    G, m = plan.num_generations, plan.update_group
    if rows is None:
        return list(range(n)) if m == G else [i for i in range(n) if i % G < m]
    out = list(rows)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in out) or out != sorted(set(out)) \
            or (out and not 0 <= out[0] <= out[-1] < n):
        raise AccountingError(f"update_rows must be distinct ascending indices into the step's {n} sequences")
    return out


def step_flops(plan: "StepPlan", prompt_lens: Sequence[int], completion_lens: Sequence[int],
               prompt_groups: Sequence[int] | None, *, update: Sequence[int] | None = None,
               reward_seq_lens: Sequence[int] | None = None,
               reward_head_positions: HeadPositions = None,
               judge_completion_lens: Sequence[int] | None = None) -> PhaseFlops:
    """Per-phase FLOPs of one GRPO step under ``plan`` from the actual per-sequence lengths:
    rollout (``rollout_components``), the passes over whole sequences
    (:func:`learning_flops` over the sequences the update trains on, :func:`update_rows`
    of ``update``; prompts shared by ``prompt_groups``, the segments of those sequences) and
    the reward model (``reward_model_flops``, every sequence).

    ``prompt_lens``/``completion_lens`` have one entry per sequence (prompts x G, groups
    contiguous); pass padded lengths where the engine runs padded tensors. Training passes
    (old/ref log-probs, update) run over prompt+completion with the head at
    ``plan.train_logits`` positions: "completion" (the T positions that predict completion
    tokens), "completion+1" (TRL's ``logits_to_keep = T + 1``), "all", or an int.
    ``reward_seq_lens`` default to prompt+completion; the RM head defaults to its kind's
    planned head (``RewardKind.planned_head``: the last position for an ORM, every position
    for a PRM) unless ``reward_head_positions`` says."""
    G = plan.num_generations
    if not isinstance(G, int) or G < 2:
        raise AccountingError(f"num_generations={G!r}: GRPO needs a group of at least 2; set it >= 2")
    plens, clens = list(prompt_lens), list(completion_lens)
    if len(plens) != len(clens):
        raise AccountingError(f"prompt_lens ({len(plens)}) and completion_lens ({len(clens)}) need one entry per sequence")
    if len(clens) % G:
        raise AccountingError(f"{len(clens)} sequences do not form groups of num_generations={G}")
    seqs = [p + t for p, t in zip(plens, clens)]
    comps = plan.rollout(plens[::G] if plan.share_prompt else plens, clens)
    rows = update_rows(plan, len(clens), update)
    comps.update(learning_flops(plan, [seqs[i] for i in rows], [clens[i] for i in rows], prompt_groups))
    if plan.reward.is_model:
        rlens = list(reward_seq_lens) if reward_seq_lens is not None else seqs
        head = reward_head_positions if reward_head_positions is not None else (plan.reward.row.planned_head or "all")
        comps.update(reward_model_flops(plan.reward, rlens, head_positions=head,
                                        judge_completion_lens=judge_completion_lens, conventions=plan.conventions))
    return phase_flops(comps)


def uniform_count(prompts: int, num_generations: int, prompt_len: int, completion_len: int) -> int:
    """Sequences of a uniform step (``prompts`` x G), refusing no prompt or empty lengths."""
    if prompts < 1:
        raise AccountingError(f"prompts={prompts}: need at least 1 prompt per step")
    if prompt_len < 1 or completion_len < 1:
        raise AccountingError(f"prompt_len={prompt_len}, completion_len={completion_len}: lengths must be >= 1")
    return prompts * num_generations


# -- a step's shapes and settings ----------------------------------------------------------------------
@dataclass(frozen=True)
class StepPlan:
    """What one GRPO step runs, minus its lengths: the settings every per-phase formula
    takes (:func:`step_flops`, :func:`learning_flops`), in one value.

    ``share_prompt``: the rollout prefills each prompt once for its group. ``micro_batch``:
    the learning passes share each prompt across its group, in micro-batches of this many
    sequences (``prompt_groups``); ``None`` runs them unshared. ``optimizer_steps``: the
    optimizer steps one pass over a generation takes (TRL's ``steps_per_generation /
    gradient_accumulation_steps``): the update's FLOPs are the same for any value (each
    sequence once per iteration), but above 1 the policy moves before the generation's last
    rows are trained on, so the old-policy pass runs. ``update_generations``: the rollouts
    per prompt the learning passes run over (PODS's m of ``num_generations``, the run's
    ``num_update_generations``; None: all), so rollout and reward are charged for
    ``num_generations`` per prompt and the learning passes for ``update_group``. The other
    fields are ``grpo_step_flops``'s arguments of the same names."""

    shape: ModelShape
    num_generations: int
    lora: LoRA | None = None
    num_iterations: int = 1
    beta: float = 0.0
    needs_old_logprobs: bool | None = None
    recompute: bool = False
    recompute_early_stop: bool = True
    inputs_require_grad: bool = False
    train_logits: TrainLogits = "completion"
    share_prompt: bool = False
    micro_batch: int | None = None
    reward: RewardSystem = RULE
    conventions: "Conventions | str | None" = None
    optimizer_steps: int = 1
    update_generations: int | None = None
    policy: PolicyCost = field(init=False, repr=False, compare=False)  # shape, lora, conventions: set once

    def __post_init__(self) -> None:
        """Validation, once: the policy (``PolicyCost``: the adapter fits the shape, the
        conventions resolve), the iterations, the KL coefficient and the optimizer steps."""
        if not isinstance(self.optimizer_steps, int) or self.optimizer_steps < 1:
            raise AccountingError(f"optimizer_steps={self.optimizer_steps!r}: optimizer steps per generation must "
                                  "be an integer >= 1")
        if self.num_iterations < 1:
            raise AccountingError(f"num_iterations={self.num_iterations}: must be >= 1")
        if self.beta < 0:
            raise AccountingError(f"beta={self.beta}: the KL coefficient must be >= 0")
        m = self.update_generations
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or not 2 <= m <= self.num_generations):
            raise AccountingError(f"update_generations={m!r}: the update trains on 2..num_generations="
                                  f"{self.num_generations} rollouts per prompt (None: all of them)")
        object.__setattr__(self, "policy", PolicyCost(self.shape, self.lora, self.conventions))

    @classmethod
    def of(cls, policy: PolicyCost, num_generations: int, **settings: Any) -> "StepPlan":
        """The plan of ``policy`` (its shape, adapter and conventions) with these settings."""
        return cls(policy.shape, num_generations, lora=policy.lora, conventions=policy.conventions, **settings)

    @property
    def old_logprobs(self) -> bool:
        """Whether the old-policy pass runs: ``needs_old_logprobs`` where given, else when
        the policy moves within a generation (``num_iterations > 1`` or ``optimizer_steps > 1``)."""
        return self.num_iterations > 1 or self.optimizer_steps > 1 if self.needs_old_logprobs is None \
            else self.needs_old_logprobs

    @property
    def update_group(self) -> int:
        """Rollouts per prompt the learning passes run over: ``update_generations``, else
        ``num_generations``."""
        return self.update_generations or self.num_generations

    def prompt_groups(self, n: int) -> list[int] | None:
        """The prompt segments of the learning passes over ``n`` sequences, in groups of
        :attr:`update_group` (None: unshared)."""
        return prompt_groups(n, self.update_group, self.micro_batch) if self.micro_batch else None

    def rollout(self, prompt_lens: Sequence[int], completion_lens: Sequence[int]) -> dict[str, int]:
        """``rollout/*`` FLOPs (one prompt length per prompt when ``share_prompt``, else per sequence)."""
        return rollout_components(self.policy, prompt_lens, completion_lens, share_prompt=self.share_prompt)

    def learning(self, seq_lens: Sequence[int], completion_lens: Sequence[int]) -> dict[str, int]:
        """:func:`learning_flops` of this plan, prompts shared per :meth:`prompt_groups`."""
        seqs = list(seq_lens)
        return learning_flops(self, seqs, completion_lens, self.prompt_groups(len(seqs)))

    def bound(self, prompts: int, prompt_len: int, completion_len: int) -> int:
        """Upper bound of a step's counted policy FLOPs (rollout and learning passes, the
        reward model's apart): ``prompts`` prompts at ``prompt_len`` tokens, every
        completion at ``completion_len``, no group dropped (``update_group`` sequences per
        prompt in the learning passes). Counted: model FLOPs, the recompute's hardware FLOPs
        excluded (``PhaseFlops.total``)."""
        n, u = prompts * self.num_generations, prompts * self.update_group
        comps = self.rollout([prompt_len] * (prompts if self.share_prompt else n), [completion_len] * n)
        comps.update(self.learning([prompt_len + completion_len] * u, [completion_len] * u))
        return phase_flops(comps).total

    def step(self, prompt_lens: Sequence[int], completion_lens: Sequence[int], *, update: Sequence[int] | None = None,
             **reward_lens: Any) -> PhaseFlops:
        """:func:`step_flops` of this plan: the learning passes over ``update`` (the rows the
        update trains on, whole groups of :attr:`update_group`; default :func:`update_rows`'s),
        ``reward_lens``: ``reward_seq_lens``, ``reward_head_positions``,
        ``judge_completion_lens``."""
        plens, clens = list(prompt_lens), list(completion_lens)
        rows = update_rows(self, len(clens), update)
        return step_flops(self, plens, clens, self.prompt_groups(len(rows)), update=rows, **reward_lens)

    def uniform(self, prompts: int, prompt_len: int, completion_len: int, **reward_lens: Any) -> PhaseFlops:
        """:meth:`step` with every prompt at ``prompt_len`` and every completion at
        ``completion_len`` (the step's upper bound when those are the maxima)."""
        n = uniform_count(prompts, self.num_generations, prompt_len, completion_len)
        return self.step([prompt_len] * n, [completion_len] * n, **reward_lens)


__all__ = ["PHASES", "SPLIT", "RewardSystem", "RULE", "PhaseFlops", "PolicyCost", "StepPlan", "step_flops",
           "rollout_components", "learning_flops", "phase_flops", "update_rows",
           "reward_model_flops", "Work", "generate_work"]
