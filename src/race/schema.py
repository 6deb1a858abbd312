"""The layout of a study's tables: one home for the columns that ``race.grid.tables``
writes (``load_tables``, ``race grid export``) and the analysis reads
(``race.analysis.tables``, ``race.analysis.joint``). Standard library only.

Four tables, one row each:

- ``runs``: one row per pilot run (:data:`RUNS_COLUMNS`, then :data:`RUNS_EXTRA` when
  the grid wrote it, then one ``axis_<path>`` column per grid axis outside the allocation
  columns, :func:`axis_column`).
- ``evals``: one row per (run_id, evaluation point, target) (:data:`EVALS_COLUMNS`,
  :data:`EVALS_OPTIONAL`).
- ``train``: the optional per-step training log (:data:`TRAIN_COLUMNS` and every metric
  the engine logged).
- ``ledger``: one row per FLOP record (:data:`LEDGER_COLUMNS`).

A racing study's store also holds one decision per rung (:data:`RUNG_DECISION_FIELDS`).

``model_params`` counts **all** parameters of the policy, embeddings included
(``race.accounting.ModelShape.num_params``: the token embedding, the decoder layers, the
final norm and an untied output head; tied embeddings once). The engines write it so
(``run.json``'s ``model_params``; its ``non_embedding_params`` is the count without the
embedding and head), and the analysis orders and fits model sizes by it.

An *allocation* is everything that describes how a run spends its budget except the
budget itself and the seed: :data:`ALLOCATION_COLUMNS`, plus every optional allocation
column (:data:`OPTIONAL_ALLOCATION_COLUMNS`, ``axis_*``) whose value differs between the
grid's allocations. Its name (:func:`allocation_name`, the ``allocation`` column) is fixed
once, when the grid expands into cells (``race.spec.cells``), and stored with each run.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

ALLOCATION_COLUMNS: tuple[str, ...] = ("model", "num_generations", "prompts_per_step", "num_iterations",
                                       "learning_rate", "reward")
#: Optional columns that also tell allocations apart, when their value varies between
#: runs; so do ``axis_<name>`` columns (the grid's other axes, e.g. ``axis_max_completion_length``).
OPTIONAL_ALLOCATION_COLUMNS: tuple[str, ...] = ("lora_r", "engine")
AXIS_PREFIX = "axis_"
#: Grid axes (RunConfig field paths) that have a column of their own in ``runs``; every
#: other axis gets an ``axis_*`` column.
OWN_COLUMN_AXES = frozenset({*ALLOCATION_COLUMNS, "lora.r", "engine"})

RUNS_COLUMNS: dict[str, str] = {
    "run_id": "run identifier (unique)",
    "study": "study name",
    "budget": "FLOP budget of the run (float)",
    "model": "policy model name",
    "model_params": "all parameters of the policy, embeddings included (ModelShape.num_params; float)",
    "num_generations": "completions per prompt (G)",
    "prompts_per_step": "prompts per optimizer batch",
    "num_iterations": "updates per generation batch",
    "learning_rate": "optimizer learning rate",
    "reward": "reward spec as written, e.g. 'rule', 'prm:prm-s', 'random'",
    "seed": "random seed",
    "status": "'complete', 'failed', ...",
    "total_flops": "FLOPs spent in total",
    "rollout_flops": "FLOPs of rollout/search",
    "learning_flops": "FLOPs of updates and log-prob passes",
    "feedback_flops": "FLOPs of reward/feedback",
    "steps": "optimizer steps taken",
    "wall_s": "wall-clock seconds",
    "zero_var_frac": "share of groups whose rewards are all equal",
    "trunc_rate": "share of completions that hit the length limit",
}
#: Columns the grid's runs table adds after :data:`RUNS_COLUMNS`.
RUNS_EXTRA: dict[str, str] = {
    "lora_r": "LoRA rank (empty for full fine-tuning)",
    "engine": "training engine ('builtin', 'trl')",
    "label": "the grid's label of the cell, 'model=tiny-s num_generations=8' (axis values only; the analysis "
    "names allocations by the 'allocation' column)",
    "allocation": "the allocation's name (allocation_name), fixed when the grid expanded into cells: every run of "
    "one allocation, at any budget or rung, carries the same one",
    "attempts": "attempts the driver made",
    "error": "the last attempt's error, if any",
    "conventions": "FLOP conventions the run was counted under",
    "reward_system": "the parsed reward spec's kind (RewardSpec.kind: 'rule', 'prm', ...)",
    "reward_rule": "the rule as 'rule:TERMS' (terms sorted): a rule reward's own, or the rule terms a learned "
    "reward mixes in ('prm:prm-xs:min+partial' -> 'rule:partial'); empty when none",
    "reward_model": "the learned reward's model name or path ('prm-xs'); empty for rules and the random control",
    "reward_learned": "whether the reward is a learned model's (orm, prm, judge)",
    "reward_random": "whether the run is a random-reward control",
    "prefix_of": "the run id of the longer run this one is a prefix of: a nested pilot's budget point, or a racing "
    "run that a later rung or the target run extended (else empty)",
    "extends": "for a racing run: the run id of the shorter run of its trajectory it continued (else empty)",
    "own_flops": "counted FLOPs this row's run executed itself: total_flops less the run it extends; 0 for a budget "
    "point the store read from a longer run (the FLOPs of every row sum to the study's, each counted once)",
    "warmup_steps": "learning-rate warmup steps of the run's config (a racing study's step floor counts from them)",
}
RUNS_OPTIONAL: dict[str, str] = {
    "proxy_reward_trend": "slope of the proxy (training) reward over the run",
    "verified_trend": "slope of the verified accuracy over the run",
}
#: The typed columns of the reward spec (``race.spec.reward.reward_columns``, derived from the
#: stored string when the grid builds the table): readers use these, never the string.
REWARD_COLUMNS: tuple[str, ...] = ("reward_system", "reward_rule", "reward_model", "reward_learned", "reward_random")
#: The columns most analysis functions need from ``runs``.
RUNS_CORE: tuple[str, ...] = ("run_id", "budget", "seed", "status", "model_params") + ALLOCATION_COLUMNS

EVALS_COLUMNS: dict[str, str] = {
    "run_id": "run identifier (matches runs.run_id)",
    "step": "optimizer step of the evaluation",
    "flops": "cumulative training FLOPs at the evaluation",
    "target": "'greedy', 'pass@k', 'hard', ...",
    "score": "score in [0, 1]",
    "n": "number of evaluation problems",
}
EVALS_OPTIONAL: dict[str, str] = {
    "per_problem": "list of per-problem 0/1 (or fractional) scores, same problems and order "
    "for every run of a target",
}

TRAIN_COLUMNS: dict[str, str] = {
    "run_id": "run identifier",
    "step": "optimizer step",
    "flops": "cumulative training FLOPs after the step",
    "reward_mean": "mean proxy/training reward of the step's completions",
}

LEDGER_COLUMNS: dict[str, str] = {
    "run_id": "run identifier",
    "step": "optimizer step of the record",
    "phase": "rollout, old_logprobs, reference, reward, update (counted); recompute, eval, ... (not)",
    "component": "the phase's part, e.g. prefill, decode, forward",
    "flops": "FLOPs of the record",
    "tokens": "tokens the record processed",
    "seconds": "wall seconds of the record",
    "counted": "whether the budget was charged (race.accounting.guard.is_counted)",
}

#: A racing study's stored decision per rung (the store's ``rung_decisions`` table, one row
#: per rung: ``race.analysis.racing.RungDecision.as_dict()``), the keys readers use.
RUNG_DECISION_FIELDS: dict[str, str] = {
    "rung": "index of the rung decided (0 = the first)",
    "budget": "the rung's budget in FLOPs",
    "next_budget": "the next rung's budget (null after the last rung: only the pick goes on, to the target)",
    "target_budget": "T, the budget of the target run",
    "go_on": "allocation keys that continue, leader first",
    "stopped": "allocation key -> why it stops here",
    "leader": "the leader's allocation key (after the last rung: the pick)",
    "rows": "per allocation: observed and forecast scores with intervals, P(best), gate, decision, reason",
    "rule": "the racing rule's parameters",
}

#: A run's statuses in the study store (``runs.status``), and those whose run finished
#: (its FLOPs and scores are read): a diverged run finished, it spent its budget.
STATUSES = ("pending", "running", "complete", "failed", "diverged")
FINISHED = ("complete", "diverged")


def fmt_number(x: Any) -> str:
    """A count as an allocation name writes it: an integral value without its decimals
    (``8.0`` -> ``"8"``), any other number in ``%g``, what is not a number as ``str``."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:g}"


def fmt_value(v: Any) -> str:
    """An optional allocation column's value as an allocation name writes it: ``-`` when
    missing (None, NaN), a number by :func:`fmt_number`, a boolean as ``True``/``False``,
    anything else as ``str`` (a grid axis's list or mapping is stored as its JSON)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return fmt_number(v)
    return str(v)


def allocation_name(values: Mapping[str, Any], extras: Sequence[str] = ()) -> str:
    """The name of one allocation, the one formula every reader and writer uses:
    ``"{model}|G={num_generations}|P={prompts_per_step}|it={num_iterations}|lr={lr:g}|{reward}"``
    (everything but budget and seed), then ``"|{column}={value}"`` (:func:`fmt_value`,
    ``axis_`` dropped from the name) for each column of ``extras``: the optional allocation
    columns that tell this allocation from the others of its grid (``lora_r``, ``engine``,
    ``axis_*``: ``race.spec.cells`` chooses them over the whole grid).
    ``values``: column -> value, :data:`ALLOCATION_COLUMNS` and the ``extras``."""
    parts = [str(values["model"]), f"G={fmt_number(values['num_generations'])}",
             f"P={fmt_number(values['prompts_per_step'])}", f"it={fmt_number(values['num_iterations'])}",
             f"lr={float(values['learning_rate']):g}", str(values["reward"])]
    for col in extras:
        name = col[len(AXIS_PREFIX):] if col.startswith(AXIS_PREFIX) else col
        parts.append(f"{name}={fmt_value(values.get(col))}")
    return "|".join(parts)


def optional_columns(columns: Sequence[Any]) -> list[str]:
    """The optional allocation columns among ``columns``, in the order names write them:
    :data:`OPTIONAL_ALLOCATION_COLUMNS`, then the ``axis_*`` columns sorted."""
    have = [c for c in columns if isinstance(c, str)]
    return [c for c in OPTIONAL_ALLOCATION_COLUMNS if c in have] + sorted(c for c in have if c.startswith(AXIS_PREFIX))


def varying_columns(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[str]:
    """The columns of ``columns`` (optional allocation columns) whose written value
    (:func:`fmt_value`) differs between ``rows``: what an allocation's name adds to the six."""
    return [c for c in columns if len({fmt_value(r.get(c)) for r in rows}) > 1]


def axis_value(v: Any) -> Any:
    """A grid axis's value as its ``axis_*`` column holds it: a scalar as it is, a list or
    mapping as its JSON (keys sorted)."""
    return v if v is None or isinstance(v, (str, int, float, bool)) else json.dumps(v, sort_keys=True)


def axis_column(path: str) -> str:
    """Column of a grid axis outside the standard allocation columns: ``axis_`` + the
    dotted path with dots as underscores (the analysis keys allocations on ``axis_*``)."""
    return AXIS_PREFIX + path.replace(".", "_")


__all__ = ["ALLOCATION_COLUMNS", "AXIS_PREFIX", "EVALS_COLUMNS", "EVALS_OPTIONAL", "FINISHED",
           "LEDGER_COLUMNS", "OPTIONAL_ALLOCATION_COLUMNS", "OWN_COLUMN_AXES", "REWARD_COLUMNS", "RUNG_DECISION_FIELDS",
           "RUNS_COLUMNS", "RUNS_CORE", "RUNS_EXTRA", "RUNS_OPTIONAL", "STATUSES", "TRAIN_COLUMNS", "allocation_name",
           "axis_column", "axis_value", "fmt_number", "fmt_value", "optional_columns", "varying_columns"]
