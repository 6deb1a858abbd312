"""Reading a study: status, analysis tables (pandas) and export to Parquet/CSV.

:func:`load_tables` gives the analysis module its inputs: ``runs`` (one row per cell,
allocation + outcome + FLOP split) and ``evals`` (one row per evaluation point), plus
``ledger`` and ``train``, in the layout of ``race.schema``. Readers never take the study lock; WAL lets them read while a
driver writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from race.accounting import SPLIT
from race.grid.lock import StudyLock
from race.grid.store import Store, is_read_prefix
from race.records import run_record
from race.schema import EVALS_COLUMNS, EVALS_OPTIONAL, LEDGER_COLUMNS as LEDGER_SCHEMA, OWN_COLUMN_AXES, \
    RUNS_COLUMNS, RUNS_EXTRA, FINISHED, STATUSES, allocation_name, axis_column, axis_value, optional_columns, \
    varying_columns
from race.spec.reward import reward_columns

#: The tables' columns, in order: ``race.schema`` (the one layout the analysis reads too).
RUN_COLUMNS = list(RUNS_COLUMNS)
EXTRA_RUN_COLUMNS = list(RUNS_EXTRA)
EVAL_COLUMNS = [*EVALS_COLUMNS, *EVALS_OPTIONAL]
LEDGER_COLUMNS = list(LEDGER_SCHEMA)
LEARNING_PHASES = SPLIT["learning"]


@dataclass
class StudyStatus:
    study: str | None
    study_dir: Path
    counts: dict[str, int]
    cells: list[dict[str, Any]]
    flops_done: float
    flops_planned: float
    driver: dict[str, Any] | None = None  # the live driver (pid, host, since), if any
    prefixes: int = 0  # rows the store wrote as prefixes of a nested cell's run (not cells: no FLOPs of their own)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def study_status(study_dir: str | Path) -> StudyStatus:
    """Counts by status and one row per cell (no lock needed)."""
    with Store(study_dir, create=False) as store:
        rows = store.runs()
        counts = store.counts()
        name = store.study_name()
    runs = [r for r in rows if not (r.get("prefix_of") and is_read_prefix(r["run_id"], r["prefix_of"]))]
    budgets = {r["run_id"]: r["budget"] for r in runs}
    cells = [{"run_id": r["run_id"], "label": r["label"], "budget": r["budget"], "seed": r["seed"],
              "status": r["status"], "attempts": r["attempts"], "wall_s": r["wall_s"], "total_flops": r["total_flops"],
              "steps": r["steps"], "error": (r["error"] or "").strip().splitlines()[0][:200] if r["error"] else None}
             for r in runs]
    return StudyStatus(study=name, study_dir=Path(study_dir), counts=counts, cells=cells,
                       # an extended cell's FLOPs hold the run it extends (that run is its prefix): counted once
                       flops_done=sum(r["total_flops"] or 0.0 for r in runs if r["status"] in FINISHED
                                      and not r.get("prefix_of")),
                       flops_planned=sum(r["budget"] - budgets.get(r.get("extends") or "", 0.0) for r in runs),
                       driver=StudyLock.holder(study_dir),
                       prefixes=len(rows) - len(runs))


def load_tables(study_dir: str | Path) -> dict[str, "Any"]:
    """``{"runs", "evals", "ledger", "train"}`` as pandas DataFrames (:func:`read_tables` of
    the study's store, opened for this read)."""
    with Store(study_dir, create=False) as store:
        return read_tables(store)


def allocation_names(records: list[dict[str, Any]], columns: list[str]) -> list[str]:
    """The ``allocation`` column of a runs table read from a store (``records``: its rows,
    ``columns``: the table's): the names the grid stored (``Store.add_cells``). A store
    written before names were stored (a row without one) has every row named here, over all
    its runs: the six allocation columns and each optional one whose value differs between
    them (``race.schema.allocation_name``, as the grid names a whole grid's cells)."""
    names = [r.get("allocation") for r in records]
    if all(names):
        return [str(n) for n in names]
    extras = varying_columns(records, optional_columns(columns))
    return [allocation_name(r, extras) for r in records]


def _table_row(r: dict[str, Any], own: dict[str, list[dict[str, Any]]], study: str | None,
               totals: dict[str, Any], extra_axes: list[str]) -> dict[str, Any]:
    """One row of the runs table: the stored run ``r``, summarised from its own stored rows ``own``."""
    run = json.loads(r["run_json"]) if r["run_json"] else {}
    done = r["status"] in FINISHED
    # the run's summary from its stored rows: one author (race.records.run_record)
    record = run_record(evals=own.get("evals", []), train=own.get("train", []), ledger=own.get("ledger", []),
                        steps=run.get("steps")) if done else None
    ph = {k: v for k, v in record.phase_flops.items()} if record else {}
    diag = record.diagnostics if record else {}
    counted = sum(ph.get(k, 0.0) for k in (*SPLIT["search"], *SPLIT["feedback"], *LEARNING_PHASES))
    total = run.get("total_flops", counted) if done else None
    rec = {
        "run_id": r["run_id"], "study": r["study"] or study, "budget": r["budget"], "model": r["model"],
        "model_params": run.get("model_params"), "num_generations": r["num_generations"],
        "prompts_per_step": r["prompts_per_step"], "num_iterations": r["num_iterations"],
        "learning_rate": r["learning_rate"], "reward": r["reward"], "seed": r["seed"], "status": r["status"],
        "total_flops": total,
        "rollout_flops": ph.get("rollout") if done else None,
        "learning_flops": sum(ph.get(k, 0.0) for k in LEARNING_PHASES) if done else None,
        "feedback_flops": ph.get("reward") if done else None,
        "steps": record.steps if record else run.get("steps"), "wall_s": r["wall_s"],
        "zero_var_frac": diag.get("zero_var_frac"), "trunc_rate": diag.get("trunc_rate"),
        "lora_r": r["lora_r"], "engine": r["engine"], "label": r["label"], "attempts": r["attempts"],
        "error": r["error"], "conventions": run.get("conventions"),
        "prefix_of": r.get("prefix_of"), "extends": r.get("extends"), "allocation": r.get("allocation"),
        "warmup_steps": (json.loads(r["spec_json"]) if r.get("spec_json") else {}).get("warmup_steps"),
        "own_flops": (0.0 if r.get("prefix_of") and is_read_prefix(r["run_id"], r["prefix_of"])
                      else total - (totals.get(r.get("extends") or "") or 0.0)) if done and total is not None
        else None,
        # the one place a stored reward spec is parsed: its typed columns (race.schema.REWARD_COLUMNS),
        # derived here from the string, so stores written before these columns existed read the same
        **reward_columns(r["reward"]),
    }
    alloc = json.loads(r["allocation_json"])
    for path in alloc:
        if axis_column(path) in extra_axes:
            rec[axis_column(path)] = axis_value(alloc[path])
    return rec


def read_tables(store: Store) -> dict[str, "Any"]:
    """``{"runs", "evals", "ledger", "train"}`` as pandas DataFrames, read from an open store."""
    import pandas as pd

    runs = store.runs()
    ledger = store.rows("ledger")
    evals = store.rows("evals")
    train = store.rows("train_metrics")
    study = store.study_name()

    rows_of: dict[str, dict[str, list[dict[str, Any]]]] = {}  # run id -> its rows, for its record
    for table, kind in ((ledger, "ledger"), (evals, "evals")):
        for r in table:
            rows_of.setdefault(r["run_id"], {}).setdefault(kind, []).append(r)
    for t in train:
        rows_of.setdefault(t["run_id"], {}).setdefault("train", []).append(
            {"step": t["step"], "flops": t["flops"], **json.loads(t["metrics_json"])})
    extra_axes: list[str] = []
    for r in runs:
        for path in json.loads(r["allocation_json"]):
            if path not in OWN_COLUMN_AXES and axis_column(path) not in extra_axes:
                extra_axes.append(axis_column(path))
    totals = {r["run_id"]: r["total_flops"] for r in runs}
    records = [_table_row(r, rows_of.get(r["run_id"], {}), study, totals, extra_axes) for r in runs]
    columns = RUN_COLUMNS + EXTRA_RUN_COLUMNS + extra_axes
    for rec, name in zip(records, allocation_names(records, columns)):
        rec["allocation"] = name
    runs_df = pd.DataFrame.from_records(records, columns=columns)
    for col in ("budget", "model_params", "total_flops", "own_flops", "rollout_flops", "learning_flops", "feedback_flops",
                "wall_s", "zero_var_frac", "trunc_rate", "learning_rate"):
        runs_df[col] = pd.to_numeric(runs_df[col], errors="coerce").astype("float64")
    for col in ("steps", "lora_r", "warmup_steps"):
        runs_df[col] = pd.to_numeric(runs_df[col], errors="coerce").astype("Int64")

    evals_df = pd.DataFrame.from_records(
        [{**{k: e[k] for k in ("run_id", "step", "flops", "target", "score", "n")},
          "per_problem": json.loads(e["per_problem_json"]) if e["per_problem_json"] else []} for e in evals],
        columns=EVAL_COLUMNS)
    evals_df["n"] = evals_df["n"].astype("Int64")
    ledger_df = pd.DataFrame.from_records(ledger, columns=LEDGER_COLUMNS)
    ledger_df["counted"] = ledger_df["counted"].astype(bool)
    train_df = pd.DataFrame.from_records(
        [{"run_id": t["run_id"], "step": t["step"], "flops": t["flops"], **json.loads(t["metrics_json"])} for t in train])
    if train_df.empty:
        train_df = pd.DataFrame(columns=["run_id", "step", "flops"])
    return {"runs": runs_df, "evals": evals_df, "ledger": ledger_df, "train": train_df}


def export_study(study_dir: str | Path, out_dir: str | Path | None = None, fmt: str = "parquet") -> list[Path]:
    """Write runs, evals, ledger and train tables as Parquet or CSV; returns the files."""
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"export format {fmt!r}: choose parquet or csv")
    tables = load_tables(study_dir)
    out = Path(out_dir) if out_dir is not None else Path(study_dir) / "export"
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for name, df in tables.items():
        path = out / f"{name}.{fmt}"
        if fmt == "parquet":
            df.to_parquet(path, index=False)
        else:
            if "per_problem" in df.columns:
                df = df.assign(per_problem=df["per_problem"].map(json.dumps))
            df.to_csv(path, index=False)
        files.append(path)
    return files


__all__ = ["StudyStatus", "study_status", "load_tables", "read_tables", "export_study", "RUN_COLUMNS", "EVAL_COLUMNS", "STATUSES"]
