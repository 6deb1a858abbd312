"""Wrong settings are named with the closest valid name, a file given to the wrong command is
named as the other kind, and an override's error blames the flag (issue 49)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from race.cli.app import app
from race.spec.errors import ConfigError, GridSpecError
from race.spec.grid import file_kind, grid_spec_from_dict, load_grid_spec
from race.spec.run import load_run_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RUN_FILE = CONFIGS / "tiny-rule.yaml"
GRID_FILE = CONFIGS / "grid-demo.yaml"


def _cli(*args):
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, [str(a) for a in args])
    return res.exit_code, res.output


def test_set_lora_rank_points_to_peft_r_and_blames_the_flag():
    with pytest.raises(ConfigError) as e:
        load_run_config(RUN_FILE, ["lora.rank=8"])
    msg = str(e.value)
    assert msg.startswith("invalid --set override:") and str(RUN_FILE) not in msg  # the flag, not the file
    assert "--set lora.rank=8: lora.rank: unknown field (did you mean 'lora.r'?)" in msg
    code, out = _cli("train", RUN_FILE, "--set", "lora.rank=8")
    assert code == 2 and "did you mean 'lora.r'?" in out and "--set lora.rank=8" in out


def test_a_file_typo_blames_the_file_and_a_bad_flag_value_the_flag(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text(RUN_FILE.read_text().replace("learning_rate:", "learning_rat:"))
    with pytest.raises(ConfigError) as e:
        load_run_config(f, ["lora.r=0"])
    msg = str(e.value)
    assert msg.startswith(f"invalid run config ({f}):")  # one error is the file's
    assert "  - learning_rat: unknown field (did you mean 'learning_rate'?)" in msg
    assert "  - --set lora.r=0: lora.r must be >= 1" in msg


def test_a_grid_file_given_to_race_train_is_named_as_one():
    from race.spec.files import load_run_file

    with pytest.raises(ConfigError, match="this is a grid file"):
        load_run_file(GRID_FILE)
    assert load_run_file(RUN_FILE, ["lora.r=8"]).lora.r == 8
    code, out = _cli("train", GRID_FILE)
    text = " ".join(out.split())
    assert code == 2 and "this is a grid file" in text and f"race grid run {GRID_FILE}" in text
    assert "unknown field" not in text and len(out.strip().splitlines()) <= 3


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_run_file_given_to_race_grid_is_named_as_one(command):
    code, out = _cli("grid", command, RUN_FILE)
    text = " ".join(out.split())
    assert code == 2 and "this is a run file" in text and f"use `race train {RUN_FILE}`" in text.replace(
        "train it with", "use")
    assert "unknown" not in text


def test_file_kind_reads_the_top_level_keys_only():
    assert file_kind({"study": "s", "budgets": [1], "axes": {}}) == "grid"
    assert file_kind({"model": "tiny-s", "budget_flops": 1e9}) == "run"
    assert file_kind({"study": "s", "model": "tiny-s"}) is None  # both: the validation names the stray key
    assert file_kind({"engine": "trl", "eval": {}}) is None and file_kind([1]) is None
    with pytest.raises(GridSpecError, match="go under base: or axes:"):
        grid_spec_from_dict({"study": "s", "budgets": [1e9, 1e10], "model": "tiny-s"})


@pytest.mark.parametrize("grid, needle", [
    ({"runner": {"wrokers": 2}}, "runner.wrokers: unknown setting (did you mean 'runner.workers'?)"),
    ({"budgtes": [1e9, 1e10]}, "budgtes: unknown grid setting (did you mean 'budgets'?)"),
    ({"axes": {"lora.rank": [8, 16]}}, "axes.lora.rank: unknown run setting 'rank' in lora (did you mean 'r'?)"),
    ({"base": {"lr": 1e-4}}, "base.lr: unknown run setting 'lr' (did you mean 'learning_rate'?)"),
    ({"base": {"lora": {"lora_aplha": 8}}}, "lora.lora_aplha: unknown field (did you mean 'lora.lora_alpha'?)"),
])
def test_grid_settings_get_the_closest_valid_name(tmp_path, grid, needle):
    data = {"study": "s", "budgets": [1e9, 1e10], "axes": {"model": ["tiny-s"]}, **grid}
    if "budgtes" in grid:
        data.pop("budgets")
    with pytest.raises(GridSpecError) as e:
        grid_spec_from_dict(data)
    assert needle in str(e.value)


def test_flops_settings_and_a_grid_file_given_to_race_flops():
    code, out = _cli("flops", "-c", GRID_FILE, "--model", "tiny-s")
    assert code == 2 and "this is a grid file" in out and "race grid plan" in " ".join(out.split())
    assert load_grid_spec(GRID_FILE).study  # the packaged grid itself is fine
