"""Input tables of the analysis: their checks and the allocation key.

Three tables feed every analysis function (one row each), in the layout of
``race.schema`` (the one home of the columns, which the grid writes; re-exported here):

- ``runs``: one row per pilot run (see :data:`RUNS_COLUMNS`; ``model_params`` counts all
  parameters, embeddings included).
- ``evals``: one row per (run_id, evaluation point, target) (see :data:`EVALS_COLUMNS`).
- ``train``: optional per-step training log (see :data:`TRAIN_COLUMNS`).

An *allocation* is everything that describes how a run spends its budget except the
budget itself and the seed: ``(model, num_generations, prompts_per_step, num_iterations,
learning_rate, reward)``, plus the optional allocation columns (``lora_r``, ``engine``,
``axis_*``: a grid's other axes) that tell it from the grid's other allocations. Its name,
one readable string, is the identifier every other module uses: the ``allocation`` column
of a study's runs table, fixed when the grid expanded (``race.spec.cells.name_cells``) and
read as it is (:func:`prepare_runs`); a table passed in by hand without that column gets it
from :func:`allocation_key`, row by row. Both write it with ``race.schema.allocation_name``.

A *reward system* is the kind of the parsed reward spec (``race.spec.reward``, the one
parser: ``"prm:prm-s"`` -> ``"prm"``; the grid writes it as the ``reward_system``
column), so that a frontier "conditioned on the reward system" can still compare reward
models of one system (the feedback axis).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from race.accounting.guard import is_budget
from race.schema import (  # the tables' layout has one home; re-exported here for the analysis API
    ALLOCATION_COLUMNS,
    AXIS_PREFIX,
    EVALS_COLUMNS,
    EVALS_OPTIONAL,
    OPTIONAL_ALLOCATION_COLUMNS,
    REWARD_COLUMNS,
    RUNS_COLUMNS,
    RUNS_CORE,
    RUNS_OPTIONAL,
    TRAIN_COLUMNS,
    allocation_name,
    optional_columns,
)

#: The run columns the analysis carries beside a run's scores (curves, end points, the study
#: matrix): ``race.schema``'s, with ``allocation`` and ``reward_system`` as :func:`prepare_runs` adds them.
RUN_KEYS = ("run_id", "budget", "seed", "allocation", "reward_system", "model_params", *ALLOCATION_COLUMNS)


class SchemaError(ValueError):
    """A table lacks columns (or holds values) the analysis needs."""


def require_columns(df: pd.DataFrame, columns: Iterable[str], table: str) -> None:
    """Raise :class:`SchemaError` naming every column of ``columns`` missing from ``df``."""
    if not isinstance(df, pd.DataFrame):
        raise SchemaError(f"{table} must be a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise SchemaError(
            f"{table} table is missing column(s): {', '.join(missing)} "
            f"(has: {', '.join(map(str, df.columns))})"
        )


def _check_unique(df: pd.DataFrame, cols: Sequence[str], table: str) -> None:
    dup = df.duplicated(subset=list(cols), keep=False)
    if dup.any():
        first = df.loc[dup, list(cols)].iloc[0].to_dict()
        raise SchemaError(f"{table} has duplicate rows for {list(cols)}, e.g. {first}")


def validate_runs(runs: pd.DataFrame, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """Check a runs table: required columns present, run_id unique, budgets positive.

    ``columns`` defaults to the full :data:`RUNS_COLUMNS` schema; pass a subset (e.g.
    :data:`RUNS_CORE`) when only part of it is needed. Returns ``runs`` unchanged.
    """
    require_columns(runs, list(columns) if columns is not None else list(RUNS_COLUMNS), "runs")
    if "run_id" in runs.columns:
        _check_unique(runs, ["run_id"], "runs")
    if "budget" in runs.columns:
        if not runs["budget"].map(is_budget).all():
            raise SchemaError("runs.budget must be positive numbers (FLOPs)")
    return runs


def validate_evals(evals: pd.DataFrame, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """Check an evals table: required columns present and scores within [0, 1].

    Returns ``evals`` unchanged.
    """
    require_columns(evals, list(columns) if columns is not None else list(EVALS_COLUMNS), "evals")
    if "score" in evals.columns:
        s = pd.to_numeric(evals["score"], errors="coerce")
        if s.isna().any() or (s < 0).any() or (s > 1).any():
            raise SchemaError("evals.score must be numbers in [0, 1]")
    if "flops" in evals.columns:
        f = pd.to_numeric(evals["flops"], errors="coerce")
        if f.isna().any() or (f < 0).any():
            raise SchemaError("evals.flops must be non-negative numbers")
    return evals


def validate_train(train: pd.DataFrame, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """Check a per-step train table has the columns the diagnostics read."""
    require_columns(train, list(columns) if columns is not None else list(TRAIN_COLUMNS), "train")
    return train


def extra_allocation_columns(df: pd.DataFrame) -> list[str]:
    """Optional allocation columns of ``df`` whose value differs between its rows:
    ``lora_r``, ``engine`` and every ``axis_*`` column, in that order."""
    cols = optional_columns(list(df.columns))
    return [c for c in cols if df[c].astype(str).nunique(dropna=False) > 1]


def _value(v: object) -> object:
    """A table cell as ``race.schema.allocation_name`` reads it: missing (None, NaN, NA) as None."""
    if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def table_names(df: pd.DataFrame, extras: Sequence[str] | None = None) -> list[str]:
    """``race.schema.allocation_name`` of each row of ``df``, with the optional columns
    ``extras``; None: each optional allocation column (``lora_r``, ``engine``, ``axis_*``)
    whose value in that row is not missing (:func:`allocation_key`)."""
    cols = optional_columns(list(df.columns))
    names = []
    for rec in df[[*ALLOCATION_COLUMNS, *cols]].to_dict("records"):
        rec = {k: _value(v) for k, v in rec.items()}
        names.append(allocation_name(rec, [c for c in cols if rec[c] is not None] if extras is None else extras))
    return names


def allocation_key(df: pd.DataFrame) -> pd.Series:
    """One readable string per row naming its allocation, for a table passed in by hand (a
    study's tables carry the grid's names in their ``allocation`` column, which
    :func:`prepare_runs` reads as it is).

    ``"{model}|G={num_generations}|P={prompts_per_step}|it={num_iterations}|lr={lr:g}|{reward}"``
    (everything but budget and seed), then ``"|{column}={value}"`` for every optional
    allocation column (``lora_r``, ``engine``, ``axis_*``; ``axis_`` dropped from the name)
    whose value in that row is not missing (``race.schema.allocation_name``). A row's key
    depends on that row only, never on which other rows the table holds.
    """
    require_columns(df, ALLOCATION_COLUMNS, "runs")
    return pd.Series(table_names(df), index=df.index, name="allocation", dtype=object)


def allocation_of(runs: pd.DataFrame) -> pd.Series:
    """Each row's allocation name: its ``allocation`` column as it is (a study's tables: the
    grid's names), :func:`allocation_key` where a row has none (a table passed in by hand)."""
    if "allocation" in runs.columns and runs["allocation"].notna().all():
        return runs["allocation"]
    key = allocation_key(runs)
    return key if "allocation" not in runs.columns else runs["allocation"].where(runs["allocation"].notna(), key)


def reward_columns_of(reward: object) -> dict[str, object]:
    """The typed reward columns (``race.schema.REWARD_COLUMNS``) of one reward spec of a
    table that was passed in by hand, never stored: derived as the grid derives them when it
    builds a study's table (``race.spec.reward.reward_columns``). A spec that does not parse
    raises :class:`SchemaError` saying why."""
    from race.spec.reward import RewardSpec, reward_columns  # the one reward grammar (imports pydantic's package)

    try:
        return reward_columns(reward if isinstance(reward, RewardSpec) else str(reward))
    except ValueError as e:
        raise SchemaError(f"runs.reward {reward!r} is not a reward spec: {e}") from None


def reward_system(reward: object) -> str:
    """The reward system of a reward spec: the ``kind`` of the parsed spec
    (``"prm:prm-s"`` -> ``"prm"``; :func:`reward_columns_of`)."""
    return str(reward_columns_of(reward)["reward_system"])


def with_reward_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with every typed reward column (``race.schema.REWARD_COLUMNS``): the grid's
    tables have them (read as they are); a table passed in by hand without them, or with
    an empty ``reward_system``, gets them derived from its ``reward`` (:func:`reward_columns_of`)."""
    need = [c for c in REWARD_COLUMNS if c not in runs.columns]
    if "reward_system" in runs.columns and runs["reward_system"].isna().any():
        need = list(REWARD_COLUMNS)
    if not need:
        return runs
    derived = [reward_columns_of(r) for r in runs["reward"]]
    return runs.assign(**{c: pd.Series([d[c] for d in derived], index=runs.index, dtype=None if derived else object)
                          for c in need})


def reward_flag(df: pd.DataFrame, column: str) -> pd.Series:
    """A boolean typed reward column (``reward_learned``, ``reward_random``) as booleans;
    a missing value (a run without a reward) reads False."""
    return df[column].eq(True)


#: The reward system (``reward_system``) of random-reward control runs: never a candidate,
#: only a comparison.
RANDOM_REWARD = "random"


def is_control(df: pd.DataFrame) -> pd.Series:
    """Rows of random-reward control runs: the typed ``reward_random`` column, else (a table
    derived from the prepared runs, carrying ``reward_system`` only) that system."""
    if "reward_random" in df.columns:
        return reward_flag(df, "reward_random")
    return df["reward_system"].astype(str) == RANDOM_REWARD


def without_controls(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without its random-reward control rows."""
    return df[~is_control(df)]


def prepare_runs(runs: pd.DataFrame, include_failed: bool = False) -> pd.DataFrame:
    """Runs with ``allocation`` (the study's names as they are; :func:`allocation_key` for
    rows without one) and the typed reward columns (``reward_system``, ...:
    :func:`with_reward_columns`, read as the grid wrote them), sorted by run_id.

    Only ``status == "complete"`` runs are kept unless ``include_failed``.
    """
    validate_runs(runs, RUNS_CORE)
    out = runs.copy()
    out["allocation"] = allocation_of(out)
    if not include_failed:
        out = out[out["status"].astype(str) == "complete"].copy()
    out["budget"] = out["budget"].astype(float)
    out["model_params"] = out["model_params"].astype(float)
    out = with_reward_columns(out)  # the grid wrote them; a table built by hand gets them here
    return out.sort_values("run_id", kind="mergesort").reset_index(drop=True)


def allocation_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Distinct allocations: ``allocation`` key, its columns, model_params and reward_system."""
    prepared = prepare_runs(runs, include_failed=True)  # sorted by run id: the first row of each allocation
    cols = ["allocation", *ALLOCATION_COLUMNS, *extra_allocation_columns(prepared), "model_params", "reward_system"]
    cols = [c for c in cols if c in prepared.columns]
    return (
        prepared[cols]
        .drop_duplicates("allocation")
        .sort_values("allocation", kind="mergesort")
        .reset_index(drop=True)
    )


def per_problem_array(value: object) -> np.ndarray | None:
    """A per-problem score vector as a float array; ``None`` when absent.

    Accepts a list/tuple/ndarray or a JSON string (as stored in SQLite).
    """
    if value is None:
        return None
    if isinstance(value, float) and np.isnan(value):
        return None
    if isinstance(value, str):
        value = json.loads(value)
    arr = np.asarray(value, dtype=float).ravel()
    return arr if arr.size else None


def jsonable(v: Any) -> Any:
    """Plain JSON types: DataFrames as records, numpy scalars as Python, NaN/inf as None."""
    if isinstance(v, pd.DataFrame):
        return [jsonable(r) for r in v.to_dict(orient="records")]
    if isinstance(v, pd.Series):
        return jsonable(v.to_dict())
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return [jsonable(x) for x in v.tolist()]
    if isinstance(v, np.generic):
        v = v.item()
    if v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)
