"""Runs trained elsewhere, read from a CSV or JSONL file of evaluations (``race import``,
docs/import.md), and the checks every imported run passes whatever its source.

One row per evaluation: ``run``, the run's fields (its allocation by RACE's names and its
``seed``: ``race.spec.imported``; the same on every row of a run), ``step``, ``score`` (in
[0, 1]), ``n`` (problems), optional ``target`` (default ``greedy``), optional
``per_problem`` (a JSON list of n outcomes in [0, 1]; in a CSV, a JSON string), optional
``budget`` (the run's nominal FLOP budget), and the training compute so far, one of:

- ``flops``: cumulative counted training FLOPs, as the file counts them;
- ``prompt_tokens`` and ``completion_tokens`` (or ``tokens`` = both, and
  ``completion_tokens``): cumulative tokens of the generated sequences, charged by RACE
  (``race.protocol.import_charge``), with optional ``sequences`` (cumulative sequences
  generated; default ``step x prompts_per_step x num_generations``: a step is one
  generation batch, as in verl).

Step 0 is the base model, before training, at 0 FLOPs and 0 tokens.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from race.accounting import LoRA, ModelShape
from race.spec.errors import ConfigError
from race.spec.imported import ImportedFields, imported_fields

from .errors import ImportRefused
from .import_charge import Shapes, charge_intervals, head_note, lora_of, policy_cost

#: The columns of an evaluation row that are not the run's fields.
ROW_COLUMNS = ("run", "step", "flops", "prompt_tokens", "completion_tokens", "tokens", "sequences", "target", "score",
               "n", "per_problem", "budget")
TOKEN_COLUMNS = ("prompt_tokens", "completion_tokens", "tokens", "sequences")
DEFAULT_TARGET = "greedy"


@dataclass
class ImportedRun:
    """One run trained elsewhere, as the study will hold it."""

    name: str  # the source's name for it (the study's run id)
    fields: ImportedFields  # allocation, seed, other settings
    shape: ModelShape  # the policy's shape (model_params)
    evals: list[dict[str, Any]]  # step, flops, target, score, n, per_problem
    ledger: list[dict[str, Any]]  # step, phase, component, flops, tokens, seconds, counted
    total_flops: float  # counted training FLOPs of the whole run
    steps: int
    source: str  # where it was read
    flops_from: str  # "ledger" (RACE's callback), "tokens" (charged on import) or "file" (given)
    conventions: str  # FLOP conventions of its FLOPs (as the source says, or as charged)
    budget: float | None = None  # nominal budget the source gives
    lora: LoRA | None = None
    train: list[dict[str, Any]] = field(default_factory=list)  # step, flops, reward_mean (TRL's logs)
    notes: list[str] = field(default_factory=list)  # what the study's caveat says about this run's source


def read_rows(path: Path, fmt: str) -> list[tuple[str, dict[str, Any]]]:
    """``(where, row)`` per evaluation row of a CSV or JSONL file (empty CSV cells left out)."""
    if not path.is_file():
        raise ImportRefused(f"{path}: no such file")
    out: list[tuple[str, dict[str, Any]]] = []
    if fmt == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            for i, row in enumerate(csv.DictReader(f), start=2):
                out.append((f"{path}:{i}", {k.strip(): v.strip() for k, v in row.items()
                                            if k is not None and v is not None and v.strip() != ""}))
        return out
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ImportRefused(f"{path}:{i}: not a JSON object ({e})") from None
        if not isinstance(row, dict):
            raise ImportRefused(f"{path}:{i}: each line must be a JSON object, got {type(row).__name__}")
        out.append((f"{path}:{i}", {k: v for k, v in row.items() if v is not None}))
    return out


def same_value(a: Any, b: Any) -> bool:
    """Whether two values of a field agree: as numbers when both read as one (``"1e-4"``
    and ``0.0001``), else as text."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def apply_settings(rows: list[tuple[str, dict[str, Any]]], settings: dict[str, Any]) -> None:
    """Fill ``--set`` values into every row that lacks the key (in place); a row that gives
    the key with another value is refused."""
    for where, row in rows:
        for k, v in settings.items():
            if k in row and not same_value(row[k], v):
                raise ImportRefused(f"{where}: {k} is {row[k]!r} here and --set {k}={v} says {v!r}: give it once")
            row.setdefault(k, v)


def check_columns(rows: list[tuple[str, dict[str, Any]]], source: str) -> None:
    """Refuse a file without the columns every row needs, naming what to add."""
    from race.spec.imported import REQUIRED_FIELDS

    if not rows:
        raise ImportRefused(f"{source}: no evaluation rows")
    have = set().union(*(r.keys() for _, r in rows))
    missing = [c for c in ("run", "step", "score", "n", *REQUIRED_FIELDS) if c not in have]
    tokens = {"prompt_tokens", "completion_tokens"} <= have or {"tokens", "completion_tokens"} <= have
    if "flops" not in have and not tokens:
        missing.append("flops (or prompt_tokens and completion_tokens)")
    if missing:
        raise ImportRefused(f"{source}: missing column(s) {', '.join(missing)}: add them (one row per evaluation: "
                            "docs/import.md), or give a value every row shares with --set NAME=VALUE")


def _num(row: dict[str, Any], key: str, where: str, kind: type = float) -> Any:
    value = row.get(key)
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ImportRefused(f"{where}: {key} {value!r} is not a number") from None
    if not math.isfinite(x):
        raise ImportRefused(f"{where}: {key} {value!r} is not finite")
    if kind is int:
        if x != int(x):
            raise ImportRefused(f"{where}: {key} {value!r} is not a whole number")
        return int(x)
    return x


def eval_row(row: dict[str, Any], flops: float, where: str) -> dict[str, Any]:
    """One evaluation: step, flops, target, score in [0, 1], n >= 1 problems, per-problem
    outcomes (n values in [0, 1]) when given."""
    step, score, n = _num(row, "step", where, int), _num(row, "score", where), _num(row, "n", where, int)
    if step < 0:
        raise ImportRefused(f"{where}: step {step} is negative")
    if not 0.0 <= score <= 1.0:
        raise ImportRefused(f"{where}: score {score:g} is outside [0, 1]: RACE reads scores as a share of problems "
                            "solved (divide a percentage by 100; a reward outside [0, 1] is not a score)")
    if n < 1:
        raise ImportRefused(f"{where}: n {n} must be the number of evaluation problems (>= 1)")
    pp = row.get("per_problem")
    if isinstance(pp, str):
        try:
            pp = json.loads(pp)
        except ValueError as e:
            raise ImportRefused(f"{where}: per_problem is not a JSON list ({e})") from None
    if pp is not None:
        if not isinstance(pp, list) or len(pp) != n or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in pp):
            raise ImportRefused(f"{where}: per_problem must be a list of n={n} outcomes in [0, 1] (one per "
                                "problem, the same problems in the same order in every run)")
        if abs(sum(pp) / n - score) > 1e-6:
            raise ImportRefused(f"{where}: score {score:g} is not the mean of per_problem ({sum(pp) / n:g})")
    return {"step": step, "flops": float(flops), "target": str(row.get("target") or DEFAULT_TARGET),
            "score": score, "n": n, "per_problem": pp}


def check_trajectory(name: str, evals: list[dict[str, Any]], where: str) -> None:
    """Every target has a step-0 evaluation (the base model, at 0 FLOPs), no (step,
    target) twice, and FLOPs that never fall as the steps rise."""
    seen: set[tuple[int, str]] = set()
    for e in evals:
        if (e["step"], e["target"]) in seen:
            raise ImportRefused(f"{where}: run {name} has two {e['target']} evaluations at step {e['step']}")
        seen.add((e["step"], e["target"]))
    for target in sorted({e["target"] for e in evals}):
        pts = sorted((e["step"], e["flops"]) for e in evals if e["target"] == target)
        if pts[0][0] != 0:
            raise ImportRefused(f"{where}: run {name} has no step-0 {target} evaluation: add the base model's score "
                                "before training (step 0, 0 FLOPs), the start of every learning curve")
        if pts[0][1] != 0:
            raise ImportRefused(f"{where}: run {name}'s step-0 evaluation is at {pts[0][1]:g} FLOPs: step 0 is the "
                                "base model before training (0 FLOPs)")
        for (s0, f0), (s1, f1) in zip(pts, pts[1:]):
            if f1 < f0:
                raise ImportRefused(f"{where}: run {name}'s FLOPs are not monotone: {f0:g} at step {s0}, {f1:g} at "
                                    f"step {s1}; FLOPs must be the cumulative training compute at each evaluation")


def _fields_of(name: str, rows: list[tuple[str, dict[str, Any]]]) -> tuple[ImportedFields, float | None]:
    values: dict[str, Any] = {}
    for where, row in rows:
        for k, v in row.items():
            if k in ROW_COLUMNS and k != "budget":
                continue
            if k in values and not same_value(values[k], v):
                raise ImportRefused(f"{where}: run {name} gives two values of {k} ({values[k]!r}, {v!r}): a run's "
                                    "allocation, seed and budget are the same on every row")
            values[k] = v
    budget = values.pop("budget", None)
    try:
        fields = imported_fields(values, f"run {name} ({rows[0][0]})")
    except ConfigError as e:
        raise ImportRefused(str(e)) from None
    return fields, None if budget is None else _num({"budget": budget}, "budget", rows[0][0])


def run_from_rows(name: str, rows: list[tuple[str, dict[str, Any]]], *, shapes: Shapes, conventions: str,
                  compact_head: bool, fmt: str) -> ImportedRun:
    """One run from its rows: fields, evaluations, FLOPs (given, or charged from tokens)."""
    fields, budget = _fields_of(name, rows)
    where = rows[0][0]
    shape = shapes.shape(fields.model, f"run {name} ({where})")
    lora = lora_of(fields)
    given = all("flops" in r for _, r in rows)
    if not given and any("flops" in r for _, r in rows):
        raise ImportRefused(f"{where}: run {name} gives flops on some rows only: give it on every row, or give "
                            "tokens on every row instead")
    ledger: list[dict[str, Any]] = []
    if given:
        evals = [eval_row(r, _num(r, "flops", w), w) for w, r in rows]
        ledger = unsplit_ledger(name, evals, where)
    else:
        cum = _token_points(name, fields, rows)
        intervals, prev = [], (0, 0, 0)
        for step in sorted(cum):
            seqs, prompt, completion = cum[step]
            intervals.append((step, seqs - prev[0], prompt - prev[1], completion - prev[2]))
            prev = cum[step]
        at_run = f"run {name} ({where})"
        ledger = charge_intervals(fields, policy_cost((shape, lora), conventions, at_run), intervals,
                                  compact_head=compact_head, where=at_run)
        at = {s: sum(r["flops"] for r in ledger if r["counted"] and r["step"] <= s) for s in cum}
        evals = [eval_row(r, at[_num(r, "step", w, int)], w) for w, r in rows]
    check_trajectory(name, evals, where)
    total = max(e["flops"] for e in evals)
    return ImportedRun(name=name, fields=fields, shape=shape, evals=evals, ledger=ledger, total_flops=total,
                       steps=max(e["step"] for e in evals), source=f"{where.rsplit(':', 1)[0]} ({fmt})",
                       flops_from="file" if given else "tokens", conventions=conventions if not given else "as given",
                       budget=budget, lora=lora, notes=[] if given else [head_note(compact_head)])


#: The ledger phase of FLOPs a file gives without their split by phase (counted: the run's
#: total is theirs; the report's split shows them as unattributed).
UNSPLIT = "unsplit"


def unsplit_ledger(name: str, evals: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """One counted ledger row per evaluated step of FLOPs a file gives (the increase since
    the step before), so a prefix of the run has its total (``Store.ingest``'s budget
    points). Every target of a step must say the same FLOPs."""
    at: dict[int, float] = {}
    for e in evals:
        if at.setdefault(e["step"], e["flops"]) != e["flops"]:
            raise ImportRefused(f"{where}: run {name} gives two FLOP counts at step {e['step']} "
                                f"({at[e['step']]:g}, {e['flops']:g}): one per step, whatever the target")
    rows, last = [], 0.0
    for step in sorted(at):
        if at[step] > last:
            rows.append({"step": step, "phase": UNSPLIT, "component": "file", "flops": at[step] - last,
                         "tokens": None, "seconds": None, "counted": True})
        last = max(last, at[step])
    return rows


def _token_points(name: str, fields: ImportedFields, rows: list[tuple[str, dict[str, Any]]],
                  ) -> dict[int, tuple[int, int, int]]:
    """step -> cumulative (sequences, prompt tokens, completion tokens), the same on every
    row of a step; rising with the steps; all 0 at step 0."""
    per_gen = fields.prompts_per_step * fields.num_generations
    out: dict[int, tuple[int, int, int]] = {}
    for w, r in rows:
        step = _num(r, "step", w, int)
        completion = _num(r, "completion_tokens", w, int)
        prompt = _num(r, "prompt_tokens", w, int) if "prompt_tokens" in r else _num(r, "tokens", w, int) - completion
        seqs = _num(r, "sequences", w, int) if "sequences" in r else step * per_gen
        point = (seqs, prompt, completion)
        if min(point) < 0:
            raise ImportRefused(f"{w}: run {name}: negative token or sequence count {point}")
        if out.setdefault(step, point) != point:
            raise ImportRefused(f"{w}: run {name} gives two token counts at step {step}: {out[step]} and {point}")
    last = (0, 0, 0)
    for step in sorted(out):
        if step == 0 and out[0] != (0, 0, 0):
            raise ImportRefused(f"run {name}: step 0 (the base model) must be at 0 tokens and sequences, got {out[0]}")
        if any(a < b for a, b in zip(out[step], last)):
            raise ImportRefused(f"run {name}: token counts fall at step {step} ({out[step]} after {last}): give the "
                                "cumulative counts at each evaluation")
        last = out[step]
    return out


def runs_from_file(path: Path, fmt: str, *, settings: dict[str, Any], shapes: Shapes, conventions: str,
                   compact_head: bool) -> list[ImportedRun]:
    """Every run of a CSV or JSONL file of evaluations (module docstring)."""
    rows = read_rows(path, fmt)
    apply_settings(rows, settings)
    check_columns(rows, str(path))
    by_run: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for where, row in rows:
        by_run.setdefault(str(row["run"]), []).append((where, row))
    return [run_from_rows(name, rs, shapes=shapes, conventions=conventions, compact_head=compact_head, fmt=fmt)
            for name, rs in by_run.items()]


__all__ = ["DEFAULT_TARGET", "ImportedRun", "ROW_COLUMNS", "apply_settings", "check_columns", "check_trajectory",
           "eval_row", "read_rows", "run_from_rows", "runs_from_file"]
