"""Wrong inputs end in one line that names what to change, exit code 2, no traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from race.cli.app import app

BAD_YAML = "model: [tiny-s\n  x: :\n"


@pytest.fixture
def run():
    runner = CliRunner(env={"COLUMNS": "200"})

    def invoke(*args: str):
        res = runner.invoke(app, [str(a) for a in args])
        return res.exit_code, res.output.strip()
    return invoke


def _one_line_error(code: int, out: str, *needles: str) -> None:
    assert code == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert out.startswith("error: "), out
    for n in needles:
        assert n in out, (n, out)


@pytest.mark.parametrize("args, needles", [
    (["--budget", "-5"], ["--budget", "budget must be > 0"]),
    (["--lora-rank", "0"], ["--lora-rank must be >= 1"]),
    (["--lora-rank", "-8"], ["--lora-rank must be >= 1"]),
    (["--prompts", "0"], ["--prompts must be >= 1"]),
    (["--prompt-len", "200000"], ["--prompt-len must be <= 131072"]),
    (["--group", "1"], ["--group must be >= 2"]),
    (["--reward", "bogus"], ["reward", "kind must be"]),
    (["--model", "/nonexistent/config.json"], ["/nonexistent/config.json", "file not found"]),
])
def test_flops_refuses_bad_flags(run, args, needles):
    model = [] if "--model" in args else ["--model", "tiny-s"]
    _one_line_error(*run("flops", *model, *args), *needles)


def test_flops_and_train_refuse_bad_yaml(run, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_YAML)
    _one_line_error(*run("flops", "-c", bad), str(bad), "not valid YAML")
    _one_line_error(*run("train", bad), str(bad), "not valid YAML")


def test_flops_reads_a_run_file_with_trls_names(run, tmp_path):
    f = tmp_path / "q.yaml"
    f.write_text("model: tiny-s\nnum_generations: 4\nmax_prompt_length: 32\nlora: {r: 8}\n")
    code, out = run("flops", "-c", f, "--json")
    assert code == 0, out
    import json

    rep = json.loads(out)
    assert rep["num_generations"] == 4 and rep["prompt_len"] == 32 and rep["lora_rank"] == 8


@pytest.mark.parametrize("args, needles", [
    (["--groups", "a,8"], ["--groups", "whole numbers"]),
    (["--groups", "1,8"], ["--groups", ">= 2"]),
    (["--budget", "-5"], ["--budget", "budget must be > 0"]),
    (["--lora-rank", "0"], ["--lora-rank", ">= 1"]),
    (["--lora-rank", "-8"], ["--lora-rank", ">= 1"]),
    (["--prompts", "0"], ["--prompts", ">= 1"]),
    (["--prompt-len", "200000"], ["--prompt-len", "<= 131072"]),
    (["--models", "/nonexistent/config.json"], ["file not found"]),
    (["--iterations", "0"], ["--iterations", ">= 1"]),
    (["--beta", "-0.1"], ["--beta", ">= 0"]),
    (["--hold", "tokens"], ["--hold", "sequences or prompts"]),
    (["--budget", "1e6"], ["no allocation affords one step", "the cheapest step costs"]),
])
def test_plan_refuses_bad_flags(run, args, needles):
    budget = [] if "--budget" in args else ["--budget", "1e18"]
    _one_line_error(*run("plan", *budget, *args), *needles)


def test_train_refuses_a_bad_budget_before_loading_anything(run, tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("model: tiny-s\nbudget_flops: 1.0e+12\n")
    _one_line_error(*run("train", f, "--budget", "-5"), "--budget", "budget must be > 0")
    _one_line_error(*run("train", f, "--budget", "inf"), "--budget", "budget must be > 0")


def test_flops_reads_a_whole_run_file_as_that_runs_step(run):
    """One vocabulary: ``race flops -c`` takes a run file (TRL's names) as it is."""
    import json
    from pathlib import Path

    run_file = Path(__file__).resolve().parents[2] / "configs" / "tiny-rule.yaml"
    code, out = run("flops", "-c", run_file, "--json")
    assert code == 0, out
    rep = json.loads(out)
    assert (rep["model"], rep["lora_rank"], rep["num_generations"], rep["completion_len"]) == ("tiny-s", 16, 8, 48)
    assert rep["budget"] == 2.0e11 and rep["steps"] >= 1
    code, out = run("flops", "-c", run_file, "--steps", "10", "--group", "4", "--json")
    assert code == 0 and json.loads(out)["steps"] == 10 and json.loads(out)["num_generations"] == 4


def test_a_wrong_type_in_a_flops_file_is_one_line(run, tmp_path):
    f = tmp_path / "q.yaml"
    f.write_text('model: tiny-s\ngroup: "sixteen"\n')
    _one_line_error(*run("flops", "-c", f), "group", "valid integer")
