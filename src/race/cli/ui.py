"""What the commands share: the one-line error exit and a progress bar per build."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import typer


def fail(msg: str, code: int = 2) -> NoReturn:
    """Print ``error: msg`` (one line for one problem) to stderr and exit with ``code``."""
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def cell_events(echo: Callable[[str], Any]) -> Callable[[Any], None]:
    """A grid ``on_event`` that prints finished, failed and retried cells, one line each."""
    def on_event(ev: Any) -> None:
        if ev.kind in ("complete", "failed", "retry"):
            echo(f"  {ev.kind} {ev.run_id} [{ev.label}]" + (f": {ev.message}" if ev.message else ""))
    return on_event


def one_line(text: str) -> str:
    """A multi-line validation message as one line (``title a; b; c``)."""
    lines = [ln.strip().removeprefix("- ") for ln in str(text).splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return lines[0] + " " + "; ".join(lines[1:])
    return "; ".join(lines)


def build_with_bars(console: Any, items: Sequence[tuple[str, int, Callable[[Callable[[int, int, float], None]], Any]]],
                    threads: int | None = None) -> list[Any]:
    """Run ``(name, steps, build)`` items one after another under a rich progress bar each
    (``build(progress)`` returns an info with ``reused``), with ``threads`` torch threads
    when given; returns the infos. Shared by ``race base build`` and ``race rm build``."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    infos = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=console) as bar:
        for name, steps, build in items:
            task_id = bar.add_task(name, total=steps, loss="-")

            def cb(step: int, total: int, loss: float, _t: Any = task_id) -> None:
                if step % 10 == 0 or step == total:
                    bar.update(_t, completed=step, loss=f"{loss:.3f}")

            info = build(cb)
            bar.update(task_id, completed=steps, description=f"{name} ({'cached' if info.reused else 'built'})")
            infos.append(info)
    return infos
