"""``race rm``: build and inspect the reward models RACE trains itself.

``race rm build`` trains the requested reward models on the built-in task (or reuses the
checkpoints cached under ``<cache>/rm/``) and prints one row per model: its training
FLOPs (kept apart from any run's budget) and its held-out step-level and outcome accuracy.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

app = typer.Typer(help="Reward models RACE trains itself (process and outcome RMs).", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Reward models RACE trains itself (``race rm build``)."""


def _parse_names(names: str | None) -> list[str]:
    from race.rewards.rm_recipes import known_rms

    if not names:
        return known_rms()
    out = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in out if n not in known_rms()]
    if unknown:
        raise typer.BadParameter(f"unknown reward model(s) {unknown}; choose from {', '.join(known_rms())}",
                                 param_hint="--names")
    return out


@app.command("build")
def build(
    names: Annotated[Optional[str], typer.Option(help="comma-separated, e.g. prm-xs,prm-s,orm-s (default: all)")
                     ] = None,
    force: Annotated[bool, typer.Option("--force", help="retrain even when a cached checkpoint exists")] = False,
    cache_dir: Annotated[Optional[str], typer.Option(help="cache root (default $RACE_CACHE or ~/.cache/race)")] = None,
    threads: Annotated[Optional[int], typer.Option(min=1, help="torch CPU threads (default: torch's choice)")] = None,
) -> None:
    """Train the reward models (or reuse cached ones) and report their held-out accuracy."""
    from rich.console import Console
    from rich.table import Table

    from race.accounting import fmt_flops
    from race.cli.tables import print_table
    from race.cli.ui import build_with_bars
    from race.rewards import training
    from race.rewards.rm_recipes import recipe_for

    chosen = _parse_names(names)
    console = Console()
    infos = build_with_bars(console, [
        (name, recipe_for(name).steps,
         lambda cb, name=name: training.build_rm(name, cache_dir=cache_dir, force=force, progress=cb))
        for name in chosen], threads=threads)

    table = Table(title="reward models (held-out test split; accuracy at threshold 0.5, AUC = ranking quality)")
    cols = ("name", "kind", "backbone", "params", "steps", "seconds", "train FLOPs", "step acc", "bad-step recall",
            "step AUC", "outcome acc", "outcome AUC", "source")
    for col in cols:
        table.add_column(col, justify="left" if col in ("name", "kind", "backbone", "source") else "right")

    def num(ev: dict, key: str) -> str:
        return f"{ev[key]:.3f}" if key in ev else "-"

    for info in infos:
        ev = info.eval
        table.add_row(info.name, info.kind, str(info.recipe["backbone"]), f"{info.total_params:,}", str(info.steps),
                      f"{info.seconds:.0f}", fmt_flops(info.train_flops), num(ev, "step_accuracy"),
                      num(ev, "bad_step_recall"), num(ev, "step_auc"), num(ev, "outcome_accuracy"),
                      num(ev, "outcome_auc"), "cached" if info.reused else "built")
    print_table(console, table)
    console.print("  training FLOPs: race conventions, full fine-tuning, head at the scored positions; "
                  "not charged to any run's budget. Step metrics: ';' markers; outcome: PRM min over markers "
                  "(0 if unfinished) / ORM score vs final-answer correctness.")
    for info in infos:
        console.print(f"  {info.name}: {info.path}")
