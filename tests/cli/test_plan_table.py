"""``race plan`` explains itself: prompts and sequences per step, which one is held fixed
across group sizes, ``--beta``/``--iterations`` like ``race flops``, and a note naming the
(model, group, reward) rows that cannot afford one step."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from race.cli.app import app

ARGS = ["plan", "--models", "qwen2.5-0.5b", "--groups", "4,8,16", "--rewards", "rule", "--prompts", "8",
        "--prompt-len", "64", "--completion-len", "64"]


def _plan(*extra: str) -> tuple[int, str]:
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*ARGS, *extra])
    return res.exit_code, res.output


def _rows(*extra: str) -> list[dict]:
    code, out = _plan("--json", *extra)
    assert code == 0, out
    return json.loads(out)


def test_sequences_held_fixed_by_default_prompts_shrink_with_g():
    rows = {r["num_generations"]: r for r in _rows("--budget", "1e18")}
    assert {g: (r["prompts"], r["sequences"]) for g, r in rows.items()} == {4: (32, 128), 8: (16, 128), 16: (8, 128)}
    code, out = _plan("--budget", "1e18")
    assert code == 0, out
    assert "prompts" in out and "seqs" in out and "sequences per step held at 128" in out


def test_hold_prompts_makes_a_larger_group_dearer():
    rows = {r["num_generations"]: r for r in _rows("--budget", "1e18", "--hold", "prompts")}
    assert {g: r["prompts"] for g, r in rows.items()} == {4: 8, 8: 8, 16: 8}
    assert rows[4]["step_flops"] < rows[8]["step_flops"] < rows[16]["step_flops"]
    assert rows[4]["steps"] > rows[16]["steps"]
    assert "prompts per step held at 8" in _plan("--budget", "1e18", "--hold", "prompts")[1]


def test_beta_and_iterations_change_the_step():
    base = _rows("--budget", "1e18")[0]["step_flops"]
    kl = _rows("--budget", "1e18", "--beta", "0.04")[0]["step_flops"]
    two = _rows("--budget", "1e18", "--iterations", "2")[0]["step_flops"]
    assert kl > base and two > base


def test_rows_that_cannot_afford_one_step_are_named_with_why():
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["plan", "--budget", "5e15", "--rewards", "rule"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("not affordable")]
    assert any("qwen2.5-7b G=4,8,16 with rule" in ln and "one step costs" in ln and "more than the budget" in ln
               for ln in lines), res.output
    assert not any("qwen2.5-0.5b" in ln for ln in lines)


def test_iterations_and_steps_per_generation_are_rows_that_move_the_learning_share():
    """``--iterations 1,2 --steps-per-generation 1,4``: one row per combination; the update
    share rises with steps per generation (the old-policy pass runs) and with iterations
    (that pass and one more update); at 2 iterations the old-policy pass runs already, so
    steps per generation cost nothing more; the optimizer steps are steps x iterations x spg."""
    from race.accounting import ModelShape, StepPlan

    rows = _rows("--budget", "1e18", "--groups", "8", "--iterations", "1,2", "--steps-per-generation", "1,4")
    by = {(r["num_iterations"], r["steps_per_generation"]): r for r in rows}
    assert set(by) == {(1, 1), (1, 4), (2, 1), (2, 4)}
    assert by[(1, 1)]["learning"] < by[(1, 4)]["learning"] < by[(2, 1)]["learning"] == by[(2, 4)]["learning"]
    assert by[(2, 1)]["step_flops"] == by[(2, 4)]["step_flops"]
    assert all(r["optimizer_steps"] == r["steps"] * r["num_iterations"] * r["steps_per_generation"] for r in rows)
    # spg 4 costs exactly the old-policy forward more than spg 1 (the update is the same FLOPs)
    shape = ModelShape.from_preset("qwen2.5-0.5b")
    one = StepPlan(shape, 8, optimizer_steps=1).uniform(8, 64, 64)
    four = StepPlan(shape, 8, optimizer_steps=4).uniform(8, 64, 64)
    assert four.update == one.update > 0 and one.old_logprobs == 0
    assert four.old_logprobs == four.components["update/forward"]  # one no-grad forward over the same rows
    assert four.total == one.total + four.old_logprobs
    code, out = _plan("--budget", "1e18", "--steps-per-generation", "0")
    assert code != 0 and "--steps-per-generation 0" in out
