"""``race grid``: plan, run, inspect and export a pilot grid.

Each command is a few lines over a ``race.grid`` call. The lead wires ``app`` into the
main CLI as ``grid``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from race.cli.ui import fail as _fail

app = typer.Typer(help="Pilot grids: cheap runs over allocations at several FLOP budgets.", no_args_is_help=True)




def _load(grid_file: Path) -> Any:
    from race.grid import GridSpecError, load_grid_spec

    try:
        return load_grid_spec(grid_file)
    except GridSpecError as e:
        _fail(str(e))


def _fmt_s(s: float | None) -> str:
    from race.cli.tables import fmt_seconds

    return fmt_seconds(s)


@app.command("plan")
def plan(
    grid_file: Annotated[Path, typer.Argument(help="grid YAML file")],
    study_dir: Annotated[Optional[Path], typer.Option(help="calibrate wall time (and, on a GPU, the MFU) on this "
                                                           "study's finished runs")] = None,
    device: Annotated[str, typer.Option(help="price on this device of the table: h100 | h200 | a100 | l40s | cpu")
                      ] = "cpu",
    mfu: Annotated[Optional[str], typer.Option(help="model-FLOP utilisation: one fraction, or rollout=0.02,"
                                                    "learning=0.15,feedback=0.15 (default: measured in --study-dir, "
                                                    "else the stated assumption)")] = None,
    workers: Annotated[Optional[int], typer.Option(min=1, help="cells in flight (default: the grid's, else one per "
                                                               "GPU here, else 2)")] = None,
    allow_refused: Annotated[bool, typer.Option("--allow-refused", help="exit 0 although cells are refused (report "
                                                                        "only)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Dry run: every cell with its predicted steps, FLOP split, wall time and GPU-hours, totals, refusals.
    Exits 1 when a cell cannot run (a worker would fail on it: a misspelled model, a missing file or
    tokenizer...), unless --allow-refused; cells below min_steps are refused by the grid's own rule."""
    from race.accounting import AccountingError
    from race.grid.plan import plan_grid
    from race.grid.pricing import pricing
    from race.grid.race_plan import plan_race

    spec = _load(grid_file)
    per_cell = spec.runner.gpus_per_cell if spec.runner.kind == "ray" and spec.runner.gpus_per_cell > 0 else 1.0
    try:
        price = pricing(device, mfu=mfu, study_dir=study_dir, gpus_per_cell=per_cell)
    except (AccountingError, ValueError) as e:
        _fail(f"--device {device}: {e}" if isinstance(e, AccountingError) else str(e))
    if spec.racing:
        p = plan_race(spec, _schedule(spec, study_dir), study_dir=study_dir, price=price, workers=workers)
    else:
        p = plan_grid(spec, study_dir=study_dir, price=price, workers=workers)
    if as_json:
        typer.echo(json.dumps(p.to_dict(), indent=2))
    else:
        _print_plan(p)
    if p.cannot_run and not allow_refused:
        typer.secho(f"{len(p.cannot_run)} of {len(p.cells)} cell(s) cannot run (refused above): fix them, or pass "
                    "--allow-refused to plan the others (`race grid run` runs only the others)",
                    fg=typer.colors.RED, err=True)
        raise typer.Exit(1)


def _print_plan(p: Any) -> None:
    """The plan's table, totals, per-rung lines (a racing grid), refusals and notes."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from race.cli.tables import print_table

    unit = p.pricing.unit
    table = Table(title=f"study {p.spec.study}: {len(p.cells)} cells ({len(p.refused)} refused)"
                  + (" on the first rung (protocol: race; later rungs extend the runs that go on)" if p.race else "")
                  + f", priced on {p.pricing.device.key}")
    cols = ("run_id", "allocation", "budget", "seed", "steps", "rollout %", "learning %", "feedback %", "wall",
            f"{unit}-h", "note")
    for col in cols:
        table.add_column(col, justify="left" if col in ("run_id", "allocation", "note") else "right")
    for c in p.cells:
        split = c.split_pct()
        pct = [f"{x:.0f}" for x in split] if split else ["-"] * 3
        steps = str(int(c.prediction["steps"])) if c.prediction else "?"
        table.add_row(c.cell.run_id, escape(c.cell.label), f"{c.cell.budget:.3g}", str(c.cell.seed), steps, *pct,
                      _fmt_s(p.cell_seconds(c)), f"{p.cell_hours(c):.3g}",
                      "[red]cannot run[/red]" if c.cannot_run else "[yellow]< min_steps[/yellow]" if c.refusal else "")
    con = Console()
    print_table(con, table)
    pred = p.total_predicted_flops
    con.print(f"runnable cells: {len(p.runnable)}   budget total: {p.total_budget:.3g} FLOPs"
              + (f"   predicted spend: {pred:.3g} FLOPs" if pred is not None else "")
              + f"   est. wall time: {_fmt_s(p.est_wall_s)} with {p.workers} worker(s)"
              + f"   {unit}-hours: {p.device_hours:.3g} on {p.pricing.device.key}")
    if p.race:
        _print_rungs(con, p.race)
    for c in p.refused:
        con.print(f"[red]refused[/red] {c.cell.run_id} " + escape(f"[{c.cell.label} seed={c.cell.seed}]: {c.refusal}"))
    for n in p.notes:
        con.print(f"[dim]note: {escape(n)}[/dim]")


def _schedule(spec: Any, study_dir: Optional[Path]) -> Any:
    """The racing grid's schedule: the one stored with ``study_dir``'s race, else the one the
    protocol chooses (``race.protocol.racing.race_schedule``); a grid too large for the cap ends
    the command with what to cut."""
    from race.protocol import ReportError
    from race.protocol.racing import race_schedule

    if study_dir is not None and (study_dir / "study.sqlite").exists():
        from race.grid import Store
        from race.spec.rungs import schedule_from_dict

        with Store(study_dir, create=False) as store:
            stored = store.race_schedule()
        if stored is not None:
            return schedule_from_dict(stored)
    try:
        return race_schedule(spec)
    except ReportError as e:
        _fail(str(e))


def _print_rungs(con: Any, race: dict) -> None:
    """A racing grid's schedule and its cost per rung at three ends (module race.grid.race_plan)."""
    from rich.markup import escape

    unit, T = race["unit"], race["target_budget"]
    con.print(f"race schedule: {len(race['rungs'])} rungs "
              + ", ".join(f"T/{T / b:.3g} ({n} ranked onto it)" for b, n in zip(race["rungs"], race["keep"]))
              + f"; first rung with {len(race['first_rung_seeds'])} seed(s), later rungs {race['later_seeds']}; worst "
              f"case {race['schedule']['pilot_budget_T']:.2f} T of pilots, {race['unreused_T']:.2f} T not reused by the "
              f"target run (cap {race['cap']} T){'' if race['fits'] else ' [red]OVER THE CAP[/red]'}")
    raised = {a: b for a, b in race["first_rungs"].items() if b > race["rungs"][0] * (1 + 1e-9)}
    if raised:
        con.print(f"step floor: {len(raised)} allocation(s) start higher, where they have taken warmup + the floor's "
                  "steps: " + "; ".join(escape(f"{a} T/{T / b:.3g}") for a, b in sorted(raised.items(),
                                                                                   key=lambda x: x[1])))
    for k, rows in enumerate(zip(*(race[e]["rungs"] for e in ("schedule", "least", "all")))):
        s, lo, a = rows
        con.print(f"rung {k} (T/{T / s['budget']:.3g}): {s['cells']} cell(s), {s['pilot_budget'] / T:.2f} T + "
                  f"evaluations {s['eval_flops'] / T:.2f} T, {_fmt_s(s['est_wall_s'])}, {s['device_hours']:.3g} "
                  f"{unit}-h at the worst case; {lo['cells']} cell(s) if only the leader goes on; {a['cells']} if "
                  "every allocation does")
    for end, what in (("schedule", "the worst case"), ("least", "the leader only"), ("all", "every allocation")):
        e = race[end]
        con.print(f"race in all ({what}): pilots {e['pilot_budget_T']:.2f} T, evaluations {e['eval_flops_T']:.2f} T, "
                  f"{_fmt_s(e['est_wall_s'])} / {e['device_hours']:.3g} {unit}-h")
    con.print(f"then the target run's extension: {_fmt_s(race['target_extension_wall_s'])} / "
              f"{race['target_extension_device_hours']:.3g} {unit}-h")


@app.command("run")
def run(
    grid_file: Annotated[Path, typer.Argument(help="grid YAML file")],
    runner: Annotated[Optional[str], typer.Option(help="local | ray (default: the grid file's runner)")] = None,
    workers: Annotated[Optional[int], typer.Option(min=1, help="cells in flight")] = None,
    threads: Annotated[Optional[int], typer.Option(min=1, help="torch/BLAS threads per worker")] = None,
    ray_address: Annotated[Optional[str], typer.Option(help="address of an existing Ray cluster")] = None,
    study_dir: Annotated[Optional[Path], typer.Option(help="study directory (default studies/<study>)")] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="run cells that failed in an earlier session")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no live view; one line per finished cell")] = False,
) -> None:
    """Run (or resume) a grid: complete cells are skipped, interrupted cells resume."""
    from rich.console import Console
    from rich.live import Live
    from rich.markup import escape

    from race.grid import GridEvent, StoreError, StudyLockedError, run_grid

    if runner is not None and runner not in ("local", "ray"):
        _fail(f"--runner {runner!r}: choose local or ray")
    spec = _load(grid_file)
    con = Console()
    live = None if quiet else Live(console=con, refresh_per_second=4, transient=False)

    def on_event(ev: GridEvent) -> None:
        if ev.kind in ("complete", "failed", "retry"):
            color = {"complete": "green", "failed": "red", "retry": "yellow"}[ev.kind]
            con.print(f"[{color}]{ev.kind}[/{color}] {ev.run_id} "
                      + escape(f"[{ev.label}]" + (f": {ev.message}" if ev.message else "")))
        if live is not None:
            live.update(_progress_view(spec.study, ev))

    def on_rung(d: dict) -> None:
        con.print(escape(rung_line(d)))

    from race.protocol import ReportError, run_race

    kw = dict(runner=runner, workers=workers, threads_per_worker=threads, ray_address=ray_address,
              retry_failed=retry_failed, on_event=on_event)
    try:
        if live is not None:
            live.start()
        try:
            result = (run_race(spec, study_dir, on_rung=on_rung, **kw) if spec.racing  # type: ignore[arg-type]
                      else run_grid(spec, study_dir, **kw))  # type: ignore[arg-type]
        finally:
            if live is not None:
                live.stop()
                con.print()
    except (StudyLockedError, StoreError, ReportError) as e:
        _fail(str(e))
    if _race_summary(con, result) if spec.racing else _grid_summary(con, result):
        raise typer.Exit(1)


def _progress_view(study: str, ev: Any) -> Any:
    """The live view of ``race grid run``: the study, its cells by state, FLOPs and time."""
    from rich.table import Table

    p = ev.progress
    t = Table.grid(padding=(0, 2))
    t.add_row("study", f"{study}   [dim]{p.runner}[/dim]")
    t.add_row("cells", f"[green]{p.complete} done[/green] / {p.running} running / [red]{p.failed} failed[/red] / "
                       f"{p.pending} pending  (of {p.total}; {p.refused} refused)")
    t.add_row("FLOPs", f"{p.flops_done:.3g} spent / {p.flops_planned:.3g} planned")
    t.add_row("time", f"{_fmt_s(p.elapsed_s)} elapsed, ETA {_fmt_s(p.eta_s)}")
    return t


def _race_summary(con: Any, result: Any) -> bool:
    """Print a race's notes and outcome; whether a cell failed (the command then exits 1)."""
    from rich.markup import escape

    for n in result.notes:
        con.print(f"[dim]note: {escape(n)}[/dim]")
    con.print(f"race: {len(result.decisions)} of {result.rungs} rungs decided, {result.cells} cells, "
              f"{len(result.failed)} failed; pick: {result.pick or '-'}; study: {result.study_dir}"
              + ("  (next: `race validate` continues the pick's pilot to the target)" if result.finished else ""))
    return bool(result.failed)


def _grid_summary(con: Any, result: Any) -> bool:
    """Print a flat grid's notes, refused cells and outcome; whether a cell failed or could
    not run (the command then exits 1)."""
    from rich.markup import escape

    for n in result.notes:
        con.print(f"[dim]note: {escape(n)}[/dim]")
    for c in result.refused:
        con.print(f"[red]refused[/red] {c.cell.run_id} " + escape(f"[{c.cell.label}]: {c.refusal}"))
    con.print(f"{result.complete}/{result.total} cells complete ({result.skipped_complete} were already), "
              f"{len(result.failed)} failed, {result.ran} attempts this session, {_fmt_s(result.elapsed_s)}; "
              f"study: {result.study_dir}")
    if result.failed:
        con.print("failed cells: " + ", ".join(result.failed) + "  (see `race grid status`)")
    blocked = [c for c in result.refused if c.cannot_run]
    if blocked:
        con.print(f"[red]{len(blocked)} cell(s) could not run[/red] (refused above; the others ran): fix them and run "
                  "the grid again, it runs only what is missing")
    return bool(result.failed or blocked)


def rung_line(d: dict) -> str:
    """One line per rung decision: who goes on, and who stops."""
    stop = d.get("stopped") or {}
    return (f"rung {d['rung']} ({d['budget']:.3g} FLOPs) decided: {len(d['go_on'])} go on "
            f"({', '.join(d['go_on'])})" + (f"; {len(stop)} stop" if stop else "")
            + ("; the pick's pilot continues to the target" if d.get("next_budget") is None else ""))


@app.command("status")
def status(
    study_dir: Annotated[Path, typer.Argument(help="study directory")],
    errors: Annotated[bool, typer.Option("--errors", help="show each failed cell's full error")] = False,
) -> None:
    """Table of cells and their status (safe while a driver runs)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from race.cli.tables import print_table
    from race.grid import StoreError, study_status

    try:
        st = study_status(study_dir)
    except StoreError as e:
        _fail(str(e))
    table = Table(title=f"study {st.study} ({st.study_dir})")
    for col in ("run_id", "allocation", "budget", "seed", "status", "attempts", "steps", "FLOPs", "wall", "error"):
        table.add_column(col)
    colors = {"complete": "green", "failed": "red", "running": "yellow", "diverged": "magenta"}
    for c in st.cells:
        s = c["status"]
        table.add_row(c["run_id"], escape(c["label"]), f"{c['budget']:.3g}", str(c["seed"]),
                      f"[{colors[s]}]{s}[/{colors[s]}]" if s in colors else s, str(c["attempts"]),
                      "" if c["steps"] is None else str(c["steps"]),
                      "" if c["total_flops"] is None else f"{c['total_flops']:.3g}", _fmt_s(c["wall_s"]) if c["wall_s"] else "",
                      escape(c["error"] or ""))
    con = Console()
    print_table(con, table)
    con.print("  ".join(f"{k}: {v}" for k, v in st.counts.items() if v) + f"   FLOPs {st.flops_done:.3g} / {st.flops_planned:.3g}"
              + (f"   (+{st.prefixes} prefix runs of nested cells)" if st.prefixes else ""))
    if st.driver:
        con.print(f"driver: pid {st.driver.get('pid')} on {st.driver.get('host')} is running this study")
    elif st.counts.get("running"):
        con.print(f"[yellow]{st.counts['running']} cell(s) marked running but no driver is alive[/yellow]: they restart "
                  "(resuming from their checkpoints) on the next `race grid run`")
    if errors:
        from race.grid import Store

        with Store(study_dir, create=False) as store:
            for r in store.runs("failed"):
                con.print(f"[red]{r['run_id']}[/red] " + escape(f"[{r['label']}]\n{r['error']}"))


@app.command("export")
def export(
    study_dir: Annotated[Path, typer.Argument(help="study directory")],
    fmt: Annotated[str, typer.Option("--format", help="parquet | csv")] = "parquet",
    out: Annotated[Optional[Path], typer.Option(help="output directory (default <study_dir>/export)")] = None,
) -> None:
    """Write the runs, evals, ledger and train tables as Parquet or CSV."""
    from race.grid import StoreError, export_study

    if fmt not in ("parquet", "csv"):
        _fail(f"--format {fmt!r}: choose parquet or csv")
    try:
        files = export_study(study_dir, out, fmt)
    except StoreError as e:
        _fail(str(e))
    for f in files:
        typer.echo(str(f))
