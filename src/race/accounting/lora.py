"""LoRA adapter description for the formulas (rank and adapted matrices)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import AccountingError
from .shapes import LAYER_MATRICES, ModelShape


@dataclass(frozen=True)
class LoRA:
    """A LoRA adapter of ``rank`` on ``targets`` (PEFT module names) in every layer."""

    rank: int
    targets: tuple[str, ...] = LAYER_MATRICES

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise AccountingError(f"LoRA rank must be a positive integer, got {self.rank!r} (use lora=None for full fine-tuning)")
        targets = tuple(self.targets)
        object.__setattr__(self, "targets", targets)
        if not targets:
            raise AccountingError(f"LoRA targets is empty; choose from {', '.join(LAYER_MATRICES)}")
        bad = [t for t in targets if t not in LAYER_MATRICES]
        if bad:
            raise AccountingError(f"unknown LoRA target(s) {bad}; choose from {', '.join(LAYER_MATRICES)}")

    def check(self, shape: ModelShape) -> None:
        """Refuse a rank above a targeted matrix's smaller dimension."""
        dims = shape.matrix_dims()
        for t in self.targets:
            i, o = dims[t]
            if self.rank > min(i, o):
                raise AccountingError(
                    f"LoRA rank {self.rank} exceeds {t}'s smaller dimension {min(i, o)} in {shape.name} "
                    f"({i}x{o}); use rank <= {min(i, o)}"
                )

    def num_params(self, shape: ModelShape) -> int:
        """Trainable parameters: r * (in + out) per adapted matrix per layer."""
        dims = shape.matrix_dims()
        return shape.num_layers * sum(self.rank * (dims[t][0] + dims[t][1]) for t in self.targets)


def lora_merge_flops(shape: ModelShape, lora: LoRA) -> int:
    """FLOPs of folding a LoRA adapter into the weights once (a merged rollout): ``2 r in
    out`` (the ``B A`` matmul) per adapted matrix per layer; the scale and the add are
    elementwise (0)."""
    dims = shape.matrix_dims()
    return shape.num_layers * sum(2 * lora.rank * dims[t][0] * dims[t][1] for t in lora.targets)
