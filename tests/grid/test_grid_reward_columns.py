"""A stored reward spec is parsed once, where the runs table is built (race.grid.tables):
its typed columns (race.schema.REWARD_COLUMNS) for a mix of specs, derived from the stored
string, so a store that never held the columns reads them; the readers use the columns."""

from __future__ import annotations

import pandas as pd
import pytest

from race.grid import Store, expand_grid, grid_spec_from_dict, load_tables
from race.schema import REWARD_COLUMNS, RUNS_EXTRA
from race.spec.reward import reward_columns

from .conftest import grid

MIXED = ["prm:prm-xs:min+partial", "rule:partial", "random", "orm:orm-xs", "prm:prm-s:prod+3*outcome+format", "rule"]
EXPECTED = {  # reward -> (system, rule, model, learned, random)
    "prm:prm-xs:min+partial": ("prm", "rule:partial", "prm-xs", True, False),
    "rule:partial": ("rule", "rule:partial", None, False, False),
    "random": ("random", None, None, False, True),
    "orm:orm-xs": ("orm", None, "orm-xs", True, False),
    "prm:prm-s:prod+3*outcome+format": ("prm", "rule:format+outcome", "prm-s", True, False),
    "rule": ("rule", "rule:outcome", None, False, False),
}


def test_reward_columns_of_mixed_specs():
    for spec, want in EXPECTED.items():
        assert tuple(reward_columns(spec)[c] for c in REWARD_COLUMNS) == want, spec
    # a path with ':' stays the model's name; a judge is learned; an empty reward leaves every column empty
    assert reward_columns("prm:./rm:v2:min+outcome")["reward_model"] == "./rm:v2"
    assert reward_columns("judge:tiny-s:rm+outcome")["reward_learned"] is True
    assert set(reward_columns(None).values()) == {None} == set(reward_columns("").values())
    with pytest.raises(ValueError, match="kind must be"):
        reward_columns("reward-model-a")
    assert set(REWARD_COLUMNS) <= set(RUNS_EXTRA)  # declared in the runs table's layout


def test_the_runs_table_derives_the_typed_columns_from_the_stored_string(tmp_path):
    spec = grid_spec_from_dict(grid(budgets=[2e9], require_budget_span=False, axes={"reward": MIXED}))
    cells = expand_grid(spec)
    with Store(tmp_path / "s") as store:
        store.register_study(spec.study, spec.model_dump_json())
        store.add_cells(spec.study, cells)
        stored = {r["reward"] for r in store.runs()}
    assert stored == set(MIXED)  # the store holds the string only
    runs = load_tables(tmp_path / "s")["runs"]
    assert len(runs) == len(MIXED)
    for r in runs.itertuples():
        got = tuple(None if v is None or (isinstance(v, float) and pd.isna(v)) else v
                    for v in (getattr(r, c) for c in REWARD_COLUMNS))
        assert got == EXPECTED[r.reward], r.reward


def test_the_analysis_reads_the_columns_and_derives_them_only_for_tables_built_by_hand():
    from race.analysis.tables import is_control, prepare_runs, with_reward_columns

    by_hand = pd.DataFrame({"run_id": ["a", "b", "c"], "reward": ["prm:prm-xs:min+partial", "random", "rule"]})
    typed = with_reward_columns(by_hand)
    assert [None if pd.isna(v) else v for v in typed["reward_rule"]] == ["rule:partial", None, "rule:outcome"]
    assert list(typed["reward_learned"]) == [True, False, False]
    assert list(typed["reward_random"]) == [False, True, False]
    # columns present (as the grid writes them) are read as they are, never re-derived from the string
    sentinel = typed.assign(reward_model="sentinel", reward_learned=False)
    assert with_reward_columns(sentinel) is sentinel
    assert list(is_control(typed)) == [False, True, False]  # the random control, by its typed column
    assert list(is_control(typed.assign(reward_random=[True, False, False]))) == [True, False, False]
    assert list(is_control(typed.drop(columns="reward_random"))) == [False, True, False]  # by reward_system
    assert list(with_reward_columns(typed.drop(columns="reward_rule"))["reward_rule"]) == list(typed["reward_rule"])
    runs = pd.DataFrame({"run_id": ["a", "b"], "budget": [1e12, 1e12], "seed": [0, 0], "status": ["complete"] * 2,
                         "model_params": [1e6, 1e6], "model": ["tiny-s"] * 2, "num_generations": [4, 4],
                         "prompts_per_step": [4, 4], "num_iterations": [1, 1], "learning_rate": [1e-4, 1e-4],
                         "reward": ["orm:orm-xs", "rule:partial"]})
    pr = prepare_runs(runs)
    assert list(pr["reward_system"]) == ["orm", "rule"] and list(pr["reward_model"].fillna("-")) == ["orm-xs", "-"]
