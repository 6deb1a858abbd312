"""One name per allocation (issue 50): fixed when the grid expands into cells, over the whole
grid, and written by the one formula (``race.schema.allocation_name``) that the analysis uses
on its tables too, so both sides write the same string for the same values."""

from __future__ import annotations

import pandas as pd
import pytest

from race.schema import allocation_name, fmt_value, varying_columns
from race.spec.cells import allocation_values
from race.spec.errors import GridSpecError
from race.spec.grid import grid_spec_from_dict


def _grid(**changes):
    g = {"study": "names", "budgets": [1e9, 1e10], "seeds": [0, 1],
         "base": {"model": "tiny-s", "prompts_per_step": 4, "max_completion_length": 16},
         "axes": {"num_generations": [4, 8], "lora.r": [8, 16], "lora.target_modules": [["q_proj"], ["q_proj", "v_proj"]]}}
    g.update(changes)
    return g


def test_cells_carry_the_name_of_their_allocation_over_the_whole_grid():
    cells = grid_spec_from_dict(_grid()).cells()
    names = {c.name for c in cells}
    assert len(names) == 8 and len(cells) == 8 * 2 * 2  # every budget and seed of an allocation: one name
    c = next(c for c in cells if c.allocation == {"num_generations": 8, "lora.r": 16,
                                                  "lora.target_modules": ["q_proj", "v_proj"]})
    # the six, then what varies between the grid's cells (lora_r, the axis column), not what does not (engine)
    assert c.name == 'tiny-s|G=8|P=4|it=1|lr=0.0001|rule|lora_r=16|lora_target_modules=["q_proj", "v_proj"]'
    assert {x.name for x in cells if x.allocation == c.allocation} == {c.name}
    # a grid without the lora.r axis names its allocations without it
    plain = grid_spec_from_dict(_grid(axes={"num_generations": [4, 8]})).cells()
    assert {x.name for x in plain} == {"tiny-s|G=4|P=4|it=1|lr=0.0001|rule", "tiny-s|G=8|P=4|it=1|lr=0.0001|rule"}


def test_the_spec_and_the_tables_write_the_same_name():
    """The grid's names from its cells' values and the analysis's from a table holding the same
    values (pandas dtypes: nullable ints, NaN, JSON text) are the same strings."""
    from race.analysis.tables import table_names

    cells = grid_spec_from_dict(_grid()).cells()
    rows = [allocation_values(c.config, c.allocation) for c in cells]
    extras = varying_columns(rows, ["lora_r", "engine", "axis_lora_target_modules"])
    assert extras == ["lora_r", "axis_lora_target_modules"]
    table = pd.DataFrame(rows).astype({"lora_r": "Int64"})
    assert table_names(table, extras) == [c.name for c in cells]


@pytest.mark.parametrize("value, written", [(None, "-"), (float("nan"), "-"), (8, "8"), (8.0, "8"), (0.5, "0.5"),
                                            (True, "True"), ("builtin", "builtin"), ('["a"]', '["a"]')])
def test_an_optional_value_is_written_one_way(value, written):
    assert fmt_value(value) == written
    assert allocation_name({"model": "m", "num_generations": 4, "prompts_per_step": 2, "num_iterations": 1,
                            "learning_rate": 1e-4, "reward": "rule", "axis_x": value}, ["axis_x"]).endswith(
        f"|x={written}")


def test_two_allocations_written_alike_are_refused():
    """Learning rates that differ below the name's precision (``%g``) would merge two
    allocations in every table and decision: the grid refuses them, naming both cells."""
    g = _grid(axes={"learning_rate": [1e-4, 1.0000001e-4]})
    with pytest.raises(GridSpecError, match=r"learning_rate=0.0001\] and \[learning_rate=0.00010000001\] are one "
                                            r"allocation \(tiny-s\|G=8\|P=4\|it=1\|lr=0.0001\|rule\)"):
        grid_spec_from_dict(g)
