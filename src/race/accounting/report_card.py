"""The compute report card: total FLOPs and how they split among search (rollout),
learning (update + log-prob passes) and feedback (reward), beside the model size, LoRA
rank, group size, steps, tokens and the conventions used. JSON, Markdown and LaTeX."""

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

    @property
    def split(self) -> dict[str, int]:
        """FLOPs per axis: search, learning, feedback (model FLOPs, counted)."""
        return {k: sum(self.phase_flops.get(p, 0) for p in ps) for k, ps in SPLIT.items()}

    @property
    def shares(self) -> dict[str, float]:
        tot = self.total_flops or 1
        return {k: v / tot for k, v in self.split.items()}

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
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def _rows(self, conventions: bool = True) -> list[tuple[str, str]]:
        rows = [("Total FLOPs (model, counted)", fmt_flops(self.total_flops))]
        if self.budget_flops:
            rows.append(("Budget", f"{fmt_flops(self.budget_flops)} ({self.total_flops / self.budget_flops:.1%} used)"))
        for k, v in self.split.items():
            rows.append((f"  {k}", f"{fmt_flops(v)} ({self.shares[k]:.1%})"))
        for k, v in sorted(self.hardware_flops.items()):
            rows.append((f"Not counted: {k}", fmt_flops(v)))
        rows += [("Model", f"{self.model} ({self.model_params:,} parameters)"),
                 ("LoRA rank", str(self.lora_rank) if self.lora_rank else "full fine-tuning"),
                 ("Group size", str(self.num_generations)), ("Steps", str(self.steps)),
                 ("Rollout tokens", f"{self.tokens:,}")]
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
