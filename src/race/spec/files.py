"""Which file is this? A run file given where a grid file belongs, or the reverse, is named
as such before the field-by-field checks (``race.spec.grid.file_kind`` reads the top-level
keys); the grid loader does the same for a run file (``race.spec.grid.grid_spec_from_dict``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from race.spec.errors import ConfigError, some_keys
from race.spec.grid import GRID_ONLY, file_kind
from race.spec.run import RunConfig, load_run_config, load_yaml


def load_run_file(path: str | Path, overrides: list[str] | None = None,
                  values: dict[str, Any] | None = None) -> RunConfig:
    """:func:`race.spec.run.load_run_config` of a run file; a grid file is refused naming
    the commands that take it."""
    data = load_yaml(path)
    if file_kind(data) == "grid":
        raise ConfigError(f"{path}: this is a grid file (it has {some_keys(set(data) & GRID_ONLY)}): run it with "
                          f"`race grid plan {path}` and `race grid run {path}`; `race train` takes a run file, one "
                          "run's settings (e.g. configs/tiny-rule.yaml)")
    return load_run_config(path, overrides, values=values)


__all__ = ["load_run_file"]
