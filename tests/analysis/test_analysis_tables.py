import json

import numpy as np
import pandas as pd
import pytest

from race.analysis import (
    RUNS_COLUMNS,
    SchemaError,
    allocation_key,
    allocation_table,
    per_problem_array,
    prepare_runs,
    reward_system,
    validate_evals,
    validate_runs,
)
from race.spec.reward import parse_reward

from analysis_synth import LARGE, SMALL, make_study


def test_validate_runs_names_every_missing_column():
    runs, _ = make_study([SMALL], budgets=[1e14], n_problems=0)
    validate_runs(runs)  # complete schema passes
    with pytest.raises(SchemaError) as err:
        validate_runs(runs.drop(columns=["budget", "seed", "trunc_rate"]))
    msg = str(err.value)
    assert "runs table is missing column(s): budget, seed, trunc_rate" in msg


def test_validate_runs_rejects_duplicates_and_bad_budgets():
    runs, _ = make_study([SMALL], budgets=[1e14], n_problems=0)
    with pytest.raises(SchemaError, match="duplicate"):
        validate_runs(pd.concat([runs, runs.iloc[:1]]))
    with pytest.raises(SchemaError, match="positive"):
        validate_runs(runs.assign(budget=0.0))
    with pytest.raises(SchemaError, match="positive"):  # the guard's rule: a budget is finite
        validate_runs(runs.assign(budget=float("inf")))


def test_validate_evals_checks_columns_and_score_range():
    _, evals = make_study([SMALL], budgets=[1e14], n_problems=0)
    validate_evals(evals)
    with pytest.raises(SchemaError, match="flops"):
        validate_evals(evals.drop(columns=["flops"]))
    with pytest.raises(SchemaError, match=r"\[0, 1\]"):
        validate_evals(evals.assign(score=1.5))


def test_allocation_key_ignores_budget_and_seed_only():
    runs, _ = make_study([SMALL, LARGE], budgets=[1e14, 1e15], n_problems=0)
    keys = allocation_key(runs)
    assert keys.nunique() == 2
    assert set(keys) == {SMALL.key, LARGE.key}
    changed = runs.assign(learning_rate=np.where(runs["seed"] == 0, 3e-5, 1e-5))
    assert allocation_key(changed).nunique() == 4


def test_reward_system_and_prepare_runs_drop_failed():
    assert reward_system("prm:prm-s") == "prm"
    assert reward_system("rule") == "rule"
    # the one parser decides: a path-like PRM name with ':' and typed specs read their kind
    assert reward_system("prm:./rm:v2:min+outcome") == "prm" and reward_system(parse_reward("orm:orm-s")) == "orm"
    with pytest.raises(SchemaError, match="not a reward spec"):
        reward_system("reward-model-a")
    runs, _ = make_study([SMALL], budgets=[1e14], n_problems=0)
    runs.loc[0, "status"] = "failed"
    pr = prepare_runs(runs)
    assert len(pr) == len(runs) - 1 and set(pr["reward_system"]) == {"rule"}
    assert len(prepare_runs(runs, include_failed=True)) == len(runs)
    table = allocation_table(runs)
    assert list(table["allocation"]) == [SMALL.key]


def test_per_problem_array_accepts_lists_and_json():
    assert per_problem_array(None) is None
    assert per_problem_array(float("nan")) is None
    np.testing.assert_array_equal(per_problem_array(json.dumps([1, 0, 1])), [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(per_problem_array((0, 1)), [0.0, 1.0])


def test_schema_lists_the_documented_columns():
    for col in ("run_id", "budget", "model_params", "zero_var_frac", "trunc_rate", "feedback_flops"):
        assert col in RUNS_COLUMNS


def test_a_hand_made_tables_keys_are_each_rows_own():
    """A table passed in by hand (no ``allocation`` column: the grid's tables carry theirs)
    names each row from that row alone: the six allocation columns, then each optional
    column (lora_r, engine, axis_*) the row fills. So a subset of the rows names every
    allocation as the whole table does, and a lora.r axis does not merge its cells."""
    runs, _ = make_study([SMALL], budgets=[1e14], n_problems=0)
    assert set(allocation_key(runs)) == {SMALL.key}  # no optional column: the six
    runs = runs.assign(lora_r=16, engine="builtin")
    assert set(allocation_key(runs)) == {SMALL.key + "|lora_r=16|engine=builtin"}
    half = np.arange(len(runs)) % 2 == 0
    ranked = runs.assign(lora_r=np.where(half, 8, 16), engine=None, axis_max_completion_length=64)
    keys = allocation_key(ranked)
    assert set(keys) == {SMALL.key + "|lora_r=8|max_completion_length=64",
                         SMALL.key + "|lora_r=16|max_completion_length=64"}
    assert list(allocation_key(ranked[half])) == list(keys[half])  # a subset names its rows the same
    both = ranked.assign(axis_max_completion_length=np.where(half, 32, 64))
    assert set(allocation_key(both)) == {SMALL.key + "|lora_r=8|max_completion_length=32",
                                         SMALL.key + "|lora_r=16|max_completion_length=64"}
    table = allocation_table(both)
    assert len(table) == 2 and {"lora_r", "axis_max_completion_length"} <= set(table.columns)
    both.loc[half, "status"] = "failed"
    kept = prepare_runs(both)
    assert set(kept["allocation"]) == {SMALL.key + "|lora_r=16|max_completion_length=64"}


def test_prepare_runs_reads_the_allocation_column_as_it_is():
    """A study's tables name their allocations (the grid fixed the names): prepare_runs keeps
    them, whatever the other columns say; a row without one is keyed by its own columns."""
    runs, _ = make_study([SMALL, LARGE], budgets=[1e14], n_problems=0)
    named = runs.assign(allocation=np.where(runs["model"] == runs["model"].iloc[0], "first", "second"))
    assert set(prepare_runs(named)["allocation"]) == {"first", "second"}
    partly = named.assign(allocation=named["allocation"].where(named["model"] == named["model"].iloc[0], None))
    other = LARGE.key if runs["model"].iloc[0] == SMALL.model else SMALL.key
    assert set(prepare_runs(partly)["allocation"]) == {"first", other}
