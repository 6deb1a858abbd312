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
column (:data:`OPTIONAL_ALLOCATION_COLUMNS`, ``axis_*``) whose value differs between runs.
"""

from __future__ import annotations

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
    "label": "the grid's label of the cell, 'model=tiny-s num_generations=8' (the analysis keys allocations "
    "itself: its 'allocation' column)",
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


def axis_column(path: str) -> str:
    """Column of a grid axis outside the standard allocation columns: ``axis_`` + the
    dotted path with dots as underscores (the analysis keys allocations on ``axis_*``)."""
    return AXIS_PREFIX + path.replace(".", "_")


__all__ = ["ALLOCATION_COLUMNS", "AXIS_PREFIX", "EVALS_COLUMNS", "EVALS_OPTIONAL", "FINISHED",
           "LEDGER_COLUMNS", "OPTIONAL_ALLOCATION_COLUMNS", "OWN_COLUMN_AXES", "REWARD_COLUMNS", "RUNG_DECISION_FIELDS",
           "RUNS_COLUMNS", "RUNS_CORE", "RUNS_EXTRA", "RUNS_OPTIONAL", "STATUSES", "TRAIN_COLUMNS", "axis_column"]
