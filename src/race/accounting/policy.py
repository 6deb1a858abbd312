"""The policy's side of every FLOP rule: its shape, its LoRA adapter and the FLOP
conventions, in one value validated once (standard library only).

Every rule above the per-pass formulas (``race.accounting.passes``, which take the three
apart because they are the formulas) takes a :class:`PolicyCost`: the built-in engine's
:class:`race.accounting.grpo.StepPlan` holds one (``StepPlan.policy``), the TRL formulas
(``race.accounting.trl_step``, ``trl_compare``), the executed-rollout rule and the
evaluator take one.
"""

from __future__ import annotations

from dataclasses import dataclass

from .conventions import Conventions, resolve
from .lora import LoRA
from .shapes import ModelShape


@dataclass(frozen=True)
class PolicyCost:
    """A policy as the FLOP rules see it. Construction validates: the adapter's rank fits
    every targeted matrix of ``shape`` (``LoRA.check``) and ``conventions`` (a preset name,
    a :class:`Conventions` or None for ``race``) resolves; the field then holds the
    resolved :class:`Conventions`."""

    shape: ModelShape
    lora: LoRA | None = None
    conventions: Conventions | str | None = None

    def __post_init__(self) -> None:
        if self.lora is not None:
            self.lora.check(self.shape)
        object.__setattr__(self, "conventions", resolve(self.conventions))

    @property
    def conv(self) -> Conventions:
        """The resolved conventions (typed)."""
        assert isinstance(self.conventions, Conventions)
        return self.conventions

    def without_adapter(self) -> "PolicyCost":
        """The same model with the adapter off (the reference pass under LoRA)."""
        return PolicyCost(self.shape, None, self.conventions)


__all__ = ["PolicyCost"]
