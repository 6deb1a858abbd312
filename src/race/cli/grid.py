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
    if s is None:
        return "-"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@app.command("plan")
def plan(
    grid_file: Annotated[Path, typer.Argument(help="grid YAML file")],
    study_dir: Annotated[Optional[Path], typer.Option(help="calibrate wall time on this study's finished runs")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Dry run: every cell with its predicted steps and FLOP split, totals, refusals."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from race.cli.tables import print_table
    from race.grid.race_plan import plan_race

    spec = _load(grid_file)
    cap = None
    if spec.racing and spec.race is not None:
        from race.protocol.racing import racing_rule

        cap = racing_rule(spec.race.rule, spec.race.later_seeds).max_unreused
    p = plan_race(spec, study_dir=study_dir, max_unreused=cap)
    if as_json:
        typer.echo(json.dumps(p.to_dict(), indent=2))
        return
    table = Table(title=f"study {p.spec.study}: {len(p.cells)} cells ({len(p.refused)} refused)"
                  + (" on the first rung (protocol: race; later rungs extend the runs that go on)" if p.race else ""))
    for col in ("run_id", "allocation", "budget", "seed", "steps", "rollout %", "learning %", "feedback %", "note"):
        table.add_column(col, justify="right" if col in ("budget", "seed", "steps") or "%" in col else "left")
    for c in p.cells:
        split = c.split_pct()
        pct = [f"{x:.0f}" for x in split] if split else ["-"] * 3
        steps = str(int(c.prediction["steps"])) if c.prediction else "?"
        table.add_row(c.cell.run_id, escape(c.cell.label), f"{c.cell.budget:.3g}", str(c.cell.seed), steps, *pct,
                      "[red]refused[/red]" if c.refusal else "")
    con = Console()
    print_table(con, table)
    pred = p.total_predicted_flops
    con.print(f"runnable cells: {len(p.runnable)}   budget total: {p.total_budget:.3g} FLOPs"
              + (f"   predicted spend: {pred:.3g} FLOPs" if pred is not None else "")
              + f"   est. wall time: {_fmt_s(p.est_wall_s)} with {p.workers} worker(s)")
    for c in p.refused:
        con.print(f"[red]refused[/red] {c.cell.run_id} " + escape(f"[{c.cell.label} seed={c.cell.seed}]: {c.refusal}"))
    for n in p.notes:
        con.print(f"[dim]note: {escape(n)}[/dim]")


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
    from rich.table import Table

    from race.grid import GridEvent, StoreError, StudyLockedError, run_grid

    if runner is not None and runner not in ("local", "ray"):
        _fail(f"--runner {runner!r}: choose local or ray")
    spec = _load(grid_file)
    con = Console()

    def view(ev: GridEvent) -> Table:
        p = ev.progress
        t = Table.grid(padding=(0, 2))
        t.add_row("study", f"{spec.study}   [dim]{p.runner}[/dim]")
        t.add_row("cells", f"[green]{p.complete} done[/green] / {p.running} running / [red]{p.failed} failed[/red] / "
                           f"{p.pending} pending  (of {p.total}; {p.refused} refused)")
        t.add_row("FLOPs", f"{p.flops_done:.3g} spent / {p.flops_planned:.3g} planned")
        t.add_row("time", f"{_fmt_s(p.elapsed_s)} elapsed, ETA {_fmt_s(p.eta_s)}")
        return t

    live = None if quiet else Live(console=con, refresh_per_second=4, transient=False)

    def on_event(ev: GridEvent) -> None:
        if ev.kind in ("complete", "failed", "retry"):
            color = {"complete": "green", "failed": "red", "retry": "yellow"}[ev.kind]
            con.print(f"[{color}]{ev.kind}[/{color}] {ev.run_id} "
                      + escape(f"[{ev.label}]" + (f": {ev.message}" if ev.message else "")))
        if live is not None:
            live.update(view(ev))

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
    if spec.racing:
        for n in result.notes:
            con.print(f"[dim]note: {escape(n)}[/dim]")
        con.print(f"race: {len(result.decisions)} of {len(spec.race.rungs)} rungs decided, {result.cells} cells, "
                  f"{len(result.failed)} failed; pick: {result.pick or '-'}; study: {result.study_dir}"
                  + ("  (next: `race validate` continues the pick's pilot to the target)" if result.finished else ""))
        if result.failed:
            raise typer.Exit(1)
        return
    for n in result.notes:
        con.print(f"[dim]note: {escape(n)}[/dim]")
    for c in result.refused:
        con.print(f"[red]refused[/red] {c.cell.run_id} " + escape(f"[{c.cell.label}]: {c.refusal}"))
    con.print(f"{result.complete}/{result.total} cells complete ({result.skipped_complete} were already), "
              f"{len(result.failed)} failed, {result.ran} attempts this session, {_fmt_s(result.elapsed_s)}; "
              f"study: {result.study_dir}")
    if result.failed:
        con.print("failed cells: " + ", ".join(result.failed) + "  (see `race grid status`)")
        raise typer.Exit(1)


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
