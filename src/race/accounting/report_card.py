"""The compute report card's data: total FLOPs and how they split among search (rollout),
learning (update + log-prob passes) and feedback (reward), beside the model size, LoRA
rank, group size, steps, tokens and the conventions used; and the ledger's values for a
training log. JSON here; the Markdown and LaTeX renderings and the card's files are
``race.cards``'s (the accounting renders nothing).

Training the reward models a study uses (``rm_training_flops``, per RM) is a separate,
labelled line: NOT counted in the total or the budget unless ``count_rm_training`` (then
the counted total is the runs' FLOPs plus the RM training, and every share is of that)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .conventions import Conventions, resolve
from .phases import SPLIT
from .ledger import FlopLedger


def log_values(ledger: FlopLedger, prefix: str = "race/") -> dict[str, float]:
    """The ledger so far as flat scalars for a training log (TRL's ``logs``, W&B,
    TensorBoard): ``flops`` (counted total), ``flops/<phase>`` per phase (``recompute``
    and ``eval`` too: recorded, not counted), ``budget_fraction`` (counted / budget, when
    there is a budget) and ``split/<axis>``, the share of the counted total spent on
    search, learning and feedback."""
    counted = ledger.totals_by_phase(counted_only=True)
    phases = ledger.totals_by_phase()
    total = ledger.total
    out: dict[str, float] = {f"{prefix}flops": total}
    out.update({f"{prefix}flops/{ph}": v for ph, v in sorted(phases.items())})
    if ledger.budget:
        out[f"{prefix}budget_fraction"] = total / ledger.budget
    for axis, ps in SPLIT.items():
        out[f"{prefix}split/{axis}"] = sum(counted.get(p, 0) for p in ps) / total if total else 0.0
    return out


@dataclass
class ReportCard:
    """Compute report card of a run (or a study: sum the phase totals)."""

    total_flops: int
    phase_flops: dict[str, int]
    model: str = ""
    model_params: int = 0
    lora_rank: int | None = None
    num_generations: int = 0
    steps: int = 0
    tokens: int = 0
    budget_flops: float | None = None
    hardware_flops: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    conventions: dict[str, Any] = field(default_factory=dict)
    conventions_text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: FLOPs that trained each reward model the runs read (name -> FLOPs): a separate line,
    #: never part of ``total_flops`` (the runs' ledgers); counted only with ``count_rm_training``.
    rm_training_flops: dict[str, int] = field(default_factory=dict)
    count_rm_training: bool = False
    #: ``run`` (one run's card) or ``study`` (a sum over a study's runs: model, steps and
    #: LoRA rank only where they are known; group size and tokens left out).
    scope: str = "run"

    @property
    def split(self) -> dict[str, int]:
        """FLOPs per axis: search, learning, feedback (model FLOPs, counted)."""
        return {k: sum(self.phase_flops.get(p, 0) for p in ps) for k, ps in SPLIT.items()}

    @property
    def rm_training_total(self) -> int:
        """FLOPs that trained the reward models (whether counted or not)."""
        return sum(self.rm_training_flops.values())

    @property
    def counted_flops(self) -> int:
        """What the card counts: ``total_flops`` (the runs), plus the RM training when
        ``count_rm_training``."""
        return self.total_flops + (self.rm_training_total if self.count_rm_training else 0)

    @property
    def shares(self) -> dict[str, float]:
        """Each axis's share of :attr:`counted_flops` (with RM training counted, also
        ``rm_training``; the shares then still sum to 1)."""
        tot = self.counted_flops or 1
        out = {k: v / tot for k, v in self.split.items()}
        if self.count_rm_training and self.rm_training_flops:
            out["rm_training"] = self.rm_training_total / tot
        return out

    @classmethod
    def from_ledger(cls, ledger: FlopLedger, *, conventions: "Conventions | str | None" = None,
                    **meta: Any) -> "ReportCard":
        conv = resolve(conventions)
        counted: dict[str, int] = {}
        hardware: dict[str, int] = {}
        for r in ledger:
            (counted if r.counted else hardware)[r.phase] = (counted if r.counted else hardware).get(r.phase, 0) + r.flops
        tokens = sum(r.tokens for r in ledger if r.phase == "rollout")
        meta.setdefault("steps", ledger.steps())
        meta.setdefault("tokens", tokens)
        return cls(total_flops=ledger.total, phase_flops=counted, budget_flops=ledger.budget, hardware_flops=hardware,
                   seconds={k: round(v, 3) for k, v in ledger.seconds_by_phase().items()},
                   conventions=conv.to_dict(), conventions_text=conv.describe(), **meta)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["split"] = self.split
        d["shares"] = {k: round(v, 6) for k, v in self.shares.items()}
        d["rm_training_total"] = self.rm_training_total
        d["counted_flops"] = self.counted_flops
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)
