"""`race import`: runs trained elsewhere (a TRL output directory, a CSV or JSONL of
evaluations) as a RACE study. A few lines over ``race.protocol.imports.import_study``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from race.cli.ui import fail as _fail


def import_runs(
    paths: Annotated[list[Path], typer.Argument(help="TRL output directories, or a .csv / .jsonl of evaluations "
                                                     "(with --format trl: a manifest of TRL directories)")],
    study_dir: Annotated[Path, typer.Option(help="the new study's directory")],
    format: Annotated[Optional[str], typer.Option("--format", help="trl | csv | jsonl (default: told by the path)")
                      ] = None,
    model: Annotated[Optional[list[str]], typer.Option(
        "--model", help="REF (every run's model) or NAME=REF: a preset, tiny-family name, config.json path or model "
                        "directory giving a model's shape")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", help="a field every run shares: NAME=VALUE (num_generations=8, seed=0, reward=math, lora.r=16)")
                    ] = None,
    score_key: Annotated[Optional[str], typer.Option(help="TRL: the eval_* log key that is the score (default: the "
                                                          "one eval_rewards/<function>/mean)")] = None,
    target: Annotated[Optional[str], typer.Option(help="TRL: the score's target name (default pass@1); a file: the "
                                                       "study's primary target (default greedy)")] = None,
    eval_problems: Annotated[Optional[int], typer.Option(min=1, help="TRL: problems in the evaluation set")] = None,
    conventions: Annotated[str, typer.Option(help="FLOP conventions of charged tokens")] = "race",
    compact_head: Annotated[bool, typer.Option(
        "--compact-head/--all-positions-head",
        help="charged tokens: the fused LM head ran at completion tokens (Triton on CUDA, default) or "
             "at every position (CPU)")] = True,
    allow_one_seed: Annotated[bool, typer.Option(help="import allocations with one seed (the report reads them; "
                                                      "racing and replay need two or more)")] = False,
    budgets: Annotated[Optional[str], typer.Option(
        help="comma-separated FLOP budgets: each run stands for the smaller ones by its prefixes, as in a nested grid "
             "(default: one budget, the largest run's FLOPs)")] = None,
    study: Annotated[Optional[str], typer.Option(help="study name (default: the directory's name)")] = None,
    replace: Annotated[bool, typer.Option(help="replace an imported study already in --study-dir")] = False,
) -> None:
    """Turn runs trained elsewhere into a RACE study that `race report` reads (docs/import.md)."""
    from race.cards import fmt_flops
    from race.protocol.imports import ImportRefused, import_study
    from race.spec.errors import ConfigError
    from race.spec.run import parse_override

    try:
        levels = [float(b) for b in budgets.replace(" ", "").split(",") if b] if budgets else None
    except ValueError:
        raise typer.BadParameter(f"{budgets!r}: write comma-separated numbers, e.g. 1e11,2e11,4e11",
                                 param_hint="--budgets")
    try:
        settings = {".".join(k): v for k, v in (parse_override(s) for s in set_ or [])}
        res = import_study(paths, study_dir, fmt=format, settings=settings, models=model, score_key=score_key,
                           target=target, eval_problems=eval_problems, conventions=conventions,
                           compact_head=compact_head, allow_one_seed=allow_one_seed, study=study, replace=replace,
                           budgets=levels)
    except (ImportRefused, ConfigError) as e:
        _fail(str(e))
    total = sum(r.total_flops for r in res.runs)
    typer.echo(f"imported {len(res.runs)} run(s), {res.allocations} allocation(s), {fmt_flops(total)} counted "
               f"training FLOPs into {res.study_dir} (study {res.study}, primary target {res.primary_target})")
    for c in res.caveats:
        typer.secho(f"  caveat: {c}", fg=typer.colors.YELLOW)
    typer.echo(f"next: race report {res.study_dir}")


def register(app: typer.Typer) -> None:
    """Add `import` to the main app."""
    app.command("import")(import_runs)


__all__ = ["import_runs", "register"]
