"""Gangs in the grid: composition is a pure function of the spec, the local runner trains
gangs and stores each member as the solo grid stores its cell."""

from __future__ import annotations

import json

import pytest

from race.grid import Store, expand_grid, grid_spec_from_dict, run_grid
from race.grid.gangs import gang_id, gang_units
from race.spec.errors import GridSpecError


def _grid(model_dir, **changes):
    g = {"study": "g", "budgets": [1e9, 1.6e9], "require_budget_span": False, "min_steps": 0,
         "base": {"model": str(model_dir), "prompts_per_step": 4, "max_completion_length": 12, "reward": "random",
                  "learning_rate": 1e-3, "lora": {"r": 4, "lora_alpha": 8}, "torch_threads": 1,
                  "eval": {"n_problems": 8, "n_hard_problems": 4, "n_pass_problems": 4, "pass_k": 2}},
         "axes": {"num_generations": [2, 4]}, "seeds": [0, 1],
         "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1, "preload_torch": False}}
    g.update(changes)
    return g


def _mixed(model_dir):
    """LoRA and full fine-tuning cells of one base (full fine-tuning cannot join a gang)."""
    g = _grid(model_dir, gang=True, gang_size=3, axes={"num_generations": [2, 4], "lora": [{"r": 4}, None]})
    g["base"] = {k: v for k, v in g["base"].items() if k != "lora"}
    return g


def test_gang_composition_is_a_function_of_the_spec(tiny_model_dir):
    spec = grid_spec_from_dict(_mixed(tiny_model_dir))
    cells = expand_grid(spec)
    units = gang_units(cells, gang=True, gang_size=3)
    alone = [u for u in units if u[0].config.lora is None]
    assert all(len(u) == 1 for u in alone) and len(alone) == sum(c.config.lora is None for c in cells)
    gangs = [u for u in units if u[0].config.lora is not None]
    assert [len(u) for u in gangs] == [3, 3, 2]  # 8 LoRA cells of one base, cut in grid order
    assert [c.index for u in gangs for c in u] == sorted(c.index for c in cells if c.config.lora is not None)
    again = gang_units(expand_grid(grid_spec_from_dict(_mixed(tiny_model_dir))), gang=True, gang_size=3)
    assert [gang_id(u) for u in again] == [gang_id(u) for u in units]
    assert gang_units(cells, gang=False, gang_size=3) == [[c] for c in cells]


def test_gang_settings_are_refused_where_they_cannot_run(tiny_model_dir):
    with pytest.raises(GridSpecError, match="built-in engine"):
        grid_spec_from_dict(_grid(tiny_model_dir, gang=True, cell_fn="some.module:fn"))


def _stored(study):
    with Store(study, create=False) as s:
        runs = {r["run_id"]: (r["status"], r["total_flops"], r["steps"], json.loads(r["run_json"])["final"])
                for r in s.runs()}
        # the eval phase aside: which run computes the shared step-0 evaluation and which read it
        # from <study>/eval-cache ("eval/shared", 0 FLOPs) depends on which worker got there first
        ledger = sorted((r["run_id"], r["step"], r["phase"], r["component"], r["flops"], r["tokens"], r["counted"])
                        for r in s.rows("ledger") if r["phase"] != "eval")
        evals = sorted((r["run_id"], r["step"], r["target"], r["score"], r["per_problem_json"]) for r in s.rows("evals"))
        train = sorted((r["run_id"], r["step"], r["flops"]) for r in s.rows("train_metrics"))
    return runs, ledger, evals, train


def test_local_runner_trains_gangs_and_stores_members_as_cells(tiny_model_dir, tmp_path):
    """gang: true (two gangs of 2 on 2 workers) stores what gang: false stores: the same
    runs, ledgers (seconds aside), evaluations and training rows (token-level equality
    as in tests/engines/test_gang_engine.py); each run.json names its gang."""
    solo = run_grid(_grid(tiny_model_dir, seeds=[0]), tmp_path / "solo", poll_s=0.1)
    gang = run_grid(_grid(tiny_model_dir, seeds=[0], gang=True, gang_size=2), tmp_path / "gang", poll_s=0.1)
    assert solo.ok and gang.ok and gang.complete == solo.complete == 4
    assert _stored(tmp_path / "gang") == _stored(tmp_path / "solo")
    gangs = {json.loads((d / "run.json").read_text())["gang"]["members"].__repr__()
             for d in (tmp_path / "gang" / "runs").iterdir()}
    assert len(gangs) == 2 and len(list((tmp_path / "gang" / "gangs").iterdir())) == 2
    again = run_grid(_grid(tiny_model_dir, seeds=[0], gang=True, gang_size=2), tmp_path / "gang", poll_s=0.1)
    assert again.ok and again.skipped_complete == 4 and again.ran == 0


def _nested_stored(study):
    """``_stored`` plus each run's prefix columns and budget points (nested grids)."""
    with Store(study, create=False) as s:
        prefixes = sorted((r["run_id"], r["prefix_of"], r["prefix_step"], r["budget"]) for r in s.runs())
        points = sorted((r["run_id"], json.dumps(json.loads(r["run_json"]).get("budget_points")))
                        for r in s.runs() if not r["prefix_of"])
    return _stored(study), prefixes, points


def test_nested_gangs_store_what_nested_solo_runs_store(tiny_model_dir, tmp_path):
    """nested: true with gang: true: each member evaluates where a run of the smaller
    budget would stop, as its solo run does; the store's prefix rows, ledgers and
    evaluations equal the nested solo grid's."""
    g = dict(nested=True, seeds=[0], budgets=[1e9, 2.5e9])
    solo = run_grid(_grid(tiny_model_dir, **g), tmp_path / "solo", poll_s=0.1)
    gang = run_grid(_grid(tiny_model_dir, gang=True, gang_size=2, **g), tmp_path / "gang", poll_s=0.1)
    assert solo.ok and gang.ok and gang.complete == solo.complete == 2
    a, b = _nested_stored(tmp_path / "gang"), _nested_stored(tmp_path / "solo")
    assert sum(1 for _, p, _, _ in a[1] if p) == 2  # one prefix per member, at the smaller budget
    assert a == b
