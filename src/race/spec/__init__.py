"""The ground floor: every user-facing concept parsed once into a typed object.

    run.py      the run file -> RunConfig (TRL's and PEFT's names), --set overrides
    grid.py     the grid file -> GridSpec (validated, expanded once)
    cells.py    GridSpec -> cells (a RunConfig each, stable run ids, each allocation's one name)
    ladder.py   a racing GridSpec -> the cells of each rung and of the target run (GridSpec.ladder)
    race.py     the racing settings (protocol: race): target budget, rungs, later seeds, rule overrides
    reward.py   the reward-spec grammar -> RewardSpec
    flops.py    the ``race flops`` query -> FlopsQuery
    errors.py   ConfigError / GridSpecError, the one pydantic error formatter, the one YAML loader

Standard library, pydantic and PyYAML (``safe_load``) only; the domain packages turn these
objects into shapes, reward systems and runs.
"""

from race.spec.cells import Cell, allocation_label
from race.spec.errors import ConfigError, GridSpecError
from race.spec.grid import DEFAULT_CELL_FN, GRID_OWNED, GridSpec, RunnerSettings, expand_grid, grid_spec_from_dict, load_grid_spec
from race.spec.reward import RewardSpec, parse_reward
from race.spec.run import EvalSettings, LoraSettings, RunConfig, TaskSettings, load_run_config, run_config_from_dict

__all__ = [
    "Cell", "ConfigError", "DEFAULT_CELL_FN", "EvalSettings", "GRID_OWNED", "GridSpec", "GridSpecError", "LoraSettings",
    "RewardSpec", "RunConfig", "RunnerSettings", "TaskSettings", "allocation_label", "expand_grid", "grid_spec_from_dict",
    "load_grid_spec", "load_run_config", "parse_reward", "run_config_from_dict",
]
