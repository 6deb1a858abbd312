"""The `race` command: the app, its version, and the commands and sub-apps registered from
their modules (``race flops`` and ``race plan``: :mod:`race.cli.plan_cmds`; training:
:mod:`race.cli.run_cmds`; ...). Each command is a few lines over a library call; heavy
imports happen inside the commands so `race --help` and `race flops` start fast."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

app = typer.Typer(
    name="race",
    help="RACE: compute-accounted RL post-training. Account every FLOP of a GRPO step, train under a FLOP "
    "budget, compare allocations at equal FLOPs, and recommend one.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def package_version() -> str:
    """The installed package's version (``race-rl``'s metadata), else the source tree's
    (``race.__version__``: running from a checkout that is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("race-rl")
    except metadata.PackageNotFoundError:  # the package ``race`` is loaded before any module of it
        return str(sys.modules["race"].__version__)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"race {package_version()}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """RACE: compute-accounted RL post-training. Account every FLOP of a GRPO step, train under a FLOP budget,
    compare allocations at equal FLOPs, and recommend one."""


def _register_subapps() -> None:
    """Sub-apps live in their own modules; each imports only typer at module level. They
    are part of the CLI: an ImportError here is a bug to see, not a command to hide."""
    from race.cli import base, card, grid, import_cmd, plan_cmds, replay_cmd, rm, run_cmds, study_cmds

    plan_cmds.register(app)
    for sub, name in ((base, "base"), (rm, "rm"), (grid, "grid")):
        app.add_typer(sub.app, name=name)
    run_cmds.register(app)
    study_cmds.register(app)
    card.register(app)
    import_cmd.register(app)
    replay_cmd.register(app)


_register_subapps()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
