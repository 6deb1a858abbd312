"""`race train` (and the commands that run training: demo, report, validate).

Each command is a few lines over a library call; heavy imports stay inside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from race.accounting.guard import is_budget
from race.cli.ui import cell_events
from race.cli.ui import fail as _fail


def train(
    config: Annotated[Path, typer.Argument(help="run YAML file (see configs/)")],
    budget: Annotated[Optional[float], typer.Option(help="FLOP budget (overrides budget_flops)")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a setting: key=value (lora.r=16)")] = None,
    output_dir: Annotated[Optional[Path], typer.Option(help="run directory (default runs/<name>-<id>)")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
) -> None:
    """Train one GRPO run under a FLOP budget; resumes if the run directory has a checkpoint."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from race.accounting import AccountingError
    from race.cards import fmt_flops
    from race.spec.errors import ConfigError
    from race.spec.files import load_run_file

    if budget is not None and not is_budget(budget):
        _fail(f"--budget {budget:g}: budget must be > 0 and finite (a FLOP count)")
    try:  # the budget travels as a float, not through YAML text
        cfg = load_run_file(config, list(set_ or []), values={"budget_flops": budget} if budget is not None else None)
    except ConfigError as e:
        _fail(str(e))
    run_dir = output_dir or Path(cfg.output_dir or f"runs/{cfg.name}-{cfg.run_id()}")
    console = Console()
    console.print(f"[bold]race train[/bold] {cfg.name}: {cfg.model}, engine={cfg.engine}, reward={cfg.reward}, "
                  f"budget {fmt_flops(cfg.budget_flops)} -> {run_dir}")
    from race.engines import run_engine

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console, disable=quiet) as bar:
        task = bar.add_task("FLOPs", total=cfg.budget_flops, info="")

        def on_step(d: dict[str, Any]) -> None:  # run_engine also sends the rows to cfg.log_to
            bar.update(task, completed=d["flops"],
                       info=f"step {d['step']} | {fmt_flops(d['flops'])} / {fmt_flops(d['budget'])} | "
                            f"reward {d['reward_mean']:.3f} | zero-var {d['zero_var_frac']:.0%}")

        try:
            out = run_engine(cfg, run_dir, progress=on_step)
        except (AccountingError, ValueError, FileNotFoundError, RuntimeError) as e:
            _fail(str(e))
    _print_summary(console, out, Path(run_dir))
    if out["status"] != "complete":
        raise typer.Exit(1)


def _print_summary(console: Any, out: dict[str, Any], run_dir: Path) -> None:
    from rich.table import Table

    from race.cards import fmt_flops

    t = Table(title=f"{out['name']} ({out['status']}, stopped by {out['stop_reason']})")
    t.add_column("")
    t.add_column("value", justify="right")
    t.add_row("steps", str(out["steps"]))
    t.add_row("FLOPs spent / budget", f"{fmt_flops(out['total_flops'])} / {fmt_flops(out['budget_flops'])}")
    for ph, v in out["phase_flops"].items():
        if v:
            t.add_row(f"  {ph}", fmt_flops(v))
    for target, score in out["final"].items():
        t.add_row(f"{target}", f"{out['initial'].get(target, float('nan')):.3f} -> {score:.3f}")
    t.add_row("wall seconds", f"{out['wall_s']:.1f}")
    console.print(t)
    if out.get("error"):
        console.print(f"[red]{out['error']}[/red]")
    console.print(f"run directory: {run_dir} (report card: {run_dir / 'report_card.md'})")


def demo(
    study_dir: Annotated[Path, typer.Option(help="where the study (SQLite store, runs, report) goes")] = Path("studies/demo"),
    grid: Annotated[Optional[Path], typer.Option(help="grid file (default: the packaged demo grid)")] = None,
    workers: Annotated[Optional[int], typer.Option(min=1, help="cells in flight (default: the grid's)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no live view")] = False,
    validate: Annotated[bool, typer.Option(help="run the target run (the pick's pilot continued to the target "
                                                "budget) and its strongest rival's, and report forecast vs "
                                                "realised")] = True,
    rivals: Annotated[int, typer.Option(min=0, help="rivals validated beside the recommendation")] = 1,
) -> None:
    """The main job: build the tiny base models and reward models (cached), run the default
    pilot grid (all four axes), validate the recommendation at the target budget, and write
    the report. Resumable: run it again after a crash."""
    import time
    from importlib import resources

    from rich.console import Console

    from race.cli.grid import run as grid_run
    from race.grid import load_grid_spec
    from race.report import build_report

    con = Console()
    t0 = time.perf_counter()
    with resources.as_file(resources.files("race") / "configs" / "demo.yaml") as packaged:
        grid_file = grid or Path(packaged)
        spec = load_grid_spec(grid_file)
        _demo_builds(con, spec)
        split = {"builds": time.perf_counter() - t0}
        con.print(f"  ({split['builds']:.0f} s)")
        t_grid = time.perf_counter()
        con.rule(f"[bold]2/4 pilot {'race' if spec.racing else 'grid'}[/bold]")
        try:
            grid_run(grid_file, runner=None, workers=workers, threads=None, ray_address=None, study_dir=study_dir,
                     retry_failed=False, quiet=quiet)
        except typer.Exit as e:
            if e.exit_code not in (0, 1):  # 1: some cells failed; the report says which
                raise
    split["grid"] = time.perf_counter() - t_grid
    t_val = time.perf_counter()
    study = None  # the study as the validation read it after its runs (the report renders it)
    if validate:
        con.rule("[bold]3/4 target run[/bold] (the pick's pilot continued to the target budget, a rival's beside "
                 "it; they never feed the forecast)" if spec.racing else
                 "[bold]3/4 validation[/bold] (new runs at the target budget; they never feed the forecast)")
        study = _demo_validation(con, study_dir, rivals, workers)
        split["validation"] = time.perf_counter() - t_val
        con.print(f"  ({split['validation']:.0f} s)")
    t_rep = time.perf_counter()
    con.rule(f"[bold]{'4/4' if validate else '3/3'} report[/bold]")
    paths = build_report(study if study is not None else study_dir)
    if paths.headline:
        con.print(f"recommendation: {paths.headline} (confidence: {paths.confidence})")
    con.print(f"report: {paths.html}")
    con.print(f"        {paths.markdown}")
    split["report"] = time.perf_counter() - t_rep
    con.print(f"demo wall time: {time.perf_counter() - t0:.0f} s ("
              + ", ".join(f"{k} {v:.0f} s" for k, v in split.items()) + ")")


def _demo_builds(con: Any, spec: Any) -> None:
    """Stage 1 of the demo: the grid's base models and reward models, built side by side
    where they are not cached yet (longest first), each one's line printed."""
    from race.grid.prebuild import grid_builds, plan_builds, run_builds
    from race.models.base_recipes import cached_base

    axes = dict(spec.axes)
    models, rms = grid_builds(axes.get("model", [spec.base.get("model", "tiny-s")]),
                              [cell.config.reward for cell in spec.cells()])  # parsed specs
    con.rule("[bold]1/4 base models and reward models[/bold] (cached after the first run)")
    jobs = plan_builds(models, rms)
    if jobs:
        con.print(f"  building {', '.join(j.name for j in jobs)} (side by side, longest first) ...")
    built = {d.job.name for d in run_builds(
        jobs, on_done=lambda d: con.print(f"  {d.job.name}: built in {d.seconds:.0f} s: {d.summary}"))}
    for m in models:
        info = None if m in built else cached_base(m)
        if info is not None:
            con.print(f"  {m}: cached, {info.non_embedding_params:,} non-embedding params, greedy test "
                      f"accuracy {info.test_accuracy:.3f}")
    for name in rms:
        if name not in built:
            con.print(f"  {name}: cached")


def _demo_validation(con: Any, study_dir: Path, rivals: int, workers: int | None) -> Any:
    """``race validate`` inside the demo: the report then shows forecast vs realised. A
    validation that cannot run (e.g. no pilot run completed) is reported, not fatal.
    Returns the study as the validation read it after its runs (None when it did not run)."""
    from race.cards import fmt_flops
    from race.protocol import ReportError, run_validation

    try:
        res = run_validation(study_dir, rivals=rivals, workers=workers, on_event=cell_events(con.print))
    except ReportError as e:
        con.print(f"[yellow]  validation not run: {e}[/yellow]")
        return None
    v = res.result
    con.print(f"  validated at {fmt_flops(res.target_budget)}: {', '.join(res.allocations)}")
    if v is not None:
        con.print(f"  {v.allocation}: realised {v.realised_score:.3f} [{v.realised_lo:.3f}, {v.realised_hi:.3f}]"
                  + (f", forecast {v.predicted_score:.3f} [{v.predicted_lo:.3f}, {v.predicted_hi:.3f}]"
                     if v.predicted_score == v.predicted_score else ""))
    if res.message:
        con.print(f"[yellow]  note: {res.message}[/yellow]")
    return res.study


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``demo`` to the main app."""
    app.command()(train)
    app.command()(demo)


__all__ = ["register", "train", "demo"]
