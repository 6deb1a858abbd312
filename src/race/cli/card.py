"""`race card OUTPUT_DIR`: the compute report card of a TRL run, rebuilt from its ledgers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from race.cli.ui import fail as _fail
from race.cli.ui import one_line


def card(
    output_dir: Annotated[Path, typer.Argument(help="the directory the RACE callback wrote ledger.jsonl (or "
                                                    "ledger.rank<r>.jsonl) to: the trainer's output_dir")],
    out: Annotated[Optional[Path], typer.Option(help="write report_card.{json,md,tex} here (default: OUTPUT_DIR)")] = None,
    budget: Annotated[Optional[float], typer.Option(help="the run's FLOP budget (not in the ledgers)")] = None,
    conventions: Annotated[Optional[str], typer.Option(help="the run's conventions (default: an earlier card's, "
                                                            "else race)")] = None,
    model: Annotated[Optional[str], typer.Option(help="model name the card shows")] = None,
    lora_rank: Annotated[Optional[int], typer.Option(help="LoRA rank (default: the newest checkpoint's)")] = None,
    num_generations: Annotated[Optional[int], typer.Option(help="group size G (not in the ledgers)")] = None,
) -> None:
    """Rebuild the report card (JSON, Markdown, LaTeX) from a TRL run's RACE ledgers, per-rank
    files merged, e.g. after a crash."""
    from race.accounting import AccountingError
    from race.accounting.guard import is_budget
    from race.cards import card_markdown, write_card
    from race.engines.trl_card import rebuild_report_card

    if budget is not None and not is_budget(budget):
        _fail(f"--budget {budget:g}: budget must be > 0 and finite (a FLOP count)")
    try:
        rc = rebuild_report_card(output_dir, conventions=conventions, budget_flops=budget, model=model,
                                 lora_rank=lora_rank, num_generations=num_generations)
    except (AccountingError, ValueError, OSError) as e:
        _fail(one_line(str(e)))
    target = out or output_dir
    write_card(rc, target)
    typer.echo(card_markdown(rc))
    for note in rc.extra.get("rebuild_notes", []):
        typer.secho(f"note: {note}", fg=typer.colors.YELLOW, err=True)
    typer.echo(f"wrote {target / 'report_card.json'}, report_card.md, report_card.tex "
               f"(from {', '.join(rc.extra['rebuilt_from'])})")


def register(app: typer.Typer) -> None:
    app.command("card")(card)


__all__ = ["card", "register"]
