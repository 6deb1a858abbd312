"""`race report` and `race validate`: a study's report, and the validation stage.

Each command is a few lines over ``race.protocol`` (the study, the validation stage) and
``race.report`` (rendering); heavy imports stay inside. Each reads the study once
(``race.protocol.load_study``) and hands the value on; ``race validate`` reads it once more
after its runs (what the realised regret and the report are computed on). The lead's
``race.cli.run_cmds`` calls :func:`register` to add them to the main app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from race.cli.ui import cell_events
from race.cli.ui import fail as _fail




def _targets(target: str) -> tuple[str, ...]:
    from race.report import DEFAULT_TARGETS

    return (target, *[t for t in DEFAULT_TARGETS if t != target])


def _load(study_dir: Path, target: str | None, target_budget: float | None) -> tuple[Any, str]:
    """The study (read once, ``race.protocol.load_study``) and the primary target
    (``--target``, else the study's own)."""
    from race.protocol import ReportError, load_study

    try:
        study = load_study(study_dir, target_budget=target_budget)
    except ReportError as e:
        _fail(str(e))
    target = target or study.primary_target
    present = sorted(study.evals_of(study.pilot_runs)["target"].astype(str).unique())
    if target not in present:
        _fail(f"--target {target!r} is not evaluated in study {study.name} (targets: {', '.join(present) or 'none'})")
    return study, target


def _print_report(paths: Any) -> None:
    from race.cards import fmt_flops

    typer.echo(f"report: {paths.html}")
    typer.echo(f"        {paths.markdown} (figures in {paths.out_dir / 'figures'}), numbers in {paths.json}")
    if paths.total_flops is not None:
        typer.echo(f"study total: {fmt_flops(paths.total_flops)} (report card: {paths.out_dir / 'report_card.md'})")
    if paths.headline:
        typer.echo(paths.headline)
        typer.echo(f"confidence: {paths.confidence}")
    for key, why in paths.missing.items():
        typer.secho(f"  [{key}] not shown: {why}", dim=True)


def report(
    study_dir: Annotated[Path, typer.Argument(help="study directory (holds study.sqlite)")],
    out: Annotated[Optional[Path], typer.Option(help="output directory (default STUDY_DIR/report)")] = None,
    target_budget: Annotated[Optional[float], typer.Option(help="FLOPs of the run to plan (default: the validated "
                                                               "budget, else 4x the largest pilot budget)")] = None,
    target: Annotated[Optional[str], typer.Option(help="primary evaluation target: greedy | pass@k | pass@1 | hard "
                                                       "(default: the grid's first eval target)")] = None,
    n_boot: Annotated[int, typer.Option(min=10, help="bootstrap replicates of scores")] = 500,
    n_boot_fit: Annotated[int, typer.Option(min=10, help="bootstrap replicates of curve fits")] = 200,
    seed: Annotated[int, typer.Option(help="random seed of the bootstraps")] = 0,
    count_rm_training: Annotated[Optional[bool], typer.Option(
        "--count-rm-training/--no-count-rm-training",
        help="count the reward models' training FLOPs in the report card's total (default: the grid's "
             "report.count_rm_training, else a separate line outside the pilot budget)")] = None,
) -> None:
    """Write the study's report (HTML, Markdown, JSON, the study's report card) and print its recommendation."""
    from race.protocol import ReportError
    from race.report import build_report

    study, target = _load(study_dir, target, target_budget)
    try:
        paths = build_report(study, out, target_budget=target_budget, targets=_targets(target), rng=seed,
                             n_boot=n_boot, n_boot_fit=n_boot_fit, count_rm_training=count_rm_training)
    except ReportError as e:
        _fail(str(e))
    _print_report(paths)


def _parse_seeds(seeds: str | None) -> list[int] | None:
    if not seeds:
        return None
    try:
        out = [int(s) for s in seeds.replace(" ", "").split(",") if s]
    except ValueError:
        raise typer.BadParameter(f"{seeds!r}: write comma-separated integers, e.g. 0,1,2", param_hint="--seeds")
    if not out:
        raise typer.BadParameter("give at least one seed", param_hint="--seeds")
    return out


def validate(
    study_dir: Annotated[Path, typer.Argument(help="study directory (holds study.sqlite)")],
    target_budget: Annotated[Optional[float], typer.Option(help="FLOPs of the validation runs (default: a racing "
                                                               "study's target budget, else 4x the largest pilot "
                                                               "budget)")] = None,
    rivals: Annotated[int, typer.Option(min=0, help="strongest rivals to run beside the recommendation")] = 2,
    seeds: Annotated[Optional[str], typer.Option(help="comma-separated seeds (default: each allocation's pilot "
                                                      "seeds; a racing study: the continued seeds, these beside "
                                                      "them)")] = None,
    target: Annotated[Optional[str], typer.Option(help="evaluation target the recommendation optimises (default: "
                                                       "the grid's first eval target)")] = None,
    workers: Annotated[Optional[int], typer.Option(min=1, help="cells in flight (default: the study's runner)")] = None,
    out: Annotated[Optional[Path], typer.Option(help="report directory (default STUDY_DIR/report)")] = None,
    n_boot: Annotated[int, typer.Option(min=10, help="bootstrap replicates of scores")] = 500,
    n_boot_fit: Annotated[int, typer.Option(min=10, help="bootstrap replicates of curve fits")] = 200,
    seed: Annotated[int, typer.Option(help="random seed of the bootstraps")] = 0,
) -> None:
    """Run the recommendation and its rivals at the target budget; report realised regret. A
    racing study's target run continues the pick's pilot (its continued run) to the target
    budget, rivals from theirs; --seeds adds seeds beside it."""
    from race.cards import fmt_flops
    from race.protocol import ReportError, run_validation
    from race.report import build_report

    seed_list = _parse_seeds(seeds)
    study, target = _load(study_dir, target, None)

    on_event = cell_events(typer.echo)
    try:
        res = run_validation(study, target_budget=target_budget, target=target, rivals=rivals, seeds=seed_list,
                             workers=workers, n_boot=n_boot, n_boot_fit=n_boot_fit, rng=seed, on_event=on_event)
    except ReportError as e:
        _fail(str(e))
    rec = res.recommendation
    typer.echo(f"validated at {fmt_flops(res.target_budget)}: {', '.join(res.allocations)}")
    v = res.result
    if v is not None:
        typer.echo(f"recommended {v.allocation}: realised {v.realised_score:.3f} [{v.realised_lo:.3f}, "
                   f"{v.realised_hi:.3f}], predicted {v.predicted_score:.3f} [{v.predicted_lo:.3f}, "
                   f"{v.predicted_hi:.3f}]")
        typer.echo(f"realised regret {v.realised_regret:.3f} [{v.regret_lo:.3f}, {v.regret_hi:.3f}]"
                   f"{' (a tie)' if v.regret_tie else ''} vs expected regret {v.predicted_regret:.3f}; "
                   f"best rival {v.best_rival or '-'}; confidence was {rec.confidence}")
    if res.message:
        typer.secho(f"note: {res.message}", fg=typer.colors.YELLOW)
    try:  # the study as the validation read it after its runs
        paths = build_report(res.study or study_dir, out, target_budget=res.target_budget, targets=_targets(target),
                             rng=seed, n_boot=n_boot, n_boot_fit=n_boot_fit)
    except ReportError as e:
        _fail(str(e))
    _print_report(paths)
    if res.status != "complete":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `report` and `validate` to the main app."""
    app.command("report")(report)
    app.command("validate")(validate)


__all__ = ["register", "report", "validate"]
