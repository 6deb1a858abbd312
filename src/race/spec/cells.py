"""Grid spec -> cells: the product of the axes (less ``exclude``) x budgets x seeds.

Expansion happens once per spec: :meth:`race.spec.grid.GridSpec.cells` keeps the result.
With ``nested: true`` only the largest budget's cells run, each with ``eval.at_budgets``
set to the smaller budgets: its prefixes stand for them (the store writes them as runs
that say so, ``race.grid.store``); a learning-rate schedule that decays is refused, since
then a prefix is not the shorter run. Order is budget-major (budgets as listed), then the axes' product (axes and values in
the order the file gives them), then seeds; small budgets first means a partial study
already covers every allocation at the cheap end. Each cell is a validated
:class:`~race.spec.run.RunConfig` with ``budget_flops`` and ``seed`` set; its id is
``RunConfig.run_id()`` (a hash of the resolved spec), so the same cell keeps its id across
calls, machines and edits of unrelated cells.

Each cell carries its allocation's name (``Cell.name``, :func:`name_cells`): the one string
the study's tables (the ``allocation`` column), the decisions and the report call the
allocation, fixed here over the whole grid so that no subset of its runs names it otherwise.
A racing grid's later rungs and target runs (``race.spec.ladder``) take their allocation's name
from these cells.
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from race.schema import OWN_COLUMN_AXES, allocation_name, axis_column, axis_value, optional_columns, varying_columns
from race.spec.errors import ConfigError, GridSpecError
from race.spec.race import same_budget
from race.spec.run import RunConfig, run_config_from_dict


class GridLike(Protocol):
    """What expansion reads of a grid spec (``race.spec.grid.GridSpec``)."""

    study: str
    budgets: list[float]
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    seeds: list[int]
    eval: dict[str, Any] | None
    engine: str | None

    @property
    def source(self) -> str: ...


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    index: int
    run_id: str
    config: RunConfig
    allocation: dict[str, Any] = field(default_factory=dict)  # axis path -> value
    extends: str | None = None  # racing: the shorter run of the same trajectory this one continues
    name: str = ""  # the allocation's name (race.schema.allocation_name over the whole grid: name_cells)

    @property
    def budget(self) -> float:
        return self.config.budget_flops

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def label(self) -> str:
        """``model=tiny-s num_generations=8`` (axis values only)."""
        return allocation_label(self.allocation)

    def spec_dict(self) -> dict[str, Any]:
        return self.config.model_dump(mode="json")


def allocation_values(cfg: RunConfig, allocation: dict[str, Any]) -> dict[str, Any]:
    """A cell's allocation columns as the study's runs table holds them (``race.schema``):
    the six of every allocation, ``lora_r``, ``engine``, and an ``axis_*`` column per axis
    without a column of its own."""
    values: dict[str, Any] = {
        "model": cfg.model, "num_generations": cfg.num_generations, "prompts_per_step": cfg.prompts_per_step,
        "num_iterations": cfg.num_iterations, "learning_rate": cfg.learning_rate, "reward": str(cfg.reward),
        "lora_r": cfg.lora.r if cfg.lora else None, "engine": cfg.engine}
    values.update({axis_column(p): axis_value(v) for p, v in allocation.items() if p not in OWN_COLUMN_AXES})
    return values


def name_cells(cells: list[Cell]) -> list[Cell]:
    """``cells`` (a whole grid's) with their allocation's name: the six allocation columns,
    then each optional column (``lora_r``, ``engine``, ``axis_*``) whose value differs between
    the grid's cells (``race.schema.allocation_name``, ``varying_columns``)."""
    rows = [allocation_values(c.config, c.allocation) for c in cells]
    extras = varying_columns(rows, optional_columns(list(dict.fromkeys(k for r in rows for k in r))))
    named = [replace(c, name=allocation_name(r, extras)) for c, r in zip(cells, rows)]
    label_of: dict[str, str] = {}
    for c in named:
        if label_of.setdefault(c.name, c.label) != c.label:
            raise GridSpecError(f"cells [{label_of[c.name]}] and [{c.label}] are one allocation ({c.name}): two axis "
                                "values resolve to the same settings; remove one of them")
    return named


def allocation_label(allocation: dict[str, Any]) -> str:
    parts = []
    for k, v in allocation.items():
        parts.append(f"{k}={v if isinstance(v, (str, int, float)) else json.dumps(v, sort_keys=True)}")
    return " ".join(parts) or "(base)"


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    node = data
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}  # e.g. lora: null in base and an axis on lora.r turns LoRA on
        node = node[k]
    node[keys[-1]] = copy.deepcopy(value)


def check_exclude(axes: dict[str, list[Any]], exclude: list[dict[str, Any]]) -> None:
    """Raise ValueError unless every ``exclude[i].<axis>`` names an axis and only its values
    (a value, or a list of them)."""
    for i, entry in enumerate(exclude):
        if not entry:
            raise ValueError(f"exclude[{i}] is empty: name axis values, e.g. {{num_iterations: 4}}")
        for axis, value in entry.items():
            if axis not in axes:
                raise ValueError(f"exclude[{i}].{axis}: not an axis of this grid (axes: {sorted(axes)})")
            known = {json.dumps(v, sort_keys=True) for v in axes[axis]}
            named = [value] if json.dumps(value, sort_keys=True) in known or not isinstance(value, list) else value
            bad = [v for v in named if json.dumps(v, sort_keys=True) not in known]
            if bad:
                raise ValueError(f"exclude[{i}].{axis}: {bad} not among the axis's values {axes[axis]}")


def excluded(spec: GridLike, allocation: dict[str, Any]) -> bool:
    """Whether an entry of the grid's ``exclude`` matches ``allocation`` on every axis it names
    (an entry's value matches the axis value it equals, or a list matches any value it holds)."""
    def hit(want: Any, have: Any) -> bool:
        key = json.dumps(have, sort_keys=True)
        return json.dumps(want, sort_keys=True) == key or (
            isinstance(want, list) and any(json.dumps(w, sort_keys=True) == key for w in want))
    return any(all(hit(v, allocation[k]) for k, v in entry.items()) for entry in getattr(spec, "exclude", []) or [])


def cell_data(spec: GridLike, allocation: dict[str, Any], budget: float, seed: int,
              at_budgets: list[float] | None = None) -> dict[str, Any]:
    """The RunConfig dict of one cell (before validation); ``at_budgets``: the smaller
    budgets a nested cell stands for."""
    data = copy.deepcopy(spec.base)
    data.setdefault("name", spec.study)
    if spec.engine is not None:
        data["engine"] = spec.engine
    if spec.eval:
        ev = data.get("eval") if isinstance(data.get("eval"), dict) else {}
        data["eval"] = {**ev, **copy.deepcopy(spec.eval)}
    for path, value in allocation.items():
        _set_path(data, path, value)
    set_by: dict[str, str] = {}
    for axis, value in allocation.items():
        for path, v in _leaves(getattr(spec, "overrides", {}).get(axis, {}).get(str(value), {})):
            if path in set_by:
                raise GridSpecError(f"overrides.{axis}.{value}.{path} and {set_by[path]} both set {path} for the "
                                    f"cell [{allocation_label(allocation)}]: set it in one place")
            set_by[path] = f"overrides.{axis}.{value}.{path}"
            _set_path(data, path, copy.deepcopy(v))
    if isinstance(data.get("eval"), dict) and data["eval"].get("at_budgets"):
        raise GridSpecError("eval.at_budgets is set by the grid (nested: true), not in the grid file: remove it "
                            "and set nested: true to read the largest budget's runs at the smaller budgets")
    if at_budgets:
        data["eval"] = {**(data.get("eval") or {}), "at_budgets": [float(b) for b in at_budgets]}
    data["budget_flops"] = float(budget)
    data["seed"] = int(seed)
    return data


def nested_budgets(spec: GridLike) -> tuple[list[float], list[float]]:
    """``(budgets run, budgets read at prefixes)``: all and none, or with ``nested: true``
    the largest and the smaller ones (ascending); with ``protocol: race`` the first rung and
    the budgets below it (its nested reads)."""
    race = getattr(spec, "race", None)
    if getattr(spec, "protocol", "flat") == "race" and race is not None:
        # rungs: auto has no first rung until the study's schedule: its allocations' cells are expanded at T
        # (for their configs and names; the ladder builds each rung's cells at the schedule's budgets)
        first = race.rung_budgets()[0] if race.explicit else race.target_budget
        return [first], sorted(b for b in spec.budgets if b < first and not same_budget(b, first))
    if not getattr(spec, "nested", False):
        return list(spec.budgets), []
    top = max(spec.budgets)
    return [top], sorted(b for b in spec.budgets if b < top)


#: The engines whose runs stand for smaller budgets at their prefixes and extend into larger ones.
PREFIX_ENGINES = ("builtin", "trl")


def prefix_refusal(cfg: RunConfig, *, racing: bool = False) -> str | None:
    """Why ``cfg``'s run would not pass through the runs of smaller budgets (a nested cell's
    prefixes) or, ``racing``, could not be extended into the next rung's run (or the target
    run) and stay identical to a fresh run of that budget; None when it can."""
    undo = "protocol: flat" if racing else "nested: false to run every budget"
    if cfg.lr_scheduler_type != "constant":
        why = ("a rung's run is not the start of the next rung's (that one anneals later)" if racing else
               "a prefix of the largest budget's run is not a run of a smaller budget (that one anneals sooner)")
        return (f"lr_scheduler_type={cfg.lr_scheduler_type!r} decays over the steps the run's own budget buys, so "
                f"{why}: set lr_scheduler_type: constant (warmup_steps are fine), or {undo}")
    if cfg.engine not in PREFIX_ENGINES:
        return (f"engine={cfg.engine!r}: prefixes at smaller budgets (eval.at_budgets) and extensions to larger ones "
                f"are implemented by the {' and '.join(PREFIX_ENGINES)} engines only: set engine: builtin, or {undo}")
    mu = cfg.num_iterations * cfg.optimizer_steps_per_generation
    if racing and cfg.engine == "trl" and mu > 1:
        return (f"engine: trl trains each generation in num_iterations x steps_per_generation / "
                f"gradient_accumulation_steps = {mu} optimizer steps, and a TRL checkpoint taken between them does not "
                "keep the generation (a resumed trainer generates anew), so a run extended from a rung that stopped "
                "inside a generation would not be the fresh run: set num_iterations: 1 and steps_per_generation equal "
                f"to gradient_accumulation_steps (or leave it unset), engine: builtin, or {undo}")
    if racing and cfg.eval.every_flops is None and cfg.eval.num_points != 1:
        return (f"eval.num_points={cfg.eval.num_points} spaces evaluations by each run's own budget, so an extended "
                "run would be evaluated where a fresh run of its budget is not: set eval.num_points: 1 (step 0, "
                "every read and rung budget, the end) or eval.every_flops (the same spacing at every rung)")
    return None


def trajectory_key(cfg: RunConfig) -> str | None:
    """The id of the trajectory ``cfg``'s run follows: its run id with the budget and the
    evaluation settings left out (evaluation samples from its own generator and leaves the
    policy as it found it: tests/engines/test_extend.py), so the runs of one allocation and seed
    at any budget share it, and a shorter run is a prefix of a longer one (racing extends one
    into the other, a pilot evaluating fewer targets than the target run that continues it);
    ``None`` where the budget shapes the run (a decaying learning rate)."""
    if cfg.lr_scheduler_type != "constant":
        return None
    return cfg.model_copy(update={"budget_flops": 1.0, "eval": type(cfg.eval)()}).run_id()


def _leaves(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        out.extend(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)])
    return out


def expand_cells(spec: GridLike) -> list[Cell]:
    """Expand ``spec`` into validated cells (``GridSpec.cells`` calls this once)."""
    names = list(spec.axes)
    combos = [c for c in itertools.product(*(spec.axes[n] for n in names)) if not excluded(spec, dict(zip(names, c)))]
    if names and not combos:
        raise GridSpecError(f"grid spec ({spec.source}): exclude leaves out every combination of the axes: "
                            "remove an entry or add axis values")
    combos = combos or [()]
    cells: list[Cell] = []
    errors: list[str] = []
    seen: dict[str, Cell] = {}
    run_budgets, prefixes = nested_budgets(spec)
    for budget in run_budgets:
        for combo in combos:
            allocation = dict(zip(names, combo))
            for seed in spec.seeds:
                data = cell_data(spec, allocation, budget, seed, prefixes)
                where = f"cell [{allocation_label(allocation)} budget={budget:.3g} seed={seed}]"
                try:
                    cfg = run_config_from_dict(data, source=where)
                except ConfigError as e:
                    errors.append(str(e))
                    continue
                racing = getattr(spec, "protocol", "flat") == "race"
                why = prefix_refusal(cfg, racing=racing) if racing or prefixes else None
                if why:
                    errors.append(f"{where}: {'protocol: race' if racing else 'nested: true'}, but {why}")
                    continue
                rid = cfg.run_id()
                if rid in seen:
                    raise GridSpecError(
                        f"{where} and cell [{seen[rid].label} seed={seen[rid].seed}] expand to the same run "
                        f"(id {rid}): two axis values resolve to one setting; remove one of them"
                    )
                cell = Cell(index=len(cells), run_id=rid, config=cfg, allocation=allocation)
                seen[rid] = cell
                cells.append(cell)
    if errors:
        more = f"\n  ... and {len(errors) - 3} more invalid cells" if len(errors) > 3 else ""
        raise GridSpecError(
            f"grid spec ({spec.source}): {len(errors)} cell(s) are not valid runs; change base: or the axis "
            "values named below\n" + "\n".join(errors[:3]) + more
        )
    return name_cells(cells)
