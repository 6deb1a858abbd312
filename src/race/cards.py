"""Rendering the compute report card: Markdown, LaTeX and the three files a run directory
holds (``report_card.{json,md,tex}``). Standard library only.

The card's data (``race.accounting.ReportCard``: totals, the search / learning / feedback
split, model, LoRA rank, steps, tokens, conventions) is the accounting's; this module only
writes it out, for the engines (a run's card), ``race card`` (a rebuilt card) and the
report (the study's card, FLOP numbers, LaTeX cells).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from race.accounting import ReportCard

_LATEX_ESCAPES = {"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$", "{": r"\{", "}": r"\}",
                  "^": r"\^{}", "~": r"\~{}", "\\": r"\textbackslash{}", "|": r"\textbar{}",
                  "<": r"\textless{}", ">": r"\textgreater{}"}


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


def card_rows(card: ReportCard, conventions: bool = True) -> list[tuple[str, str]]:
    """The card's (item, value) rows, as both renderings show them. RM training is its own
    line, outside the total unless the card counts it (``count_rm_training``); a study's
    card (``scope="study"``) shows only what holds for the whole study."""
    counted = card.count_rm_training and bool(card.rm_training_flops)
    total = fmt_flops(card.counted_flops)
    if counted:
        total += f" (runs {fmt_flops(card.total_flops)} + RM training {fmt_flops(card.rm_training_total)})"
    rows = [("Total FLOPs (model, counted)", total)]
    if card.budget_flops:
        rows.append(("Budget", f"{fmt_flops(card.budget_flops)} ({card.counted_flops / card.budget_flops:.1%} used)"))
    shares = card.shares
    for k, v in card.split.items():
        rows.append((f"  {k}", f"{fmt_flops(v)} ({shares[k]:.1%})"))
    if card.rm_training_flops:
        each = ", ".join(f"{n} {fmt_flops(v)}" for n, v in sorted(card.rm_training_flops.items()))
        if counted:
            rows.append(("  RM training (counted)", f"{fmt_flops(card.rm_training_total)} "
                         f"({shares['rm_training']:.1%}; {each}; counted as asked: count_rm_training)"))
        else:
            rows.append(("RM training (not counted)", f"{fmt_flops(card.rm_training_total)} ({each}; "
                         "separate: not in the total, the split or the budget)"))
    for k, v in sorted(card.hardware_flops.items()):
        rows.append((f"Not counted: {k}", fmt_flops(v)))
    if card.scope == "run":
        rows += [("Model", f"{card.model} ({card.model_params:,} parameters)"),
                 ("LoRA rank", str(card.lora_rank) if card.lora_rank else "full fine-tuning"),
                 ("Group size", str(card.num_generations)), ("Steps", str(card.steps)),
                 ("Rollout tokens", f"{card.tokens:,}")]
    else:
        rows += [(k, v) for k, v, known in (("Models", card.model, card.model),
                                            ("LoRA rank", str(card.lora_rank), card.lora_rank),
                                            ("Steps", f"{card.steps:,}", card.steps)) if known]
    if card.seconds:
        rows.append(("Wall seconds by phase", ", ".join(f"{k} {v:.1f}" for k, v in sorted(card.seconds.items()))))
    if conventions:
        rows.append(("Conventions", card.conventions_text))
    return rows


def card_markdown(card: ReportCard) -> str:
    """The card as a Markdown table under a ``# Compute report card`` title."""
    lines = ["# Compute report card", "", "| item | value |", "|---|---|"]
    lines += [f"| {k.strip()} | {v} |" for k, v in card_rows(card)]
    return "\n".join(lines) + "\n"


def card_latex(card: ReportCard) -> str:
    r"""A ``tabular`` to ``\input`` in a table environment (no package needed). Long
    values wrap in a ``p`` column; the conventions, a long line, are a note under the
    table, marked from the total with a dagger."""
    lines = []
    for i, (k, v) in enumerate(card_rows(card, conventions=False)):
        mark = r"$^\dagger$" if i == 0 else ""
        lines.append(f"{latex_escape(k.strip())}{mark} & {latex_escape(v)} \\\\")
    note = latex_escape(card.conventions_text or "not recorded")
    return ("% RACE compute report card: \\input it inside a table environment (no package needed).\n"
            "\\begin{tabular}{@{}lp{0.55\\linewidth}@{}}\n\\hline\nItem & Value \\\\\n\\hline\n"
            + "\n".join(lines)
            + "\n\\hline\n\\multicolumn{2}{@{}p{\\linewidth}@{}}{\\footnotesize $^\\dagger$Conventions: "
            + note + "} \\\\\n\\end{tabular}\n")


def write_card(card: ReportCard, directory: "str | Path | Any") -> None:
    """``report_card.json``, ``report_card.md`` and ``report_card.tex`` in ``directory``
    (created when missing)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "report_card.json").write_text(card.to_json())
    (d / "report_card.md").write_text(card_markdown(card))
    (d / "report_card.tex").write_text(card_latex(card))


__all__ = ["card_latex", "card_markdown", "card_rows", "fmt_flops", "latex_escape", "write_card"]
