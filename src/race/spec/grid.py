"""The grid file: a pilot study as data.

A grid file names a study, the FLOP budgets, the settings every cell shares (``base``),
the axes to sweep (RunConfig field paths -> lists of values) and the seeds; the grid
expands to ``axes x budgets x seeds`` runs, less the axis combinations ``exclude`` lists
(:mod:`race.spec.cells`), once, when it is validated. It also says how to run them
(``runner``), how often to retry a failing cell, and which function runs a cell
(``cell_fn``, default the RACE engine).

```yaml
study: demo
budgets: [3e11, 1e12, 3e12]
base: {task: {name: arith}, eval: {n_problems: 200}}
axes:
  model: [tiny-xs, tiny-s, tiny-m]
  num_generations: [4, 8]
overrides:                     # settings that follow an axis value (here: a learning rate per size)
  model: {tiny-m: {learning_rate: 3.0e-4}}
exclude:                       # combinations of axis values left out of the product (a value or a list: any of)
  - {model: tiny-xs, num_generations: 8}
seeds: [0, 1]
runner: {kind: local, workers: 2, threads_per_worker: 1}
gang: false                    # true: LoRA cells of one base model train together (race.grid.gangs)
nested: false                  # true: one run per allocation and seed at the largest budget, read at its prefixes
report: {count_rm_training: false}   # true: the report card counts the RMs' training FLOPs
protocol: flat                 # race: rungs toward a target budget (race: ..., race.spec.race)
```

Files load with ``yaml.safe_load``; every error names the field and what to change.

Kept whole (about 440 lines): GridSpec is one validated type; its loaders are the few functions
beside it (the cells it expands to: :mod:`race.spec.cells`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from race.accounting.guard import is_budget
from race.accounting.errors import did_you_mean
from race.spec.errors import SETTING_ALIASES, GridSpecError, format_errors, load_yaml_mapping, some_keys, submodel, \
    unknown_setting
from race.spec.cells import Cell, check_exclude, expand_cells
from race.spec.race import RaceSettings, race_budgets
from race.spec.run import RunConfig

if TYPE_CHECKING:
    from race.spec.ladder import Ladder
    from race.spec.rungs import RungSchedule

DEFAULT_CELL_FN = "race.engines:run_engine"
MIN_PILOT_SPAN = 10.0

#: Run settings the grid owns (setting -> where the grid sets it): budgets and seeds have
#: their own keys; output_dir is the run directory the grid assigns.
GRID_OWNED = {"budget_flops": "budgets", "seed": "seeds", "output_dir": "the study directory"}


class RunnerSettings(BaseModel):
    """How cells are executed. ``local``: a process pool of ``workers`` processes with
    ``threads_per_worker`` torch/BLAS threads each (2 x 1 on a 2-core machine).
    ``ray``: Ray tasks with ``cpus_per_cell``/``gpus_per_cell`` resources on ``ray_address``
    (an existing cluster) or a local Ray started for the run. With ``gang: true`` a gang is
    one unit of work (one local worker task or one Ray task), so ``workers``,
    ``cpus_per_cell`` and ``gpus_per_cell`` count gangs, not their members."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "ray"] = "local"
    workers: int | None = Field(None, ge=1, description="cells in flight; local default one per CUDA device when "
                                "there are any (one cell per GPU), else 2; ray default what the cluster's CPUs (and, with "
                                "gpus_per_cell, GPUs) hold")
    threads_per_worker: int = Field(1, ge=1)
    ray_address: str | None = None
    cpus_per_cell: float = Field(1.0, gt=0, description="Ray CPUs per cell (per gang with gang: true)")
    gpus_per_cell: float = Field(0.0, ge=0, description="Ray GPUs per cell (per gang with gang: true)")
    max_cells_per_worker: int | None = Field(None, ge=1, description="recycle a local worker process after this many cells")
    preload_torch: bool = Field(True, description="import torch in each worker to set its thread count up front")
    order: Literal["longest_first", "grid"] = Field(
        "longest_first", description="longest_first: cells by predicted wall time, longest first (the grid ends "
        "sooner: no long cell starts last with the other workers idle); grid: the grid file's order")

    def resolved_workers(self) -> int:
        """``workers``, else 2: the default without GPUs (``race.grid.local.default_workers``
        gives one per GPU where there are any; this layer does not look for them)."""
        return self.workers if self.workers is not None else 2


class ReportSettings(BaseModel):
    """How ``race report`` reads the study (its CLI flags override these).
    ``count_rm_training``: count the FLOPs that trained the study's reward models in the
    report card's total and budget (default false: a separate, labelled line)."""

    model_config = ConfigDict(extra="forbid")

    count_rm_training: bool = Field(False, description="count the reward models' training FLOPs in the report "
                                    "card's total (false: a separate line, outside the pilot budget)")


class GridSpec(BaseModel):
    """A validated grid file. Use :func:`load_grid_spec` or :func:`grid_spec_from_dict`."""

    model_config = ConfigDict(extra="forbid")

    study: str
    budgets: list[float] = Field(default_factory=list, description="the FLOP budgets of the pilots (protocol: "
                                 "race: the first rung's nested reads; the rungs are added)")
    require_budget_span: bool = True
    base: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    overrides: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict, description="axis -> axis value -> run settings for the cells with that value, "
        "e.g. {model: {tiny-m: {learning_rate: 3e-4}}} (a learning rate per size)")
    exclude: list[dict[str, Any]] = Field(
        default_factory=list, description="axis combinations left out of the product: each entry maps axes to a "
        "value or a list of values (any of them), e.g. [{num_update_generations: [2, 4], num_iterations: 4}]; a "
        "combination matching every axis of an entry is left out (a path through the axes instead of their product)")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    eval: dict[str, Any] | None = None
    engine: Literal["builtin", "trl"] | None = None
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    max_retries: int = Field(2, ge=0, description="extra attempts for a failing cell before it is marked failed")
    min_steps: int = Field(1, ge=0, description="plan refuses cells whose budget buys fewer optimizer steps")
    cell_fn: str = DEFAULT_CELL_FN
    gang: bool = Field(False, description="train the LoRA cells of one base model, task and maximum lengths "
                       "together, gangs of at most gang_size per worker (race.grid.gangs); false: every cell alone")
    gang_size: int = Field(8, ge=1, description="most members of one gang (gang: true)")
    nested: bool = Field(False, description="true: one run per allocation and seed at the largest budget, "
                         "evaluated where a run of each smaller budget would stop; its prefixes stand for those "
                         "budgets (constant learning rate only; docs/analysis.md)")
    report: ReportSettings = Field(default_factory=ReportSettings)
    protocol: Literal["flat", "race"] = Field("flat", description="flat: every cell of the grid; race: rungs toward "
                                              "race.target_budget, the racing rule deciding who goes on (race.spec.race)")
    race: RaceSettings | None = None

    _source: str = PrivateAttr("dict")
    _cells: Any = PrivateAttr(None)
    _ladder: Any = PrivateAttr(None)

    # -- field checks ------------------------------------------------------------------
    @field_validator("study")
    @classmethod
    def _study(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError(f"study={v!r}: use letters, digits, '.', '_' or '-' (it names the study directory)")
        return v

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, v: list[float]) -> list[float]:
        bad = [b for b in v if not is_budget(b)]
        if bad:
            raise ValueError(f"budgets must be positive FLOP counts, got {bad}")
        if len(set(v)) != len(v):
            raise ValueError(f"budgets has duplicates {v}: list each budget once")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"seeds has duplicates {v}: list each seed once")
        return v

    @field_validator("runner", mode="before")
    @classmethod
    def _runner_shorthand(cls, v: Any) -> Any:
        return {"kind": v} if isinstance(v, str) else v

    @field_validator("eval", mode="before")
    @classmethod
    def _eval_shorthand(cls, v: Any) -> Any:
        return {"targets": v} if isinstance(v, list) else v

    @field_validator("axes", mode="before")
    @classmethod
    def _axes_lists(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        for key, values in v.items():
            if not isinstance(values, list):
                raise ValueError(f"axes.{key} must be a list of values, e.g. {key}: [{values!r}, ...]")
        return v

    @field_validator("axes")
    @classmethod
    def _axes(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            _check_field_path(key, where="axes")
            if not values:
                raise ValueError(f"axes.{key} is empty: give at least one value or remove the axis")
            blobs = [json.dumps(x, sort_keys=True) for x in values]
            if len(set(blobs)) != len(blobs):
                raise ValueError(f"axes.{key} has duplicate values {values}: list each value once")
        return v

    @field_validator("base")
    @classmethod
    def _base(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            _check_field_path(key, where="base")
        return v

    @field_validator("cell_fn")
    @classmethod
    def _cell_fn(cls, v: str) -> str:
        if ":" not in v or not v.split(":", 1)[0] or not v.rsplit(":", 1)[1].isidentifier():
            raise ValueError(f"cell_fn={v!r}: write 'package.module:function' or 'path/to/file.py:function'")
        return v

    @model_validator(mode="after")
    def _span(self) -> "GridSpec":
        if self.protocol == "race":
            if self.race is None:
                raise ValueError("protocol: race needs a race: section (target_budget, rungs; race.spec.race)")
            self.budgets = race_budgets(self.race, self.budgets, self.seeds, self.gang)
        elif self.race is not None:
            raise ValueError("race: settings belong to protocol: race; add protocol: race or drop race:")
        if self.racing and not self.race.explicit:
            return self  # rungs: auto: budgets lists only the first rung's nested reads (none is fine)
        if not self.budgets:
            raise ValueError("budgets is empty: list the pilot budgets in FLOPs, e.g. budgets: [3e11, 1e12, 3e12]")
        lo, hi = min(self.budgets), max(self.budgets)
        if self.require_budget_span and hi / lo < MIN_PILOT_SPAN:
            raise ValueError(
                f"budgets span only {hi / lo:.3g}x ({lo:.3g} .. {hi:.3g} FLOPs): a pilot grid needs budgets "
                f"spanning at least {MIN_PILOT_SPAN:g}x to see how the best allocation moves with budget; add a "
                f"budget of {lo * MIN_PILOT_SPAN:.3g} or more, or set require_budget_span: false for a study "
                "that is not a pilot grid"
            )
        overlap = set(self.axes) & {k for k in _flatten_keys(self.base)}
        if overlap:
            raise ValueError(f"{sorted(overlap)} set in both base and axes: keep each setting in one place")
        self._check_overrides()
        check_exclude(self.axes, self.exclude)
        if self.gang and self.cell_fn != DEFAULT_CELL_FN:
            raise ValueError(f"gang: true trains with RACE's built-in engine, not cell_fn={self.cell_fn!r}: "
                             "set gang: false or drop cell_fn")
        if self.nested and len(self.budgets) < 2:
            raise ValueError("nested: true reads the largest budget's runs at the smaller budgets: list at least "
                             "two budgets, or set nested: false")
        return self

    def _check_overrides(self) -> None:
        """``overrides.<axis>.<value>.<setting>``: the axis is swept, the value is one of
        its values, the setting is a run setting that no axis sweeps."""
        for axis, by_value in self.overrides.items():
            if axis not in self.axes:
                raise ValueError(f"overrides.{axis}: not an axis of this grid (axes: {sorted(self.axes)})")
            values = {str(v) for v in self.axes[axis]}
            for value, settings in by_value.items():
                if str(value) not in values:
                    raise ValueError(f"overrides.{axis}.{value}: not a value of axis {axis} ({sorted(values)})")
                if not isinstance(settings, dict) or not settings:
                    raise ValueError(f"overrides.{axis}.{value}: give run settings, e.g. {{learning_rate: 3e-4}}")
                for path in _flatten_leaf_keys(settings):
                    _check_field_path(path, where=f"overrides.{axis}.{value}")
                    if path in self.axes:
                        raise ValueError(f"overrides.{axis}.{value}.{path}: {path} is an axis; an override may "
                                         "only set what no axis sweeps")

    # -- helpers -----------------------------------------------------------------------
    @property
    def source(self) -> str:
        return self._source

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if not name.startswith("_"):
            super().__setattr__("_cells", None)  # a changed setting: expand again when asked
            super().__setattr__("_ladder", None)

    @property
    def racing(self) -> bool:
        return self.protocol == "race"

    def cells(self) -> list[Cell]:
        """Every cell of the grid (expanded once, when the spec was validated); with
        ``protocol: race``, the first rung's (:meth:`ladder` gives the others)."""
        if self._cells is None:
            self._cells = expand_cells(self)
        return list(self._cells)

    def primary_target(self) -> str:
        """The study's primary evaluation target: its cells' first (the grid's ``eval:`` over
        its ``base.eval``, as the cells merge them)."""
        return str(self.cells()[0].config.eval.targets[0])

    def ladder(self, schedule: "RungSchedule | None" = None) -> "Ladder":
        """A racing grid's ladder (``race.spec.ladder``: the cells of every rung and of the
        target run) under the study's ``schedule`` (``race.spec.rungs.RungSchedule``); without
        one, the grid's listed rungs (built once and kept)."""
        from race.spec.ladder import Ladder

        if schedule is not None:
            return Ladder(self, schedule)
        if self._ladder is None:
            self._ladder = Ladder(self)
        return self._ladder

    def with_settings(self, **changes: Any) -> "GridSpec":
        """A copy with grid settings changed (e.g. ``nested=False``): same source, its cells
        expanded again when asked (they may depend on the settings)."""
        new = self.model_copy(update=changes)
        new._source, new._cells, new._ladder = self._source, None, None
        return new

    def with_runner(self, **changes: Any) -> "GridSpec":
        """A copy with runner settings changed (None values are ignored); the cells do not
        depend on the runner, so the copy keeps them."""
        data = self.runner.model_dump()
        data.update({k: v for k, v in changes.items() if v is not None})
        new = self.model_copy(update={"runner": RunnerSettings.model_validate(data)})
        new._source, new._cells, new._ladder = self._source, self._cells, None
        return new


def _flatten_keys(d: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        path = f"{prefix}{k}"
        out.append(path)
        if isinstance(v, dict):
            out.extend(_flatten_keys(v, path + "."))
    return out


def _flatten_leaf_keys(d: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        path = f"{prefix}{k}"
        out.extend(_flatten_leaf_keys(v, path + ".") if isinstance(v, dict) else [path])
    return out


def _check_field_path(path: str, where: str) -> None:
    """Raise ValueError unless ``path`` (dotted) names a RunConfig field."""
    parts = path.split(".")
    if parts[0] in GRID_OWNED:
        raise ValueError(f"{where}.{path}: the grid sets {parts[0]} itself; use the grid's {GRID_OWNED[parts[0]]} instead")
    model: type[BaseModel] | None = RunConfig
    for i, part in enumerate(parts):
        if model is None:
            raise ValueError(f"{where}.{path}: {'.'.join(parts[:i])} is not a section with sub-fields")
        fields = model.model_fields
        if part not in fields:
            raise ValueError(
                f"{where}.{path}: unknown run setting {part!r}"
                + (f" in {'.'.join(parts[:i])}" if i else "")
                + (did_you_mean(part, fields, SETTING_ALIASES) or f"; choose from {sorted(fields)}")
            )
        model = submodel(fields[part].annotation)


def _unknown_grid_key(loc: tuple[Any, ...]) -> str:
    if len(loc) != 1:
        return unknown_setting(GridSpec, loc, "setting")
    if loc[0] in RunConfig.model_fields:
        return (f"unknown grid setting; run settings such as {loc[0]!r} go under base: or axes: (grid keys are "
                + ", ".join(sorted(GridSpec.model_fields)) + ")")
    return (f"unknown grid setting{did_you_mean(str(loc[0]), GridSpec.model_fields, SETTING_ALIASES)}; grid keys are "
            + ", ".join(sorted(GridSpec.model_fields)))


#: Top-level keys only a grid file has (a run file has none of them).
GRID_ONLY = frozenset(GridSpec.model_fields) - frozenset(RunConfig.model_fields)
#: Top-level keys only a run file has (a grid file puts them under base: or axes:).
RUN_ONLY = frozenset(RunConfig.model_fields) - frozenset(GridSpec.model_fields)


def file_kind(data: Any) -> str | None:
    """``"grid"`` or ``"run"`` when a mapping's top-level keys say which file it is (some
    only one kind has, none only the other has), else None; read before the field checks."""
    if not isinstance(data, dict):
        return None
    keys = set(data)
    grid, run = keys & GRID_ONLY, keys & RUN_ONLY
    return "grid" if grid and not run else "run" if run and not grid else None


def _resolve_cell_fn(cell_fn: str, base_dir: Path | None) -> str:
    """Make a relative ``file.py:function`` path absolute (grid file's folder, then cwd)."""
    target, func = cell_fn.rsplit(":", 1)
    if not target.endswith(".py") or Path(target).is_absolute():
        return cell_fn
    for root in ([base_dir] if base_dir else []) + [Path.cwd()]:
        cand = (root / target).resolve()
        if cand.exists():
            return f"{cand}:{func}"
    raise GridSpecError(f"cell_fn={cell_fn!r}: file {target} not found next to the grid file or in {Path.cwd()}")


def grid_spec_from_dict(data: dict[str, Any], source: str = "dict", base_dir: Path | None = None) -> GridSpec:
    """Validate a grid spec and check that every cell expands to a valid RunConfig."""
    if not isinstance(data, dict):
        raise GridSpecError(f"{source}: the top level must be a mapping of grid settings, got {type(data).__name__}")
    if file_kind(data) == "run":
        run_keys = some_keys(set(data) & RUN_ONLY)
        raise GridSpecError(f"{source}: this is a run file (it has {run_keys}; a grid file has study, budgets and "
                            f"axes): train it with `race train {source}`; `race grid` takes a grid file (e.g. "
                            "configs/grid-demo.yaml, docs/design.md)")
    try:
        spec = GridSpec.model_validate(data)
    except ValidationError as e:
        raise GridSpecError(format_errors(e, f"invalid grid spec ({source}):", _unknown_grid_key)) from None
    spec.cell_fn = _resolve_cell_fn(spec.cell_fn, base_dir)
    spec._source = source
    cells = spec.cells()  # validates every cell; the spec keeps them
    if spec.racing and spec.race.pilot_targets:
        extra = sorted(set(spec.race.pilot_targets) - set(cells[0].config.eval.targets if cells else []))
        if extra:
            raise GridSpecError(f"{source}: race.pilot_targets {extra} are not among eval.targets "
                                f"{cells[0].config.eval.targets}: the pilots evaluate some of the grid's targets")
    if spec.racing and spec.race.explicit:  # and every later rung's, before anything runs
        ladder = spec.ladder()
        for rung in range(1, ladder.rungs):
            ladder.cells(rung)
    return spec


def load_grid_spec(path: str | Path) -> GridSpec:
    """Load a grid file (YAML, ``yaml.safe_load``) and validate it."""
    p = Path(path)
    data = load_yaml_mapping(p, GridSpecError, "grid file")
    return grid_spec_from_dict(data, source=str(p), base_dir=p.resolve().parent)


def expand_grid(spec: GridSpec) -> list[Cell]:
    """All cells of the grid, validated, with stable distinct ids (expanded once per spec)."""
    return spec.cells()


def as_grid_spec(spec: "GridSpec | dict[str, Any] | str | Path") -> GridSpec:
    """A validated ``GridSpec`` from a spec, a dict or a grid file path."""
    if isinstance(spec, GridSpec):
        return spec
    if isinstance(spec, dict):
        return grid_spec_from_dict(spec)
    return load_grid_spec(spec)
