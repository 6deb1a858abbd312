"""The compute report card: total FLOPs and how they split among search (rollout),
learning (update + log-prob passes) and feedback (reward), beside the model size, LoRA
rank, group size, steps, tokens and the conventions used. JSON, Markdown and LaTeX.

Training the reward models a study uses (``rm_training_flops``, per RM) is a separate,
labelled line: NOT counted in the total or the budget unless ``count_rm_training`` (then
the counted total is the runs' FLOPs plus the RM training, and every share is of that)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .conventions import Conventions, resolve
from .grpo import SPLIT
from .ledger import FlopLedger

_LATEX_ESCAPES = {"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$", "{": r"\{", "}": r"\}",
                  "^": r"\^{}", "~": r"\~{}", "\\": r"\textbackslash{}", "|": r"\textbar{}",
                  "<": r"\textless{}", ">": r"\textgreater{}"}


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


def latex_escape(text: str) -> str:
    """Text safe inside a LaTeX table cell: the ten special characters escaped, and ``|``,
    ``<``, ``>`` spelled as text commands (in the default OT1 encoding they print as other
    glyphs)."""
    return "".join(_LATEX_ESCAPES.get(c, c) for c in str(text))


def fmt_flops(x: float) -> str:
    """Engineering format: 1.23e15 -> '1.23 PFLOP'."""
    for unit, scale in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} FLOP"


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

    def _rows(self, conventions: bool = True) -> list[tuple[str, str]]:
        counted = self.count_rm_training and bool(self.rm_training_flops)
        total = fmt_flops(self.counted_flops)
        if counted:
            total += f" (runs {fmt_flops(self.total_flops)} + RM training {fmt_flops(self.rm_training_total)})"
        rows = [("Total FLOPs (model, counted)", total)]
        if self.budget_flops:
            used = self.counted_flops / self.budget_flops
            rows.append(("Budget", f"{fmt_flops(self.budget_flops)} ({used:.1%} used)"))
        shares = self.shares
        for k, v in self.split.items():
            rows.append((f"  {k}", f"{fmt_flops(v)} ({shares[k]:.1%})"))
        if self.rm_training_flops:
            each = ", ".join(f"{n} {fmt_flops(v)}" for n, v in sorted(self.rm_training_flops.items()))
            if counted:
                rows.append(("  RM training (counted)", f"{fmt_flops(self.rm_training_total)} "
                             f"({shares['rm_training']:.1%}; {each}; counted as asked: count_rm_training)"))
            else:
                rows.append(("RM training (not counted)", f"{fmt_flops(self.rm_training_total)} ({each}; "
                             "separate: not in the total, the split or the budget)"))
        for k, v in sorted(self.hardware_flops.items()):
            rows.append((f"Not counted: {k}", fmt_flops(v)))
        if self.scope == "run":  # a study's card shows only what holds for the whole study
            rows += [("Model", f"{self.model} ({self.model_params:,} parameters)"),
                     ("LoRA rank", str(self.lora_rank) if self.lora_rank else "full fine-tuning"),
                     ("Group size", str(self.num_generations)), ("Steps", str(self.steps)),
                     ("Rollout tokens", f"{self.tokens:,}")]
        else:
            rows += [(k, v) for k, v, known in (("Models", self.model, self.model),
                                                ("LoRA rank", str(self.lora_rank), self.lora_rank),
                                                ("Steps", f"{self.steps:,}", self.steps)) if known]
        if self.seconds:
            rows.append(("Wall seconds by phase", ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.seconds.items()))))
        if conventions:
            rows.append(("Conventions", self.conventions_text))
        return rows

    def to_markdown(self) -> str:
        lines = ["# Compute report card", "", "| item | value |", "|---|---|"]
        lines += [f"| {k.strip()} | {v} |" for k, v in self._rows()]
        return "\n".join(lines) + "\n"

    def to_latex(self) -> str:
        r"""A ``tabular`` to ``\input`` in a table environment (no package needed). Long
        values wrap in a ``p`` column; the conventions, a long line, are a note under the
        table, marked from the total with a dagger."""
        lines = []
        for i, (k, v) in enumerate(self._rows(conventions=False)):
            mark = r"$^\dagger$" if i == 0 else ""
            lines.append(f"{latex_escape(k.strip())}{mark} & {latex_escape(v)} \\\\")
        note = latex_escape(self.conventions_text or "not recorded")
        return ("% RACE compute report card: \\input it inside a table environment (no package needed).\n"
                "\\begin{tabular}{@{}lp{0.55\\linewidth}@{}}\n\\hline\nItem & Value \\\\\n\\hline\n"
                + "\n".join(lines)
                + "\n\\hline\n\\multicolumn{2}{@{}p{\\linewidth}@{}}{\\footnotesize $^\\dagger$Conventions: "
                + note + "} \\\\\n\\end{tabular}\n")

    def write(self, directory: "str | Any") -> None:
        from pathlib import Path

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "report_card.json").write_text(self.to_json())
        (d / "report_card.md").write_text(self.to_markdown())
        (d / "report_card.tex").write_text(self.to_latex())
