"""`race replay`: replay pilot designs (the racing rule and the literature's baselines) on a study
of complete trajectories. A few lines over ``race.protocol.replay.replay``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from race.cli.ui import fail as _fail


def replay(
    study_dir: Annotated[Path, typer.Argument(help="a study whose every allocation ran to the target budget, read at "
                                                   "several smaller budgets (nested: true; or race import --budgets)")],
    target_budget: Annotated[Optional[float], typer.Option(help="T: the budget the trajectories ran to (default: the "
                                                               "study's largest)")] = None,
    target: Annotated[Optional[str], typer.Option(help="evaluation target (default: the study's primary)")] = None,
    design: Annotated[Optional[list[str]], typer.Option("--design", help="replay only these designs (repeat)")] = None,
    first_seeds: Annotated[Optional[int], typer.Option(min=1, help="seeds on the racing designs' first rung (default: "
                                                                  "the frozen design's, 1)")] = None,
    rule: Annotated[Optional[str], typer.Option(help="RacingRule fields as JSON, e.g. '{\"keep_last\": 3}'")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of the table")] = False,
) -> None:
    """Replay every pilot design on a study's complete trajectories and score each pick against the
    study's own truth at T (regret with a paired interval over seeds x problems)."""
    from race.analysis.racing import rule_from
    from race.protocol import ReportError, load_study
    from race.protocol.replay import replay as run, replay_table

    try:
        study = load_study(study_dir)
        r = rule_from(json.loads(rule)) if rule else None
        out = run(study.pilot_runs, study.evals, target=target or study.primary_target, target_budget=target_budget,
                  designs=design, rule=r, first_seeds=first_seeds)
    except (ReportError, ValueError) as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(out, indent=2, default=float))
    else:
        typer.echo(replay_table(out))


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


__all__ = ["register", "replay"]
