"""FLOPs of whole passes: forward, training (forward + backward [+ recompute]), and
KV-cache generation.

Every pass reduces to a ``Work``: the tokens it processes, the attention query-key pairs
it computes (per the convention) and the positions where the output head runs. FLOPs are
linear in the three, so per-phase costs are exact sums and cheap to compute even for
512 sequences of 1,024 decode steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from . import terms
from .conventions import Conventions, resolve
from .errors import AccountingError
from .lora import LoRA
from .shapes import LAYER_MATRICES, ModelShape

Logits = Union[str, int, Sequence[int]]
ConvLike = Union[Conventions, str, None]


@dataclass(frozen=True)
class Work:
    """What a pass executes: tokens through the layers, attention pairs, head positions."""

    tokens: int = 0
    pairs: terms.Pairs = 0  # a Fraction only under the ``half`` attention convention
    logit_positions: int = 0

    def __add__(self, other: "Work") -> "Work":
        return Work(self.tokens + other.tokens, self.pairs + other.pairs, self.logit_positions + other.logit_positions)

    def scaled(self, k: int) -> "Work":
        return Work(self.tokens * k, self.pairs * k, self.logit_positions * k)


def _check_lens(name: str, lens: Sequence[int], minimum: int = 1) -> list[int]:
    if isinstance(lens, (str, bytes)) or not hasattr(lens, "__iter__"):
        raise AccountingError(f"{name} must be a list of integers, got {type(lens).__name__}")
    out = list(lens)
    for i, v in enumerate(out):
        if not isinstance(v, int) or isinstance(v, bool):
            raise AccountingError(f"{name}[{i}] must be an integer, got {v!r}")
        if v < minimum:
            raise AccountingError(f"{name}[{i}] = {v}: lengths must be >= {minimum}")
    if not out:
        raise AccountingError(f"{name} is empty: pass at least one sequence length")
    return out


def _logit_positions(seq_len: int, logits: Logits, i: int) -> int:
    if logits == "all":
        return seq_len
    if logits == "last":
        return 1
    if isinstance(logits, int) and not isinstance(logits, bool):
        if logits < 0:
            raise AccountingError(f"logits={logits}: a count of positions must be >= 0")
        return seq_len if logits == 0 else min(logits, seq_len)  # HF: logits_to_keep=0 keeps all
    if isinstance(logits, (list, tuple)):
        k = logits[i]
        if not isinstance(k, int) or k < 0 or k > seq_len:
            raise AccountingError(f"logits[{i}]={k!r} must be an integer in [0, {seq_len}]")
        return k
    raise AccountingError(f"logits must be 'all', 'last', an int (positions kept) or a list of ints, got {logits!r}")


def sequence_work(seq_lens: Sequence[int], logits: Logits = "all", conventions: ConvLike = None) -> Work:
    """Work of full sequences processed without a cache (training and log-prob passes)."""
    conv = resolve(conventions)
    lens = _check_lens("seq_lens", seq_lens)
    if isinstance(logits, (list, tuple)) and len(logits) != len(lens):
        raise AccountingError(f"logits has {len(logits)} entries for {len(lens)} sequences")
    tokens = sum(lens)
    pairs = sum(terms.attention_pairs(s, 0, conv.attention) for s in lens)
    if conv.logits == "all":
        pos = tokens
    else:
        pos = sum(_logit_positions(s, logits, i) for i, s in enumerate(lens))
    return Work(tokens, pairs, pos)


def generate_work(prompt_lens: Sequence[int], completion_lens: Sequence[int], *, share_prompt: bool = False,
                  conventions: ConvLike = None) -> tuple[Work, Work]:
    """(prefill, decode) work of KV-cache generation as HF ``generate`` executes it:
    prefill over the prompt with logits at its last position; the first completion token
    comes from those logits; each later token is a 1-token forward with its logits.

    ``share_prompt``: ``prompt_lens`` has one entry per prompt and ``completion_lens``
    G entries per prompt (grouped contiguously); each prompt is prefilled once. Otherwise
    both lists have one entry per sequence (pass padded lengths where the engine pads)."""
    conv = resolve(conventions)
    plens = _check_lens("prompt_lens", prompt_lens)
    clens = _check_lens("completion_lens", completion_lens)
    if share_prompt:
        if len(clens) % len(plens):
            raise AccountingError(
                f"share_prompt: {len(clens)} completions do not split evenly over {len(plens)} prompts"
            )
        g = len(clens) // len(plens)
        seq_prompts = [p for p in plens for _ in range(g)]
    else:
        if len(plens) != len(clens):
            raise AccountingError(f"prompt_lens has {len(plens)} entries but completion_lens has {len(clens)}; "
                                  "pass one prompt length per sequence, or share_prompt=True")
        seq_prompts = plens
    prefill = Work(
        tokens=sum(plens),
        pairs=sum(terms.attention_pairs(p, 0, conv.attention) for p in plens),
        logit_positions=sum(plens) if conv.logits == "all" else len(plens),
    )
    dec_tokens = sum(t - 1 for t in clens)
    dec_pairs = sum(terms.decode_pairs(p, t, conv.attention) for p, t in zip(seq_prompts, clens))
    return prefill, Work(dec_tokens, dec_pairs, dec_tokens)


def shared_prompt_work(prompt_lens: Sequence[int], completion_lens: Sequence[int], group_sizes: Sequence[int], *,
                       conventions: ConvLike = None) -> Work:
    """Work of a pass over (prompt, completion) sequences that runs each prompt once for the
    completions sharing it (a prefix-shared log-prob or training pass), with logits where
    they predict completion tokens:

    - segment s: its prompt of ``P_s`` tokens, no cache (``attention_pairs(P_s, 0)``), the
      head at its last position (the first completion token's logits, shared by its group);
    - completion i of segment s: its first ``T_i - 1`` tokens over the ``P_s`` prompt keys
      (``attention_pairs(T_i - 1, P_s)``), the head at each (tokens ``2 .. T_i``); the last
      token predicts nothing and is not run.

    ``prompt_lens``: one per segment; ``group_sizes``: completions per segment, in order
    (they sum to ``len(completion_lens)``). Under ``causal`` attention a group of ``G`` costs
    the unshared pass minus ``G - 1`` prompts and ``G`` last tokens; under ``full`` the
    completions' squares are ``(T-1)(T-1+P)``, what the engine's matmuls execute. Head
    positions follow ``sequence_work``: every token under ``logits="all"`` conventions."""
    conv = resolve(conventions)
    plens = _check_lens("prompt_lens", prompt_lens)
    clens = _check_lens("completion_lens", completion_lens)
    sizes = _check_lens("group_sizes", group_sizes)
    if len(sizes) != len(plens):
        raise AccountingError(f"group_sizes has {len(sizes)} entries for {len(plens)} prompts: one per prompt")
    if sum(sizes) != len(clens):
        raise AccountingError(f"group_sizes sum to {sum(sizes)} completions, but completion_lens has {len(clens)}")
    tokens = sum(plens) + sum(t - 1 for t in clens)
    pairs = sum(terms.attention_pairs(p, 0, conv.attention) for p in plens)
    i = 0
    for p, g in zip(plens, sizes):
        pairs += sum(terms.attention_pairs(t - 1, p, conv.attention) for t in clens[i:i + g])
        i += g
    pos = tokens if conv.logits == "all" else len(plens) + sum(t - 1 for t in clens)
    return Work(tokens, pairs, pos)


# -- forward ------------------------------------------------------------------------
def forward_components(shape: ModelShape, work: Work, *, lora: LoRA | None = None,
                       conventions: ConvLike = None) -> dict[str, int]:
    """Forward FLOPs of ``work`` split into dense / lora / attention / head / embedding."""
    conv = resolve(conventions)
    if lora is not None:
        lora.check(shape)
    L = shape.num_layers
    out = {"dense": 0, "lora": 0, "attention": 0, "head": 0, "embedding": 0}
    if conv.dense == "params":
        out["dense"] = terms.dense_params_flops(work.tokens, shape.num_params())
    else:
        per_layer = sum(terms.linear_flops(work.tokens, i, o) for i, o in shape.matrix_dims().values())
        out["dense"] = L * per_layer
        out["head"] = terms.head_flops(work.logit_positions, shape.head_matrices())
        if conv.embedding:
            out["embedding"] = terms.embedding_flops(work.tokens, shape.vocab, shape.hidden)
    if lora is not None:
        dims = shape.matrix_dims()
        out["lora"] = L * sum(terms.lora_forward_flops(work.tokens, *dims[t], lora.rank) for t in lora.targets)
    out["attention"] = L * terms.attention_flops(work.pairs, shape.num_heads, shape.head_dim)
    return out


def layers_forward_flops(shape: ModelShape, work: Work, *, lora: LoRA | None = None,
                         conventions: ConvLike = None) -> int:
    """Forward FLOPs inside the decoder layers only (what activation recompute repeats)."""
    c = forward_components(shape, work, lora=lora, conventions=conventions)
    return c["dense"] + c["lora"] + c["attention"]


def recompute_flops(shape: ModelShape, work: Work, *, lora: LoRA | None = None, conventions: ConvLike = None,
                    early_stop: bool = True) -> int:
    """Activation recompute (gradient checkpointing per decoder layer): the layers'
    forward again. With torch's non-reentrant checkpoint (``early_stop``, its default) the
    recompute stops once every tensor saved for backward is back, so each layer's last
    matmul, whose output nothing saves, is skipped: ``down_proj`` (2*t*I*h), or LoRA's B of
    ``down_proj`` (2*t*r*h) when down_proj is adapted. Reentrant checkpointing
    (``early_stop=False``) recomputes the whole layer."""
    full = layers_forward_flops(shape, work, lora=lora, conventions=conventions)
    if not early_stop or resolve(conventions).dense == "params":
        return full
    if lora is not None and "down_proj" in lora.targets:
        skipped = terms.linear_flops(work.tokens, lora.rank, shape.hidden)
    else:
        skipped = terms.linear_flops(work.tokens, shape.intermediate, shape.hidden)
    return full - shape.num_layers * skipped


# -- backward -----------------------------------------------------------------------
def _layer_backward(shape: ModelShape, work: Work, lora: LoRA | None, train_base: bool,
                    resid_grad: bool) -> tuple[dict[str, int], bool]:
    """Backward of one decoder layer; returns (components, residual needs grad after)."""
    dims = shape.matrix_dims()
    targets = set(lora.targets) if lora is not None else set()
    r = lora.rank if lora is not None else 0
    t = work.tokens
    dense = lora_f = 0
    req: dict[str, bool] = {}

    def linear(name: str, input_grad: bool) -> bool:
        nonlocal dense, lora_f
        i, o = dims[name]
        dense += terms.linear_backward_flops(t, i, o, weight_grad=train_base, input_grad=input_grad)
        if name in targets:
            lora_f += terms.lora_backward_flops(t, i, o, r, input_grad=input_grad)
        req[name] = input_grad or train_base or name in targets
        return req[name]

    a = resid_grad or train_base
    q, k, v = linear("q_proj", a), linear("k_proj", a), linear("v_proj", a)
    att = terms.attention_backward_flops(work.pairs, shape.num_heads, shape.head_dim, q_grad=q, k_grad=k, v_grad=v)
    o = linear("o_proj", q or k or v)
    resid = resid_grad or o
    m = resid or train_base
    g, u = linear("gate_proj", m), linear("up_proj", m)
    d = linear("down_proj", g or u)
    return {"dense": dense, "lora": lora_f, "attention": att}, resid or d


def backward_components(shape: ModelShape, work: Work, *, lora: LoRA | None = None, conventions: ConvLike = None,
                        inputs_require_grad: bool = False) -> dict[str, int]:
    """Backward FLOPs of ``work``. Full fine-tuning when ``lora`` is None (every weight
    trainable, the embedding too); with LoRA the base is frozen and gradients flow only
    where something upstream is trainable. ``inputs_require_grad`` models PEFT's
    ``enable_input_require_grads`` (used with gradient checkpointing), which makes the
    layer-0 q/k/v input gradients run."""
    conv = resolve(conventions)
    if conv.backward == "2x":
        return {k: 2 * v for k, v in forward_components(shape, work, lora=lora, conventions=conv).items()}
    if conv.dense == "params":
        raise AccountingError("dense='params' needs backward='2x' (the approximation has no per-matrix split)")
    train_base = lora is None
    # Layer 0 sees the embedding's requires-grad state; from layer 1 on the state is fixed.
    first, resid = _layer_backward(shape, work, lora, train_base, inputs_require_grad or train_base)
    L = shape.num_layers
    out = dict(first)
    if L > 1:
        rest, resid = _layer_backward(shape, work, lora, train_base, resid)
        out = {k: first[k] + (L - 1) * rest[k] for k in first}
    head_in = resid or train_base
    hw = sum(terms.linear_backward_flops(work.logit_positions, i, o, weight_grad=train_base, input_grad=head_in)
             for i, o in shape.head_matrices())
    out["head"] = hw
    out["embedding"] = (terms.embedding_flops(work.tokens, shape.vocab, shape.hidden)
                        if conv.embedding and train_base else 0)
    return out


# -- public pass functions ------------------------------------------------------------
def forward_flops(shape: ModelShape, seq_lens: Sequence[int], *, lora: LoRA | None = None, logits: Logits = "all",
                  conventions: ConvLike = None) -> int:
    """Forward FLOPs of full sequences (no cache). ``logits``: "all" positions, "last",
    an int k (the last k positions, HF's ``logits_to_keep``) or one count per sequence."""
    work = sequence_work(seq_lens, logits, conventions)
    return sum(forward_components(shape, work, lora=lora, conventions=conventions).values())


def train_flops(shape: ModelShape, seq_lens: Sequence[int], *, lora: LoRA | None = None, recompute: bool = False,
                logits: Logits = "all", conventions: ConvLike = None, inputs_require_grad: bool = False,
                recompute_early_stop: bool = True) -> int:
    """What one forward + backward over ``seq_lens`` executes. LoRA backward skips frozen
    weight gradients and the layer-0 q/k/v input gradients (unless ``inputs_require_grad``);
    full fine-tuning is 3x forward. ``recompute`` adds the decoder layers' forward again
    (gradient checkpointing: hardware FLOPs, which ``grpo_step_flops`` reports apart;
    see ``recompute_flops`` for ``recompute_early_stop``)."""
    work = sequence_work(seq_lens, logits, conventions)
    fwd = sum(forward_components(shape, work, lora=lora, conventions=conventions).values())
    bwd = sum(backward_components(shape, work, lora=lora, conventions=conventions,
                                  inputs_require_grad=inputs_require_grad).values())
    rec = recompute_flops(shape, work, lora=lora, conventions=conventions,
                          early_stop=recompute_early_stop) if recompute else 0
    return fwd + bwd + rec


def generate_components(shape: ModelShape, prompt_lens: Sequence[int], completion_lens: Sequence[int], *,
                        lora: LoRA | None = None, share_prompt: bool = False,
                        conventions: ConvLike = None) -> dict[str, int]:
    """{"prefill": ..., "decode": ...} FLOPs of KV-cache generation (see ``generate_work``)."""
    prefill, decode = generate_work(prompt_lens, completion_lens, share_prompt=share_prompt, conventions=conventions)
    return {
        "prefill": sum(forward_components(shape, prefill, lora=lora, conventions=conventions).values()),
        "decode": sum(forward_components(shape, decode, lora=lora, conventions=conventions).values()),
    }


def generate_flops(shape: ModelShape, prompt_lens: Sequence[int], completion_lens: Sequence[int], *,
                   lora: LoRA | None = None, share_prompt: bool = False, conventions: ConvLike = None) -> int:
    """Prefill + KV-cache decode FLOPs, with the head at the last prompt position and at
    each decode step, as HF ``generate`` executes (completion lengths count generated
    tokens, EOS included; pass padded lengths where the engine runs padded tensors)."""
    return sum(generate_components(shape, prompt_lens, completion_lens, lora=lora, share_prompt=share_prompt,
                                   conventions=conventions).values())


__all__ = [
    "Work", "sequence_work", "shared_prompt_work", "generate_work", "forward_components", "backward_components", "layers_forward_flops",
    "recompute_flops", "forward_flops", "train_flops", "generate_components", "generate_flops", "LAYER_MATRICES",
]
