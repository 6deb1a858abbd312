"""FLOP-counting conventions: what counts as a FLOP, stated once and printed with every number.

The default ``race`` convention: a matmul of (m x k)(k x n) costs 2mnk; elementwise ops,
norms and softmax cost 0; the embedding lookup is a gather (0); causal attention counts
the query-key pairs the mask keeps (a block of n new tokens over c cached ones has
``n*c + n(n+1)/2`` pairs, QK^T and AV 2*head_dim FLOPs per pair and head each); the
output head is charged where logits are computed; backward is exact per matrix
(trainable weight 2x forward, frozen weight on the gradient path 1x, off the path 0);
activation recompute is hardware FLOPs, reported apart from model FLOPs.

Presets reproduce other published conventions so users can compare:

- ``torch``: exactly what ``torch.utils.flop_counter.FlopCounterMode`` counts (the
  causal mask is ignored: full-square attention).
- ``verl``: verl's ``FlopsCounter`` as of its January 2026 attention fix (PR #4959):
  6 x (matrices + embedding + lm_head) per token + 6 x sum(seq^2) x layers x heads x
  head_dim per training pass; attention is half the square (seq^2/2 pairs), logits at
  every position.
- ``verl-legacy``: verl's ``FlopsCounter`` before that fix: the same with
  12 x sum(seq^2) x layers x heads x head_dim (the full square).
- ``megatron``: Megatron-LM's ``num_floating_point_operations``: as ``verl-legacy``
  without the embedding term.
- ``palm``: PaLM's appendix B: 6N + 12 L H Q T per token, N all parameters.
- ``6nd``: 6 x parameters x tokens (2ND forward), no attention term.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from .errors import AccountingError

Attention = Literal["causal", "half", "full", "none"]
ATTENTION = ("causal", "half", "full", "none")


@dataclass(frozen=True)
class Conventions:
    """How FLOPs are counted. Every field is a setting; ``describe()`` prints them."""

    name: str = "race"
    #: "causal": pairs the causal mask keeps; "half": half the square (n^2/2, verl);
    #: "full": the whole square; "none": not counted.
    attention: Attention = "causal"
    #: charge 2*vocab*hidden per token for the embedding lookup (verl and Chinchilla do).
    embedding: bool = False
    #: "computed": head FLOPs where logits are computed; "all": at every position.
    logits: Literal["computed", "all"] = "computed"
    #: "matmul": sum over weight matrices; "params": 2 x num_params() per token.
    dense: Literal["matmul", "params"] = "matmul"
    #: "exact": per-matrix backward (LoRA skips frozen weight gradients); "2x": backward
    #: = 2 x forward for everything, as the published 6ND-style formulas assume.
    backward: Literal["exact", "2x"] = "exact"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION:
            raise AccountingError(
                f"Conventions.attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.logits not in ("computed", "all"):
            raise AccountingError(f"Conventions.logits must be computed or all, got {self.logits!r}")
        if self.dense not in ("matmul", "params"):
            raise AccountingError(f"Conventions.dense must be matmul or params, got {self.dense!r}")
        if self.backward not in ("exact", "2x"):
            raise AccountingError(f"Conventions.backward must be exact or 2x, got {self.backward!r}")

    @classmethod
    def preset(cls, name: str) -> "Conventions":
        key = name.strip().lower()
        if key not in PRESETS:
            raise AccountingError(f"unknown conventions {name!r}; choose one of: {', '.join(PRESETS)}")
        return PRESETS[key]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        """One line stating the convention, to print beside every number."""
        att = {"causal": "causal attention (n*c + n(n+1)/2 pairs)",
               "half": "half-square attention (n*c + n^2/2 pairs)", "full": "full-square attention",
               "none": "attention not counted"}[self.attention]
        parts = [
            f"conventions={self.name}",
            "matmul=2mnk" if self.dense == "matmul" else "dense=2*params per token",
            att,
            "embedding=2Vh/token" if self.embedding else "embedding=0 (gather)",
            "head where computed" if self.logits == "computed" else "head at every position",
            "backward exact per matrix" if self.backward == "exact" else "backward=2x forward",
            "recompute reported as hardware FLOPs",
        ]
        return "; ".join(parts)


PRESETS: dict[str, Conventions] = {
    "race": Conventions(),
    "torch": Conventions(name="torch", attention="full"),
    "verl": Conventions(name="verl", attention="half", embedding=True, logits="all", backward="2x"),
    "verl-legacy": Conventions(name="verl-legacy", attention="full", embedding=True, logits="all", backward="2x"),
    "megatron": Conventions(name="megatron", attention="full", logits="all", backward="2x"),
    "palm": Conventions(name="palm", attention="full", logits="all", dense="params", backward="2x"),
    "6nd": Conventions(name="6nd", attention="none", logits="all", dense="params", backward="2x"),
}


def resolve(conventions: "Conventions | str | None") -> Conventions:
    """Accept a preset name, a Conventions object, or None (the ``race`` default)."""
    if conventions is None:
        return PRESETS["race"]
    if isinstance(conventions, str):
        return Conventions.preset(conventions)
    if isinstance(conventions, Conventions):
        return conventions
    raise AccountingError(f"conventions must be a preset name or Conventions, got {type(conventions).__name__}")
