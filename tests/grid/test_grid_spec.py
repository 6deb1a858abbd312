"""Grid spec validation, expansion and the dry-run plan (no worker processes)."""

from __future__ import annotations

import pytest

from race.grid import GridSpecError, expand_grid, grid_spec_from_dict, load_grid_spec, plan_grid, predict_cell
from race.spec.grid import DEFAULT_CELL_FN

from .conftest import FAKE_CELL_FN, grid, write_grid
from .fake_engine import step_ledger


def _err(data: dict) -> str:
    with pytest.raises(GridSpecError) as e:
        grid_spec_from_dict(data)
    return str(e.value)


def test_expansion_is_axes_x_budgets_x_seeds_with_budget_and_seed_set():
    spec = grid_spec_from_dict(grid(seeds=[0, 1]))
    cells = expand_grid(spec)
    assert len(cells) == 2 * 2 * 2 * 2
    assert [c.budget for c in cells[:8]] == [2e9] * 8  # budget-major, cheap cells first
    assert {(c.config.model, c.config.num_generations, c.budget, c.seed) for c in cells} == {
        (m, g, b, s) for m in ("tiny-xs", "tiny-s") for g in (4, 8) for b in (2e9, 2e10) for s in (0, 1)}
    c = cells[0]
    assert c.config.prompts_per_step == 4 and c.config.eval.n_problems == 16
    assert c.allocation == {"model": "tiny-xs", "num_generations": 4}
    assert c.label == "model=tiny-xs num_generations=4"


def test_ids_are_stable_across_calls_and_distinct_across_cells():
    a = [c.run_id for c in expand_grid(grid_spec_from_dict(grid()))]
    b = [c.run_id for c in expand_grid(grid_spec_from_dict(grid()))]
    assert a == b
    assert len(set(a)) == len(a)
    assert all(c.run_id == c.config.run_id() for c in expand_grid(grid_spec_from_dict(grid())))
    # adding a seed or an axis value leaves the existing cells' ids alone
    more = {c.run_id for c in expand_grid(grid_spec_from_dict(grid(seeds=[0, 7], axes={
        "model": ["tiny-xs", "tiny-s", "tiny-m"], "num_generations": [4, 8]})))}
    assert set(a) < more


def test_load_from_yaml_and_relative_cell_fn(tmp_path):
    (tmp_path / "eng.py").write_text("def go(cfg, run_dir):\n    return {}\n")
    path = write_grid(tmp_path / "g.yaml", grid(cell_fn="eng.py:go"))
    spec = load_grid_spec(path)
    assert spec.cell_fn == f"{(tmp_path / 'eng.py').resolve()}:go"
    assert spec.source == str(path)
    assert grid_spec_from_dict({k: v for k, v in grid().items() if k != "cell_fn"}).cell_fn == DEFAULT_CELL_FN


def test_budget_span_is_required_for_a_pilot_grid():
    msg = _err(grid(budgets=[1e10, 5e10]))
    assert "span only 5x" in msg and "require_budget_span: false" in msg and "1e+11" in msg
    assert "span only 1x" in _err(grid(budgets=[1e10]))
    assert grid_spec_from_dict(grid(budgets=[1e10], require_budget_span=False)).budgets == [1e10]
    assert "duplicates" in _err(grid(budgets=[1e10, 1e10, 1e11]))
    assert "positive" in _err(grid(budgets=[-1.0, 1e11]))
    assert "budgets is empty: list the pilot budgets" in _err({k: v for k, v in grid().items() if k != "budgets"})


@pytest.mark.parametrize("change, expected", [
    ({"modle": "tiny-s"}, ["modle: unknown grid setting", "grid keys are"]),
    ({"model": "tiny-s"}, ["go under base: or axes:"]),
    ({"axes": {"lora.rank": [8, 16]}}, ["axes.lora.rank", "unknown run setting 'rank' in lora", "'r'"]),
    ({"axes": {"modle": ["tiny-s"]}}, ["axes.modle", "unknown run setting 'modle'", "'model'"]),
    ({"axes": {"model": "tiny-s"}}, ["axes.model must be a list of values"]),
    ({"axes": {"model": []}}, ["axes.model is empty"]),
    ({"axes": {"model": ["tiny-s", "tiny-s"]}}, ["axes.model has duplicate values"]),
    ({"axes": {"budget_flops": [1e9]}}, ["axes.budget_flops", "use the grid's budgets"]),
    ({"base": {"seed": 3}}, ["base.seed", "use the grid's seeds"]),
    ({"base": {"model": "tiny-s"}}, ["['model'] set in both base and axes"]),
    ({"seeds": [1, 1]}, ["seeds has duplicates"]),
    ({"study": "my study/x"}, ["study='my study/x'"]),
    ({"cell_fn": "no_colon"}, ["cell_fn='no_colon'"]),
    ({"runner": {"kind": "slurm"}}, ["runner.kind"]),
    ({"runner": {"workers": 0}}, ["runner.workers"]),
    ({"max_retries": -1}, ["max_retries"]),
])
def test_spec_errors_name_the_field_and_the_fix(change, expected):
    msg = _err(grid(**change))
    assert msg.startswith("invalid grid spec")
    for part in expected:
        assert part in msg, (part, msg)


def test_invalid_cell_values_name_the_cell_and_the_run_setting():
    msg = _err(grid(axes={"model": ["tiny-xs"], "num_generations": [1, 4]}))
    assert "1 cell(s) are not valid runs" not in msg  # one per budget: two bad cells
    assert "2 cell(s) are not valid runs" in msg
    assert "cell [model=tiny-xs num_generations=1 budget=2e+09 seed=0]" in msg
    assert "num_generations: num_generations=1: GRPO needs a group of at least 2" in msg
    msg = _err(grid(base={"lr": 1e-4}))
    assert "  - base.lr: unknown run setting 'lr' (did you mean 'learning_rate'?)" in msg
    msg = _err(grid(base={"xyzzy": 1e-4}))  # nothing close: the valid names
    assert "  - base.xyzzy: unknown run setting 'xyzzy'; choose from [" in msg and "'learning_rate'" in msg
    msg = _err(grid(base={"lora": {"rank": 8}}))
    assert "lora.rank: unknown field (did you mean 'lora.r'?)" in msg


def test_axis_on_lora_rank_turns_lora_on_when_base_has_none():
    spec = grid_spec_from_dict(grid(base={"lora": None}, axes={"lora.r": [4, 8]}))
    cells = expand_grid(spec)
    assert sorted({c.config.lora.r for c in cells}) == [4, 8]
    full = grid_spec_from_dict(grid(axes={"lora": [None, {"r": 8}]}))
    assert {c.config.lora is None for c in expand_grid(full)} == {True, False}


def test_same_run_from_two_axis_values_is_refused():
    msg = _err(grid(axes={"lora": [{"r": 16}, {"r": 16, "lora_alpha": 16.0}]}))
    assert "expand to the same run" in msg


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(GridSpecError, match="grid file not found"):
        load_grid_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: [unclosed\n")
    with pytest.raises(GridSpecError, match="not valid YAML"):
        load_grid_spec(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(GridSpecError, match="top level must be a mapping"):
        load_grid_spec(lst)
    with pytest.raises(GridSpecError, match="file missing.py not found"):
        grid_spec_from_dict(grid(cell_fn="missing.py:run"))


# -- plan -----------------------------------------------------------------------------

def _fake_predict(cfg):
    step = sum(r["flops"] for r in step_ledger(cfg))
    roll = sum(r["flops"] for r in step_ledger(cfg) if r["phase"] == "rollout")
    steps = int(cfg.budget_flops // step)
    return {"steps": steps, "step_flops": step, "rollout": roll * steps, "learning": (step - roll) * steps,
            "feedback": 0.0, "total": step * steps}


def test_plan_refuses_cells_below_min_steps_with_a_clear_message():
    spec = grid_spec_from_dict(grid(min_steps=30))
    p = plan_grid(spec, predictor=_fake_predict)
    assert len(p.cells) == 8
    refused = {(c.cell.config.model, c.cell.config.num_generations, c.cell.budget) for c in p.refused}
    # at 2e9 every allocation buys fewer than 30 steps; at 2e10 only tiny-s G=8 (27 steps)
    assert refused == {(m, g, 2e9) for m in ("tiny-xs", "tiny-s") for g in (4, 8)} | {("tiny-s", 8, 2e10)}
    r = next(c for c in p.refused if c.cell.budget == 2e10)
    assert "fewer than min_steps=30" in r.refusal and "raise this budget to >=" in r.refusal
    assert p.total_budget == 3 * 2e10
    assert p.total_predicted_flops == pytest.approx(sum(c.prediction["total"] for c in p.runnable))
    rollout, learning, feedback = p.runnable[0].split_pct()
    assert rollout + learning + feedback == pytest.approx(100)
    secs = sorted((c.prediction["est_seconds"] for c in p.runnable), reverse=True)
    assert len(secs) == 3  # longest first on 2 workers: the two longest start, the third follows the shorter
    assert p.est_wall_s == pytest.approx(max(secs[0], secs[1] + secs[2]))
    assert sum(secs) / 2 <= p.est_wall_s <= sum(secs) / 2 + secs[0]  # Graham's bound
    d = p.to_dict()
    assert len(d["cells"]) == 8 and sum(1 for c in d["cells"] if c["refusal"]) == 5


def test_predict_cell_uses_the_accounting_module():
    from race.accounting import grpo_step_flops  # noqa: F401
    from race.spec.run import RunConfig

    cfg = RunConfig(model="tiny-s", budget_flops=1e12, num_generations=4, prompts_per_step=8)
    p = predict_cell(cfg)
    assert p is not None
    assert p["steps"] == int(1e12 // p["step_flops"]) >= 1
    assert p["rollout"] + p["learning"] + p["feedback"] == pytest.approx(p["total"])
    assert p["total"] == pytest.approx(p["steps"] * p["step_flops"]) and p["total"] <= 1e12
    assert p["feedback"] == 0  # rule reward
    bigger = predict_cell(cfg.model_copy(update={"num_generations": 8}))
    assert bigger["step_flops"] > p["step_flops"] and bigger["steps"] < p["steps"]
    capped = predict_cell(cfg.model_copy(update={"max_steps": 2}))
    assert capped["steps"] == 2


def test_plan_without_predictions_still_plans():
    """A predictor with no prediction for any cell (``None``): the plan still lists the
    cells and their budgets, and says min_steps was not checked."""
    p = plan_grid(grid_spec_from_dict(grid(min_steps=50)), predictor=lambda cfg: None)
    assert not p.refused and all(c.prediction is None for c in p.cells)
    assert any("no FLOP prediction: the predictor gave none; min_steps not checked" in n for n in p.notes)
    assert p.total_predicted_flops is None and p.est_wall_s > 0


def test_plan_notes_cells_it_cannot_predict():
    p = plan_grid(grid_spec_from_dict(grid(axes={"model": ["no-such-model"]})),
                  predictor=lambda cfg: (_ for _ in ()).throw(KeyError("no-such-model")))
    assert all(c.prediction is None for c in p.cells)
    assert any("no FLOP prediction for 2 cell(s)" in n for n in p.notes)


def test_fake_cell_fn_path_is_absolute():
    assert FAKE_CELL_FN.split(":")[0].startswith("/")


def test_plan_wall_time_is_calibrated_on_the_study_finished_runs(tmp_path):
    from race.grid import Store
    from race.grid.cell import collect_run_dir
    from race.grid.plan import default_seconds

    from .fake_engine import run_engine

    spec = grid_spec_from_dict(grid())
    cells = expand_grid(spec)
    with Store(tmp_path) as store:
        store.register_study(spec.study, spec.model_dump_json())
        store.add_cells(spec.study, cells)
        run_engine(cells[0].config, tmp_path / "r0")
        result = collect_run_dir(tmp_path / "r0")
        run = result["run"]
        guess = default_seconds(run["steps"], run["total_flops"])
        result["run"] = {**run, "wall_s": 7 * guess}  # this study runs 7x slower than the default guess
        store.ingest(cells[0].run_id, result)
    plain = plan_grid(spec, predictor=_fake_predict)
    calibrated = plan_grid(spec, predictor=_fake_predict, study_dir=tmp_path)
    assert calibrated.time_scale == pytest.approx(7)
    assert calibrated.est_wall_s == pytest.approx(7 * plain.est_wall_s)
    assert any("calibrated on 1 finished run" in n for n in calibrated.notes)


def test_overrides_set_a_setting_per_axis_value():
    g = grid(axes={"model": ["tiny-xs", "tiny-s"], "num_generations": [4, 8]},
             overrides={"model": {"tiny-s": {"learning_rate": 3e-4, "lora": {"r": 8}}}})
    cells = expand_grid(grid_spec_from_dict(g))
    lrs = {(c.allocation["model"], c.allocation["num_generations"]): (c.config.learning_rate, c.config.lora.r)
           for c in cells}
    base_lr = grid_spec_from_dict(grid()).cells()[0].config.learning_rate
    assert lrs[("tiny-s", 4)] == lrs[("tiny-s", 8)] == (3e-4, 8)
    assert lrs[("tiny-xs", 4)] == (base_lr, 16) != (3e-4, 8)
    assert all(set(c.allocation) == {"model", "num_generations"} for c in cells)  # the key stays the axes


def test_overrides_that_cannot_apply_are_refused_with_what_to_change():
    axes = {"model": ["tiny-xs", "tiny-s"], "num_generations": [4, 8]}
    assert "not an axis" in _err(grid(axes=axes, overrides={"reward": {"rule": {"beta": 0.1}}}))
    assert "not a value of axis model" in _err(grid(axes=axes, overrides={"model": {"tiny-l": {"beta": 0.1}}}))
    assert "is an axis" in _err(grid(axes=axes, overrides={"model": {"tiny-s": {"num_generations": 2}}}))
    assert "unknown run setting 'learning_rat'" in _err(
        grid(axes=axes, overrides={"model": {"tiny-s": {"learning_rat": 1e-3}}}))
    both = grid(axes=axes, overrides={"model": {"tiny-s": {"beta": 0.1}}, "num_generations": {"8": {"beta": 0.2}}})
    assert "both set beta" in _err(both)


def test_exclude_leaves_axis_combinations_out_so_a_grid_can_be_a_path():
    axes = {"model": ["tiny-xs", "tiny-s", "tiny-m"], "num_generations": [4, 8]}
    full = {(c.allocation["model"], c.allocation["num_generations"], c.budget): c.run_id
            for c in expand_grid(grid_spec_from_dict(grid(axes=axes)))}
    # a list names any of its values; an entry must match on every axis it names
    cut = expand_grid(grid_spec_from_dict(grid(axes=axes, exclude=[
        {"model": ["tiny-xs", "tiny-s"], "num_generations": 8}, {"model": "tiny-m", "num_generations": 4}])))
    kept = {(c.allocation["model"], c.allocation["num_generations"], c.budget): c.run_id for c in cut}
    assert {k[:2] for k in kept} == {("tiny-xs", 4), ("tiny-s", 4), ("tiny-m", 8)}
    assert all(full[k] == rid for k, rid in kept.items())  # the cells left keep their ids
    assert len(cut) == 3 * 2 and [c.index for c in cut] == list(range(6))
    # a value that is itself a list (an axis of lists) matches as a whole
    lists = {"lora.target_modules": [["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj"]]}
    one = expand_grid(grid_spec_from_dict(grid(axes=lists, exclude=[{"lora.target_modules": ["q_proj", "v_proj"]}])))
    assert {tuple(c.allocation["lora.target_modules"]) for c in one} == {("q_proj", "k_proj", "v_proj", "o_proj")}


def test_exclude_entries_that_cannot_apply_are_refused_with_what_to_change():
    axes = {"model": ["tiny-xs", "tiny-s"], "num_generations": [4, 8]}
    assert "not an axis" in _err(grid(axes=axes, exclude=[{"reward": "rule"}]))
    assert "[16] not among the axis's values" in _err(grid(axes=axes, exclude=[{"num_generations": [4, 16]}]))
    assert "exclude[0] is empty" in _err(grid(axes=axes, exclude=[{}]))
    assert "leaves out every combination" in _err(grid(axes=axes, exclude=[{"model": ["tiny-xs", "tiny-s"]}]))


def test_report_settings_default_off_and_refuse_typos():
    assert grid_spec_from_dict(grid()).report.count_rm_training is False
    spec = grid_spec_from_dict(grid(report={"count_rm_training": True}))
    assert spec.report.count_rm_training is True
    assert '"count_rm_training":true' in spec.model_dump_json()  # what the store records for the report
    assert "report.count_rm_trainig" in _err(grid(report={"count_rm_trainig": True}))
    assert "report.count_rm_training" in _err(grid(report={"count_rm_training": "sometimes"}))


@pytest.mark.parametrize("name", ["grid-feedback.yaml", "grid-feedback-s.yaml"])
def test_the_feedback_study_configs_ask_the_issues_question(name):
    from pathlib import Path

    spec = load_grid_spec(Path(__file__).resolve().parents[2] / "configs" / name)
    rewards = spec.axes["reward"]
    learned = [r for r in rewards if r.startswith("prm:")]
    assert len(rewards) >= 3 and {r.split(":")[1] for r in learned} == {"prm-s", "prm-m"}  # two RM strengths
    assert "rule:outcome" in rewards and "rule:partial" in rewards
    assert len(spec.seeds) >= 2 and spec.eval["n_problems"] >= 500
    assert max(spec.budgets) / min(spec.budgets) >= 10


def test_list_schedule_is_greedy_in_order_and_within_grahams_bound():
    from race.grid.plan import list_schedule

    assert list_schedule([5.0, 3.0, 2.0, 2.0], 2) == 7.0  # 5 | 3, then 2 after the 3, then 2 after the 5 (a tie)
    assert list_schedule([1.0, 1.0, 1.0, 9.0], 2) == 10.0  # the long unit last: it runs alone
    assert list_schedule([9.0, 1.0, 1.0, 1.0], 2) == 9.0  # longest first: the others fill the other worker
    assert list_schedule([], 3) == 0.0 and list_schedule([4.0], 0) == 4.0


def test_plan_prices_gangs_as_units_of_work(tmp_path):
    """gang: true: the plan schedules gangs (their members' summed seconds) on the workers
    and says how the cells were grouped."""
    from race.grid.plan import list_schedule

    g = grid(gang=True, gang_size=3, cell_fn=DEFAULT_CELL_FN, min_steps=0,
             axes={"num_generations": [4, 8]}, seeds=[0, 1], budgets=[2e9, 2e10])
    g["base"] = {**g["base"], "model": "tiny-s", "lora": {"r": 4}}
    solo = plan_grid(grid_spec_from_dict({**g, "gang": False}), predictor=_fake_predict)
    gang = plan_grid(grid_spec_from_dict(g), predictor=_fake_predict)
    secs = {c.cell.run_id: c.prediction["est_seconds"] for c in gang.runnable}
    cells = [c.cell for c in gang.runnable]
    units = [sum(secs[c.run_id] for c in cells[i:i + 3]) for i in range(0, 8, 3)]
    assert len(gang.runnable) == 8 and len(units) == 3  # one base: gangs of 3, 3 and 2 in grid order
    assert gang.est_wall_s == pytest.approx(list_schedule(sorted(units, reverse=True), 2))
    assert solo.est_wall_s == pytest.approx(list_schedule(sorted(secs.values(), reverse=True), 2))
    assert any("gang: 3 gang(s) of 2-3 members and 0 cell(s) alone" in n for n in gang.notes)


def test_the_p_bracketing_configs_are_paths_through_p():
    """configs/grid-pshare.yaml: 7 (m, num_iterations) settings per reward system (a rule and a PRM),
    3 seeds, one nested run per cell; the target file: 2 settings per reward system, the pilots' seeds."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "configs"
    pilots, target = load_grid_spec(root / "grid-pshare.yaml"), load_grid_spec(root / "grid-pshare-target.yaml")
    per = {}
    for c in pilots.cells():
        per.setdefault(c.allocation["reward"], set()).add((c.config.num_update_generations, c.config.num_iterations))
    assert set(per) == {"rule:partial", "prm:prm-xs:min+partial"} and len(pilots.seeds) == 3
    assert all(v == {(2, 1), (3, 1), (4, 1), (8, 1), (12, 1), (12, 2), (12, 4)} for v in per.values())
    assert len(pilots.cells()) == 42 and {c.budget for c in pilots.cells()} == {8e11}
    chosen = {(c.allocation["reward"], c.config.num_update_generations) for c in target.cells()}
    assert chosen == {("rule:partial", 3), ("rule:partial", 8), ("prm:prm-xs:min+partial", 4),
                      ("prm:prm-xs:min+partial", 8)}
    assert target.seeds == pilots.seeds and {c.budget for c in target.cells()} == {3.2e12}
    # the study carried below p 0.33: the same 14 allocations with seeds 0-4, and m = 2 of n = 24 and 48
    low = load_grid_spec(root / "grid-pshare-low.yaml")
    per_low = {}
    for c in low.cells():
        per_low.setdefault(c.allocation["reward"], set()).add(
            (c.config.num_generations, c.config.num_update_generations, c.config.num_iterations))
    old = {(12, m, it) for m, it in {(2, 1), (3, 1), (4, 1), (8, 1), (12, 1), (12, 2), (12, 4)}}
    assert all(v == old | {(24, 2, 1), (48, 2, 1)} for v in per_low.values()) and set(per_low) == set(per)
    assert low.seeds == [0, 1, 2, 3, 4] and len(low.cells()) == 90 and low.study == pilots.study
    same = {c.run_id for c in pilots.cells()} <= {c.run_id for c in low.cells()}
    assert same  # its cells at n = 12 are grid-pshare.yaml's runs: one study holds both
    # SmolLM2: five points, 3 seeds, nested at 3e12 / 1e13, a rule reward
    sm = load_grid_spec(root / "grid-pshare-smollm2.yaml")
    pts = {(c.config.num_generations, c.config.num_update_generations, c.config.num_iterations) for c in sm.cells()}
    assert pts == {(64, 2, 1), (32, 2, 1), (16, 2, 1), (16, 16, 1), (16, 16, 2)} and sm.seeds == [0, 1, 2]
    assert len(sm.cells()) == 15 and {c.budget for c in sm.cells()} == {1e13} and sm.budgets == [3e12, 1e13]
