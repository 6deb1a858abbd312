"""One pure function per FLOP term. Each docstring states the formula and its convention.

Conventions shared by every term: a matmul of (m x k)(k x n) costs 2mnk FLOPs; bias
adds, norms, activations, softmax and other elementwise work cost 0.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterable, Union

from .errors import AccountingError

#: Query-key pair counts are integers except under the ``half`` convention, where an odd
#: block length gives a half pair (n^2/2); every FLOP count built from them is an integer.
Pairs = Union[int, Fraction]


def _whole(x: Pairs) -> int:
    """An exact integer from an int or a Fraction whose denominator is 1."""
    if isinstance(x, Fraction):
        if x.denominator != 1:
            raise AccountingError(f"internal: FLOP count {x} is not a whole number")
        return int(x)
    return x


def linear_flops(tokens: int, d_in: int, d_out: int) -> int:
    """A dense layer over ``tokens`` rows: 2 * tokens * d_in * d_out (bias add free)."""
    return 2 * tokens * d_in * d_out


def lora_forward_flops(tokens: int, d_in: int, d_out: int, rank: int) -> int:
    """LoRA's two thin matmuls x @ A^T (d_in -> r) and @ B^T (r -> d_out):
    2 * tokens * r * (d_in + d_out). Dropout and the alpha/r scale are elementwise (0)."""
    return 2 * tokens * rank * (d_in + d_out)


def linear_backward_flops(tokens: int, d_in: int, d_out: int, *, weight_grad: bool, input_grad: bool) -> int:
    """Backward of a dense layer: weight gradient dW = dY^T X (2*t*d_in*d_out) when the
    weight is trainable, input gradient dX = dY W (same cost) when the input needs one.
    So trainable weight on the gradient path: 2x forward; frozen on the path: 1x; off: 0."""
    return linear_flops(tokens, d_in, d_out) * (int(weight_grad) + int(input_grad))


def lora_backward_flops(tokens: int, d_in: int, d_out: int, rank: int, *, input_grad: bool) -> int:
    """Backward of a LoRA pair (A: d_in -> r, B: r -> d_out), both trainable:
    dB = 2*t*r*d_out, dA = 2*t*d_in*r, grad into A's output = 2*t*d_out*r, and the grad
    into x = 2*t*r*d_in only when x needs a gradient (not for layer-0 q/k/v under LoRA,
    whose input is the frozen embedding)."""
    weights = 2 * tokens * rank * (d_in + d_out)
    mid = 2 * tokens * rank * d_out
    x = 2 * tokens * rank * d_in if input_grad else 0
    return weights + mid + x


def attention_pairs(n_new: int, n_cached: int, attention: str) -> Pairs:
    """Query-key pairs of a block of ``n_new`` tokens over ``n_cached`` cached tokens.

    causal: n_new*n_cached + n_new*(n_new+1)/2 (what the causal mask keeps);
    half: n_new*n_cached + n_new^2/2 (half the square, verl's causal approximation since
    its January 2026 fix: the triangle without the diagonal's extra n/2; a Fraction when
    n_new is odd);
    full: n_new*(n_new+n_cached) (the square torch's counter sees); none: 0.

    causal and half are additive: a sequence split into blocks has the pairs of the whole."""
    if attention == "none":
        return 0
    if attention == "full":
        return n_new * (n_new + n_cached)
    if attention == "causal":
        return n_new * n_cached + n_new * (n_new + 1) // 2
    if attention == "half":
        sq = n_new * n_new
        return n_new * n_cached + (sq // 2 if sq % 2 == 0 else Fraction(sq, 2))
    raise AccountingError(f"attention convention must be causal, half, full or none, got {attention!r}")


def decode_pairs(prompt_len: int, completion_len: int, attention: str = "causal") -> Pairs:
    """Query-key pairs of KV-cache decoding: the first completion token comes from the
    prefill logits; each later token j = 1..T-1 is one forward of 1 token over P+j-1
    cached ones, i.e. P+j pairs (causal and full agree for one new token):
    sum_{j=1}^{T-1} (P + j) = (T-1)*P + (T-1)*T/2.
    Under ``half`` a one-token block has P+j-1/2 pairs: (T-1)/2 fewer in all; under
    ``none``, 0."""
    if attention == "none":
        return 0
    t = completion_len - 1
    pairs = t * prompt_len + t * (t + 1) // 2
    if attention == "half":
        return pairs - (t // 2 if t % 2 == 0 else Fraction(t, 2))
    return pairs


def attention_flops(pairs: Pairs, num_heads: int, head_dim: int) -> int:
    """QK^T and softmax(.)V: 2*head_dim FLOPs per pair and head each: 4 * pairs * H * d.
    Grouped-query attention does not cut this (every query head does its own dot products)."""
    return _whole(4 * pairs * num_heads * head_dim)


def attention_backward_flops(pairs: Pairs, num_heads: int, head_dim: int, *, q_grad: bool, k_grad: bool,
                             v_grad: bool) -> int:
    """Backward of the attention core, 2*pairs*H*d per product: dQ (if q needs grad), dK
    (if k does), dP = dO V^T (if q or k does), dV (if v does). All four: 2x forward."""
    unit = _whole(2 * pairs * num_heads * head_dim)
    return unit * (int(q_grad) + int(k_grad) + int(q_grad or k_grad) + int(v_grad))


def head_flops(positions: int, matrices: Iterable[tuple[int, int]]) -> int:
    """Output head at ``positions`` rows: 2 * positions * sum(in*out) over its matrices
    (lm_head: 2 * positions * hidden * vocab)."""
    return sum(linear_flops(positions, i, o) for i, o in matrices)


def embedding_flops(tokens: int, vocab: int, hidden: int) -> int:
    """Embedding as a one-hot matmul (verl/Chinchilla convention): 2 * tokens * vocab * hidden.
    RACE's default charges 0: the lookup is a gather."""
    return 2 * tokens * vocab * hidden


def dense_params_flops(tokens: int, num_params: int) -> int:
    """The 2N-per-token approximation (6ND for training): 2 * tokens * params."""
    return 2 * tokens * num_params
